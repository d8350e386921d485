"""Training through `train()` makes the tiny model better at a multi-turn task."""

from __future__ import annotations

import json

import pytest

from aitrain_grpo import RunConfig, train


@pytest.mark.slow
def test_multi_turn_letter_score_rises_within_60_steps(tiny_model_dir, tmp_path):
    config = RunConfig(
        model=tiny_model_dir, output_dir=str(tmp_path), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        rl_env_config={"letter": "a", "turns": 3}, max_steps=60, batch_size=8, rl_max_new_tokens=16,
        lr=1e-2, rl_kl_coef=0.0, seed=0,
    )
    summary = train(config)
    assert summary["global_step"] == 60
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 61))
    scores = [r["env/score_mean"] for r in records]
    first, last = sum(scores[:10]) / 10, sum(scores[-10:]) / 10
    assert last - first >= 0.3, f"mean score went from {first:.3f} to {last:.3f}"
    assert records[0]["env/turns_mean"] > 1.0  # episodes really were multi-turn
    assert (tmp_path / "adapter_config.json").exists()  # LoRA is the default
