"""The training display: a live progress bar on a terminal, one compact metrics line per logging step.
(Plain output when stdout is not a terminal is checked on a real run in test_report.py.)"""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console
from transformers import TrainerControl, TrainerState

from aitrain_grpo.runlog.progress import TrainingProgress, metrics_line

LOGS = {"reward": 0.412, "reward_std": 0.18, "env/turns_mean": 2.5, "env/errors": 1.0, "env/tool_errors": 2.0,
        "kl": 0.01, "entropy": 1.2345, "grad_norm": 0.5}


def test_metrics_line_reads_left_to_right():
    line = metrics_line(12, 200, LOGS, elapsed=24.0, steps_done=12)
    assert line == ("step 12/200  reward 0.412±0.180  turns 2.50  errors 1  tool errors 2  kl 0.0100  entropy 1.234  "
                    "grad 0.50  2.00s/step  eta 6:16")
    # The last step has no ETA; metrics TRL did not log are left out rather than shown as 0.
    assert metrics_line(3, 3, {"reward": 1.0}, elapsed=3.0, steps_done=3) == (
        "step 3/3  reward 1.000±0.000  turns 0.00  errors 0  1.00s/step")


def test_a_terminal_gets_a_live_bar_with_metrics_lines_above_it():
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200, highlight=False)
    progress = TrainingProgress(console)
    state, control, args = TrainerState(), TrainerControl(), SimpleNamespace(output_dir="outputs/run")
    state.max_steps = 4
    progress.on_train_begin(args, state, control)
    for step in range(1, 5):
        state.global_step = step
        progress.on_step_end(args, state, control)
        progress.on_log(args, state, control, logs=dict(LOGS, reward=0.1 * step))
    progress.on_train_end(args, state, control)
    raw = buffer.getvalue()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)
    assert "\x1b[" in raw  # drawn with terminal control codes, unlike plain output
    assert "training: 4 steps, output in outputs/run" in text
    assert "4/4" in text and "eta" in text and "elapsed" in text
    for step in range(1, 5):
        assert f"step {step}/4  reward {0.1 * step:.3f}±0.180" in text
    assert "reward 0.400±0.180  turns 2.50  errors 1" in text  # the bar's own summary of the latest step
    assert progress.progress is None  # stopped: the terminal gets its cursor back


def test_the_line_shows_where_the_step_time_went():
    timed = dict(LOGS, **{"time/rollout_s": 3.1, "time/generate_s": 2.4, "time/env_s": 0.5, "time/step_s": 4.3,
                          "time/ref_logprobs_s": 0.3, "time/loss_forward_backward_s": 0.8, "time/optimizer_step_s": 0.05,
                          "time/tokens_per_s": 850.4})
    line = metrics_line(12, 200, timed, elapsed=24.0, steps_done=12)
    assert ("grad 0.50  rollout 3.10s (gen 2.40s, env 0.50s)  train 1.20s (ref 0.30s, loss 0.80s, optim 0.05s)  "
            "850 tok/s  2.00s/step") in line
