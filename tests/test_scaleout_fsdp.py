"""Sharded training engines under `accelerate launch` on this CPU machine (two processes, gloo).

FSDP: accelerate 1.15 attaches its FSDP plugin only to GPU-type devices, so on a CPU an FSDP launch
would train as plain DDP and shard nothing; `aitrain grpo` refuses it in one line naming the launches
that do run (docs/scale-out.md, "Several processes and machines"). DeepSpeed ZeRO-2/3 runs on a CPU
over gloo once `pip install deepspeed` is done (skipped where it is not installed): both processes
train, the saved weights are whole, load, and equal DeepSpeed's own gather of both ranks' shards, and a
resumed run goes on from its checkpoint's step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO, in_process_cli, retry_on_port_clash

BATCH = 4  # episodes per process and step


def grpo(model: str, *args: str) -> tuple[str, ...]:
    return ("grpo", "--model", model, "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
            "--batch-size", str(BATCH), "--rl-max-new-tokens", "8", "--save-steps", "1", *args)


def launch(config: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`accelerate launch` of `aitrain` with one of examples/accelerate/'s configurations, sized for this
    machine (two processes, no mixed precision), on a port of its own."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def start(port: int) -> subprocess.CompletedProcess:
        command = [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "examples/accelerate" / config),
            "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(port),
            "-m", "aitrain_grpo", *args,
        ]
        return subprocess.run(command, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=timeout)

    return retry_on_port_clash(start)


def steps_logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_an_fsdp_launch_without_cuda_is_refused_before_anything_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with an FSDP config sets
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cli = in_process_cli(monkeypatch, REPO)
    result = cli(*grpo("tiny", "--max-steps", "1", "--output-dir", tmp_path / "run"))
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert "FSDP needs CUDA" in line and "examples/accelerate/cpu2.yaml" in line
    assert not (tmp_path / "run" / "run_config.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="FSDP is refused only where there is no CUDA")
def test_fsdp_on_a_cpu_machine_is_refused_in_one_line(tiny_model_dir, tmp_path):
    result = launch("fsdp.yaml", *grpo(tiny_model_dir, "--max-steps", "1", "--output-dir", str(tmp_path / "run")),
                    timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors and len(set(errors)) == 1, result.stderr[-3000:]  # the same line from each process
    assert "FSDP needs CUDA" in errors[0] and "examples/accelerate/cpu2.yaml" in errors[0]
    assert "exitcode  : 2" in result.stderr  # torch's launcher reports our exit status
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before anything trained


@pytest.mark.slow
@pytest.mark.parametrize("config, peft", [("zero2.yaml", "--peft"), ("zero3.yaml", "--no-peft")])
def test_deepspeed_trains_saves_and_resumes_in_two_cpu_processes(config, peft, tiny_model_dir, tmp_path):
    pytest.importorskip("deepspeed")
    from safetensors.torch import load_file
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    run_dir = tmp_path / "run"
    first = launch(config, *grpo(tiny_model_dir, peft, "--max-steps", "2", "--output-dir", str(run_dir)))
    assert first.returncode == 0, first.stdout[-1500:] + first.stderr[-3000:]
    assert first.stdout.count("done: 2 steps") == 1
    assert all(r["env/episodes"] == 2 * BATCH for r in steps_logged(run_dir))  # both processes played

    resumed = launch(config, *grpo(tiny_model_dir, peft, "--max-steps", "3", "--resume-from-checkpoint", "auto",
                                   "--output-dir", str(run_dir)))
    assert resumed.returncode == 0, resumed.stdout[-1500:] + resumed.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoint-2'} (step 2)" in resumed.stdout
    assert [r["step"] for r in steps_logged(run_dir)] == [1, 2, 3]
    assert json.loads((run_dir / "run_summary.json").read_text())["global_step"] == 3

    # The weights written at the end are whole (ZeRO-3 shards them across the ranks), the same as the
    # step-3 checkpoint's, and the same as DeepSpeed's own reconstruction from both ranks' shards.
    name = "adapter_model.safetensors" if peft == "--peft" else "model.safetensors"
    saved, checkpoint = load_file(str(run_dir / name)), load_file(str(run_dir / "checkpoint-3" / name))
    assert saved.keys() == checkpoint.keys() and all(torch.equal(v, checkpoint[k]) for k, v in saved.items())
    gathered = {k.replace(".default", ""): v for k, v in
                get_fp32_state_dict_from_zero_checkpoint(str(run_dir / "checkpoint-3")).items()}
    assert set(saved) <= set(gathered) and all(torch.equal(v, gathered[k]) for k, v in saved.items())

    from aitrain_grpo.models.loading import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(run_dir))  # as `--model <run folder>`, eval and export read it
    state = model.state_dict()
    base = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    assert any(not torch.equal(state[k], v) for k, v in base.items() if k in state)  # trained, not the base
    if peft == "--no-peft":
        assert all(torch.equal(state[k], v) for k, v in saved.items())
