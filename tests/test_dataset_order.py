"""The order a run plays its dataset's prompts in (`--no-shuffle-dataset`, TRL's shuffle_dataset). What a user
sees: by default each epoch's prompts come in a random order drawn from --seed; with --no-shuffle-dataset in
the order build_dataset returned them, every epoch (a curriculum written into the dataset plays as written),
and a resume that would change the order midway is refused."""

from __future__ import annotations

import json

import pytest

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.training.run.checkpoints import resume_checkpoint
from aitrain_grpo.training.trainer import train
from envs.letters import LetterEnv

# 6 tasks, 2 prompts a step (groups of 4 in a batch of 8): an epoch is 3 steps; every episode logged.
FAST = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv", max_steps=4, seed=1, rl_max_new_tokens=4,
            use_vllm=False, log_episodes_every=1, log_episodes_count=8, save_steps=2)


def tasks_by_step(out, **options) -> list[list[int]]:
    train(RunConfig(**FAST, output_dir=str(out), **options), env=LetterEnv(turns=1, num_tasks=6))
    played: dict[int, list[int]] = {}
    for episode in map(json.loads, (out / "episodes.jsonl").read_text().splitlines()):
        played.setdefault(episode["step"], []).append(episode["row"]["task"])
    return [sorted(set(played[step])) for step in sorted(played)]


def test_without_shuffling_the_prompts_come_in_the_datasets_order_every_epoch(tmp_path):
    assert tasks_by_step(tmp_path / "ordered", shuffle_dataset=False) == [[0, 1], [2, 3], [4, 5], [0, 1]]


def test_by_default_each_epoch_is_a_random_order_of_every_prompt(tmp_path):
    steps = tasks_by_step(tmp_path / "shuffled")
    first_epoch = [task for step in steps[:3] for task in step]
    assert sorted(first_epoch) == [0, 1, 2, 3, 4, 5]  # each prompt once an epoch
    assert steps[:3] != [[0, 1], [2, 3], [4, 5]]


def test_a_resume_that_would_change_the_order_is_refused(tmp_path):
    out = tmp_path / "ordered"
    tasks_by_step(out, shuffle_dataset=False)
    with pytest.raises(ConfigError, match="was trained with --shuffle-dataset False"):
        resume_checkpoint(RunConfig(**FAST, output_dir=str(out), resume_from_checkpoint="auto"))
