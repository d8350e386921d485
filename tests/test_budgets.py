"""Episode budgets, end to end through training: `--rl-max-turns` lowers a 3-turn environment to one
turn (and says `max_turns` stopped it), and a small `--rl-max-completion-length` cuts episodes off
(`completion_budget`), never letting one grow past the budget.

A turn that fills `--rl-max-new-tokens` ends its episode as `turn_tokens` first, so the max-turns run
gives the model room (32 tokens: most turns end by themselves) and the assertions allow those cuts.
"""

from __future__ import annotations

import json

import pytest

from aitrain_grpo import RunConfig
from envs.letters import LetterEnv


def two_steps(model: str, output_dir, **options):
    """Build and train two steps on envs.letters with 3 turns; returns the trainer and the logs."""
    from aitrain_grpo.training.trainer import build_trainer

    config = RunConfig(model=model, rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(output_dir),
                       max_steps=2, log_episodes_every=1, log_episodes_count=8, **options)
    trainer = build_trainer(config, env=LetterEnv(turns=3, num_tasks=8))
    trainer.train()
    metrics = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (output_dir / "episodes.jsonl").read_text().splitlines()]
    return trainer, metrics, episodes


def test_max_turns_1_on_a_3_turn_environment_plays_one_turn_and_says_why(tiny_model_dir, tmp_path):
    _, metrics, episodes = two_steps(tiny_model_dir, tmp_path / "run", rl_max_turns=1, rl_max_new_tokens=32)
    assert [m["env/turns_mean"] for m in metrics] == [1.0, 1.0]
    for m in metrics:
        assert m["env/stop/max_turns"] + m["env/stop/turn_tokens"] == pytest.approx(1.0)
        assert m["env/stop/max_turns"] >= 0.5, m  # measured: 0.875 on both steps
    assert len(episodes) == 16 and all(e["turns"] == 1 and e["truncated"] for e in episodes)
    assert {e["stop_reason"] for e in episodes} <= {"max_turns", "turn_tokens"}


def test_a_small_completion_budget_truncates_episodes_and_holds(tiny_model_dir, tmp_path):
    trainer, metrics, episodes = two_steps(tiny_model_dir, tmp_path / "run", rl_max_new_tokens=16,
                                           rl_max_completion_length=24)
    for m in metrics:
        assert m["env/truncated_frac"] == 1.0  # three turns and two replies never fit in 24 tokens
        assert m["env/stop/completion_budget"] >= 0.5, m  # measured: 0.75 and 0.875; the rest turn_tokens
    assert all(e["turns"] < 3 for e in episodes)
    assert {e["stop_reason"] for e in episodes} <= {"completion_budget", "turn_tokens"}
    traces = trainer.rollout.last_batch.traces
    assert traces and all(len(t.completion_ids) <= 24 for t in traces)
