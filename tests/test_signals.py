"""Ctrl-C and `kill` during training: the step in progress finishes, a checkpoint is saved, the run
says how to resume and exits 130 (SIGINT) or 143 (SIGTERM); the printed command resumes it. A second
signal stops at once."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO

from aitrain_grpo.training.checkpoints import is_complete

FAULTS_DIR = REPO / "tests" / "faults"


def slow_run(delay: float, max_steps: int) -> list[str]:
    return [
        "--rl-env-module", "fault_envs", "--rl-env-class", "SlowLetters",
        "--rl-env-config", json.dumps({"delay": delay, "turns": 1, "num_tasks": 16}),
        "--batch-size", "8", "--rl-max-new-tokens", "16", "--max-steps", str(max_steps),
    ]


def start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "aitrain_grpo", *args], cwd=FAULTS_DIR, stdout=log.open("w"),
        stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"),
    )


def wait_for(condition, process: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def steps_logged(output_dir: Path) -> list[int]:
    path = output_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_finishes_the_step_saves_and_says_how_to_resume(sig, code, tmp_path, tiny_model_dir):
    out, log = tmp_path / "run", tmp_path / "run.log"
    # No --save-steps: any checkpoint comes from the signal.
    args = ["grpo", *slow_run(0.5, 4), "--model", tiny_model_dir, "--output-dir", str(out)]
    process = start(args, log)
    wait_for(lambda: steps_logged(out), process, log)
    process.send_signal(sig)
    assert process.wait(timeout=300) == code, log.read_text()[-3000:]
    text = log.read_text()
    assert f"received {sig.name}: finishing this step, then saving a checkpoint" in text
    step = steps_logged(out)[-1]
    assert step < 4 and steps_logged(out) == list(range(1, step + 1))
    assert f"stopped by {sig.name} after step {step}" in text and "Traceback" not in text
    assert f"checkpoint saved: {out / f'checkpoint-{step}'}" in text
    assert is_complete(out / f"checkpoint-{step}") and not (out / "run_summary.json").exists()
    command = next(line for line in text.splitlines() if line.startswith("resume with: "))
    assert command.endswith("--resume-from-checkpoint auto")
    if sig != signal.SIGTERM:
        return
    # The printed command, run as printed, finishes the run.
    resume_args = shlex.split(command[len("resume with: "):])
    assert resume_args[0] == "aitrain"
    resumed = subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", *resume_args[1:]], cwd=FAULTS_DIR, capture_output=True,
        text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert steps_logged(out) == list(range(1, 5))
    assert json.loads((out / "run_summary.json").read_text())["global_step"] == 4


def test_a_second_signal_stops_at_once_without_a_new_checkpoint(tmp_path, tiny_model_dir):
    out, log = tmp_path / "run", tmp_path / "run.log"
    # Steps take over 30 s, so both signals land in the first step.
    process = start(["grpo", *slow_run(30.0, 4), "--model", tiny_model_dir, "--output-dir", str(out)], log)
    wait_for(lambda: "training:" in log.read_text(), process, log)
    time.sleep(2)  # into the step
    process.send_signal(signal.SIGINT)
    wait_for(lambda: "received SIGINT" in log.read_text(), process, log)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 130
    text = log.read_text()
    assert "interrupted; nothing saved since the last checkpoint" in text and "Traceback" not in text
    assert steps_logged(out) == [] and not list(out.glob("checkpoint-*"))
