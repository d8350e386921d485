"""What a person watching a training run sees: a progress bar and a compact metrics line per logging step.

On a terminal, a rich progress bar shows step / total, elapsed time, the ETA and the latest reward mean
and std, mean turns and errors; above it, one metrics line per logging step. When stdout is not a
terminal (a log file, CI, a test capturing output) there is no bar and no colour: just the lines,
`step 12/200  reward 0.412±0.180  turns 2.50  errors 0  ...  rollout 3.10s (gen 2.40s, env 0.50s)
optimizer 1.20s  850 tok/s  mem 1.2G  4.30s/step  eta 13:45`, so logs stay greppable and show where the time goes.

Left out: writing anything to disk (files.py) and judging the numbers (health.py).
"""

from __future__ import annotations

import atexit
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import TrainerCallback


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def metrics_line(step: int, max_steps: int, logs: dict[str, Any], elapsed: float, steps_done: int) -> str:
    """The compact line printed at each logging step. Starts `step N/M  reward mean±std`."""
    per_step = elapsed / max(steps_done, 1)
    parts = [
        f"step {step}/{max_steps}",
        f"reward {logs.get('reward', 0.0):.3f}±{logs.get('reward_std', 0.0):.3f}",
        f"turns {logs.get('env/turns_mean', 0.0):.2f}",
        f"errors {int(logs.get('env/errors', 0))}",
    ]
    if logs.get("env/tool_errors"):
        parts.append(f"tool errors {int(logs['env/tool_errors'])}")
    for key, label, fmt in (("kl", "kl", ".4f"), ("entropy", "entropy", ".3f"), ("grad_norm", "grad", ".2f")):
        value = logs.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {value:{fmt}}")
    clipped = logs.get("clip_ratio/region_mean")  # TRL's share of tokens clipped: above 0 only from a batch's 2nd update
    if isinstance(clipped, (int, float)) and clipped > 0:
        parts.append(f"clipped {clipped:.2f}")
    parts.extend(_time_parts(logs))
    memory = logs.get("memory/peak_rss_gb")
    if isinstance(memory, (int, float)):
        parts.append(f"mem {memory:.1f}G")  # the step's peak: a run killed for memory shows it growing
    parts.append(f"{per_step:.2f}s/step")
    if max_steps and step < max_steps:
        parts.append(f"eta {_clock(per_step * (max_steps - step))}")
    return "  ".join(parts)


def _time_parts(logs: dict[str, Any]) -> list[str]:
    """Where a step's time went (the `time/*` metrics of training/step/phases.py), where they were
    logged: the rollout and its generation and environment time, then the rest of the step (`train`)
    and its reference forward, loss forward and backward, and optimizer step; and the held-back
    evaluation (`time/eval_s`, a phase of the step) where the step had one."""
    keys = ("rollout", "generate", "env", "step", "ref_logprobs", "loss_forward_backward", "optimizer_step")
    seconds = {key: logs.get(f"time/{key}_s") for key in keys}
    if not all(isinstance(v, (int, float)) for v in seconds.values()):
        return []
    evaluation = logs.get("time/eval_s")
    evaluation = evaluation if isinstance(evaluation, (int, float)) else 0.0
    parts = [f"rollout {seconds['rollout']:.2f}s (gen {seconds['generate']:.2f}s, env {seconds['env']:.2f}s)",
             f"train {seconds['step'] - seconds['rollout'] - evaluation:.2f}s (ref {seconds['ref_logprobs']:.2f}s, "
             f"loss {seconds['loss_forward_backward']:.2f}s, optim {seconds['optimizer_step']:.2f}s)"]
    if evaluation > 0:
        parts.append(f"eval {evaluation:.2f}s")
    speed = logs.get("time/tokens_per_s")
    if isinstance(speed, (int, float)):
        parts.append(f"{speed:.0f} tok/s")
    return parts


class TrainingProgress(TrainerCallback):
    """A progress bar on a terminal; plain metrics lines otherwise. Only the main process shows it."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False, emoji=False)
        self.started: float | None = None
        self.first_step = 0
        self.progress: Progress | None = None
        self.task = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.time()
        self.first_step = state.global_step  # a resumed run: speed counts only the steps run now
        if not state.is_world_process_zero:
            return
        self.console.print(f"training: {state.max_steps} steps, output in {args.output_dir}", markup=False)
        if self.console.is_terminal:
            self.progress = Progress(
                TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                TextColumn("{task.fields[stats]}"),
                console=self.console,
            )
            self.task = self.progress.add_task("train", total=state.max_steps, completed=state.global_step, stats="")
            self.progress.start()
            # A crash skips on_train_end; without this the terminal is left with a hidden cursor.
            atexit.register(self._stop)

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        elapsed = time.time() - (self.started or time.time())
        line = metrics_line(state.global_step, state.max_steps, logs, elapsed, state.global_step - self.first_step)
        if self.progress is not None:
            stats = (f"reward {logs.get('reward', 0.0):.3f}±{logs.get('reward_std', 0.0):.3f}  "
                     f"turns {logs.get('env/turns_mean', 0.0):.2f}  errors {int(logs.get('env/errors', 0))}")
            self.progress.update(self.task, completed=state.global_step, stats=stats)
            self.progress.console.print(line, markup=False)
        else:
            self.console.print(line, markup=False)

    def on_train_end(self, args, state, control, **kwargs):
        self._stop()

    def _stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
