"""Training in two processes under `accelerate launch` (gloo on this CPU machine): each process plays
its share of the episodes, and the logged metrics count the episodes of both."""

from __future__ import annotations

import json

import pytest

from helpers import accelerate_launch


@pytest.mark.slow
def test_two_processes_count_the_episodes_of_both(tiny_model_dir, tmp_path):
    result = accelerate_launch(
        "grpo", "--model", tiny_model_dir, "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
        "--max-steps", "3", "--batch-size", "8", "--rl-max-new-tokens", "16", "--output-dir", str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]  # written once, by the main process
    assert all(r["env/episodes"] == 16 for r in records)  # 8 per process, 2 processes
    assert result.stdout.count("done: 3 steps") == 1
    assert (tmp_path / "adapter_model.safetensors").exists()
