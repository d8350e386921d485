"""Training in two processes under `accelerate launch`, and under plain torchrun (gloo on this CPU
machine): each process plays its share of the episodes, and the logged metrics count the episodes of both."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, accelerate_launch, free_port


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
    # LoRA leaves no parameter unused: DDP is not asked to search, and says nothing (issue 35, item 9)
    assert "find_unused_parameters" not in result.stdout + result.stderr


@pytest.mark.slow
def test_torchrun_without_accelerate_trains_two_machines(tiny_model_dir, tmp_path):
    """docs/scale-out.md's torchrun recipe: no accelerate config, two torchrun "machines" (node ranks 0
    and 1 on 127.0.0.1, one process each); accelerate reads torchrun's environment."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    ranks = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank),
                          "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                          "-m", "aitrain_grpo", "grpo", "--model", tiny_model_dir, "--rl-env-module", "envs.letters",
                          "--rl-env-class", "LetterEnv", "--max-steps", "2", "--batch-size", "4",
                          "--rl-max-new-tokens", "16", "--output-dir", str(tmp_path)],
                         cwd=str(REPO), env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=600)[0] for process in ranks]
    assert [process.returncode for process in ranks] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["env/episodes"]) for r in records] == [(1, 8), (2, 8)]  # 4 per machine
