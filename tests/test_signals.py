"""Ctrl-C and `kill` during training, in a real process: within seconds the step in progress is dropped,
the last finished step is saved, the run says how to resume and exits 130 (SIGINT) or 143 (SIGTERM); the
printed command resumes it. That the resume is exact, the other phases of a step and a second signal
are in test_preemption.py."""

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

from aitrain_grpo.training.run.checkpoints import is_complete

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
def test_a_signal_mid_step_stops_within_seconds_saves_the_last_step_and_says_how_to_resume(sig, code, tmp_path,
                                                                                          tiny_model_dir):
    out, log = tmp_path / "run", tmp_path / "run.log"
    # No --save-steps: any checkpoint comes from the signal. Scoring takes 6 s a step, so finishing
    # step 2 would take over 5 s more; the signal lands in its rollout.
    args = ["grpo", *slow_run(6.0, 3), "--model", tiny_model_dir, "--output-dir", str(out)]
    process = start(args, log)
    wait_for(lambda: steps_logged(out), process, log)
    time.sleep(0.5)
    sent = time.monotonic()
    process.send_signal(sig)
    assert process.wait(timeout=300) == code, log.read_text()[-3000:]
    seconds = time.monotonic() - sent
    text = log.read_text()
    assert seconds < 10, f"stopping took {seconds:.1f} s\n{text[-3000:]}"  # the bound docs/operations.md gives
    assert f"received {sig.name}: dropping the step in progress and saving the last finished one" in text
    assert steps_logged(out) == [1]  # step 2 was dropped, not finished
    assert f"stopped by {sig.name} during step 2, which a resume plays again" in text and "Traceback" not in text
    assert f"checkpoint saved: {out / 'checkpoint-1'}" in text and "timed out" not in text
    assert is_complete(out / "checkpoint-1") and not (out / "run_summary.json").exists()
    assert not (out / ".aitrain.lock").exists()  # the exit handlers ran, though the interpreter's teardown did not
    command = next(line for line in text.splitlines() if line.startswith("resume with: "))
    assert command.endswith("--resume-from-checkpoint auto")
    if sig != signal.SIGTERM:
        return
    # The printed command, run as printed, finishes the run: the dropped step is played then, once.
    resume_args = shlex.split(command[len("resume with: "):])
    assert resume_args[0] == "aitrain"
    resumed = subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", *resume_args[1:]], cwd=FAULTS_DIR, capture_output=True,
        text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert steps_logged(out) == [1, 2, 3]
    assert json.loads((out / "run_summary.json").read_text())["global_step"] == 3


def test_a_signal_in_the_first_step_stops_at_once_and_says_there_is_nothing_to_resume(tmp_path, tiny_model_dir):
    out, log = tmp_path / "run", tmp_path / "run.log"
    # Steps take over 30 s; before this change the signal waited for the first one to end.
    process = start(["grpo", *slow_run(30.0, 4), "--model", tiny_model_dir, "--output-dir", str(out)], log)
    wait_for(lambda: "training:" in log.read_text(), process, log)
    time.sleep(2)  # into the step
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=20) == 130, log.read_text()[-3000:]
    text = log.read_text()
    assert "stopped by SIGINT during step 1; no step had finished, so there is no checkpoint to resume from" in text
    assert "Traceback" not in text
    assert steps_logged(out) == [] and not list(out.glob("checkpoint-*"))
