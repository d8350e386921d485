"""Several optimizer updates on each generation batch (`--rl-num-iterations`, TRL's num_iterations): the
only setting where the policy that trains differs from the one that played, so where the clip ranges and
`--rl-importance-sampling` act. What a user sees: one metrics record a batch, clipping above 0 from the
second update on, and the clip and importance-sampling options changing the loss only then."""

from __future__ import annotations

import json

import pytest

from aitrain_grpo.config import RunConfig
from aitrain_grpo.training.trainer import train
from envs.letters import LetterEnv

# A large learning rate so that one update moves the tiny policy far enough for the ratio to clip.
FAST = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv", max_steps=4, lr=3e-2, seed=1, rl_max_new_tokens=8)


def records(tmp_path, name, **options):
    out = tmp_path / name
    train(RunConfig(**FAST, output_dir=str(out), **options), env=LetterEnv(turns=1, num_tasks=16))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("iterations")
    return {name: records(tmp, name, **options) for name, options in {
        "once": {},
        "twice": dict(rl_num_iterations=2),
        "twice_sequence": dict(rl_num_iterations=2, rl_importance_sampling="sequence"),
        "twice_high": dict(rl_num_iterations=2, rl_clip_range_high=0.5),
    }.items()}


def test_each_batch_is_logged_once_with_its_updates(runs):
    assert [r["step"] for r in runs["once"]] == [1, 2, 3, 4]
    assert [r["step"] for r in runs["twice"]] == [2, 4]  # 2 batches of 8 episodes, 2 updates each
    assert all(r["env/episodes"] == 8 for r in runs["twice"])


def test_the_clip_acts_only_from_a_batchs_second_update(runs):
    assert all(r["clip_ratio/region_mean"] == 0 for r in runs["once"])  # the policy that trains is the one that played
    assert any(r["clip_ratio/region_mean"] > 0 for r in runs["twice"])


def test_sequence_level_ratios_and_a_higher_clip_change_the_loss_of_later_updates(runs):
    first = runs["twice"][0]
    assert runs["twice_sequence"][0]["loss"] != pytest.approx(first["loss"], rel=1e-3)
    assert runs["twice_high"][0]["loss"] != pytest.approx(first["loss"], rel=1e-3)
    assert runs["twice_high"][0]["reward"] == first["reward"]  # the same episodes: only the update differs


def test_a_resume_between_a_batchs_updates_keeps_the_later_batches_where_they_were(tmp_path):
    """Resumed after the first of a batch's two updates, the run plays that batch's prompts again for the
    second, and the next batch starts at step 3, as it did in the run that was not stopped."""
    out = tmp_path / "run"

    def rollout_steps():
        return [json.loads(line)["step"] for line in (out / "scores.jsonl").read_text().splitlines()]

    options = dict(**FAST, output_dir=str(out), rl_num_iterations=2, save_steps=1)
    train(RunConfig(**options), env=LetterEnv(turns=1, num_tasks=16))
    assert rollout_steps() == [1, 3]
    train(RunConfig(**options, resume_from_checkpoint=str(out / "checkpoint-1")), env=LetterEnv(turns=1, num_tasks=16))
    assert rollout_steps() == [1, 2, 3]
