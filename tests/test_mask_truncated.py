"""`--rl-mask-truncated` (DAPO's overlong filtering): episodes a budget or the turn cap cut leave the loss,
their scores still count in their groups. What a user sees: the share taken out in metrics.jsonl, and
nothing trained when every episode was cut."""

from __future__ import annotations

import json

from aitrain_grpo.config import RunConfig
from aitrain_grpo.training.trainer import train
from envs.letters import LetterEnv

LETTERS = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv", max_steps=2, lr=1e-3, seed=1,
               rl_cut_turn="end")


def records(tmp_path, name, **options):
    out = tmp_path / name
    train(RunConfig(**LETTERS, output_dir=str(out), **options), env=LetterEnv(turns=2, num_tasks=16, pay_cut_turns=True))  # cut turns scored: groups differ
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_truncated_episodes_leave_the_loss_and_the_share_is_logged(tmp_path):
    every_turn_cut = dict(rl_max_new_tokens=2)  # 2 tokens never finish a turn: every episode ends cut
    masked = records(tmp_path, "masked", rl_mask_truncated=True, **every_turn_cut)
    trained = records(tmp_path, "trained", **every_turn_cut)
    assert [r["groups/masked_truncated_frac"] for r in masked] == [1.0, 1.0]
    assert all(r["grad_norm"] == 0 for r in masked)  # nothing left to train on
    assert any(r["grad_norm"] > 0 for r in trained) and "groups/masked_truncated_frac" not in trained[0]
    assert masked[0]["reward"] == trained[0]["reward"]  # step 1: the same episodes, scored alike


def test_only_the_truncated_share_leaves(tmp_path):
    some_cut = records(tmp_path, "some", rl_mask_truncated=True, rl_max_new_tokens=8)
    assert all(r["groups/masked_truncated_frac"] == r["env/truncated_frac"] for r in some_cut)
    assert any(r["grad_norm"] > 0 for r in some_cut)
