"""Training in two processes under `accelerate launch` (gloo on this CPU machine): each process plays
its share of the episodes, and the logged metrics count the episodes of both."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, retry_on_port_clash


def accelerate_launch(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`accelerate launch` with cpu2.yaml on a port of its own (the yaml names none, so that two runs on
    one machine do not both take torch's default 29500), again on another port if it was taken."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def launch(port: int) -> subprocess.CompletedProcess:
        command = [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "examples/accelerate/cpu2.yaml"),
            "--main_process_port", str(port), "-m", "aitrain_grpo", *args,
        ]
        return subprocess.run(command, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=timeout)

    return retry_on_port_clash(launch)


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
