"""`--max-time`: a run given a wall-clock limit stops before a step that would end past it, saves its
last step, prints the command that resumes and exits 0; the command it prints goes on from there."""

from __future__ import annotations

import json
import shlex

import pytest
from transformers import TrainerControl, TrainerState

from aitrain_grpo.training.run.time_limit import TimeLimit, duration_text
from helpers import REPO, run_cli


def test_the_run_stops_before_the_step_that_would_end_past_the_limit():
    """Steps of 10 s under a 35 s limit: after step 3 (30 s) the next would end at 40 s, so the run stops."""
    now = [0.0]
    limit = TimeLimit(35.0, clock=lambda: now[0])
    state, control = TrainerState(max_steps=10), TrainerControl()
    limit.on_train_begin(None, state, control)
    for step in range(1, 11):
        now[0] += 10.0
        state.global_step = step
        limit.on_step_end(None, state, control)
        if control.should_training_stop:
            break
    assert state.global_step == 3 and control.should_save
    assert limit.reached == "stopped at step 3 of 10 to end within --max-time 35s (30s trained, 10s a step)"
    assert duration_text(41400) == "11h30m" and duration_text(90061) == "1d1h1m1s" and duration_text(1.25) == "1.2s"
    assert duration_text(0.004) == "0.004s" and duration_text(0) == "0s"  # a tiny --max-time is not shown as 0.0s


def test_the_last_step_is_never_stopped_for_the_limit():
    now = [0.0]
    limit = TimeLimit(1.0, clock=lambda: now[0])
    state, control = TrainerState(max_steps=1, global_step=1), TrainerControl()
    now[0] = 5.0
    limit.on_step_end(None, state, control)
    assert not control.should_training_stop and limit.reached is None  # it finished: nothing to resume


@pytest.mark.integration
def test_a_run_past_its_limit_saves_says_how_to_resume_and_the_resume_goes_on(tmp_path):
    out = tmp_path / "run"
    args = ["grpo", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--max-steps", "4",
            "--rl-max-new-tokens", "8", "--output-dir", str(out), "--max-time", "0.001", "--no-use-vllm"]
    result = run_cli(*args, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-3].startswith("stopped at step 1 of 4 to end within --max-time 0.001s"), lines[-3:]
    assert lines[-2] == f"checkpoint saved: {out / 'checkpoint-1'}"
    assert lines[-1].startswith("resume with: aitrain grpo") and lines[-1].endswith("--resume-from-checkpoint auto")
    assert not (out / "run_summary.json").exists()  # not finished: `aitrain eval` points at the checkpoint
    # The printed command, as a user would paste it, goes on from step 1 (and stops again after step 2).
    resumed = run_cli(*shlex.split(lines[-1].removeprefix("resume with: aitrain ")), cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and (out / "checkpoint-2").is_dir()
