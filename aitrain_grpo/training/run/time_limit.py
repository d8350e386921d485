"""`--max-time`: end a run cleanly before a wall-clock limit, with a checkpoint to resume from.

Why: a notebook session, a SLURM allocation or a spot machine gives a run so many hours and then takes
the machine, often without a signal first (a signal is run/signals.py's case). A run that knows its
limit saves its last step and stops by itself; `--resume-from-checkpoint auto` with the same command goes
on in the next session.

The clock starts when training starts (the model loaded, the trainer built) and counts this process's
time only: a resumed run has the whole limit again. At the end of each step the run stops if the next
step, taking as long as the last one did, would end past the limit; so it stops early by up to one step
rather than late by one. The step it stops after is saved as a checkpoint (HF Trainer's save at that
step, written whole: run/checkpoints.py) and the run ends through `TrainingStopped` (run/stopping.py),
which prints where the checkpoint is and the command that resumes, with exit code 0: the run did what it
was told. Several processes decide together (any process past the limit stops them all), so none waits
at a collective for one that stopped.

Left out: the time before training starts (loading, the first held-back evaluation is inside it), and a
limit on the whole of several resumed runs (each invocation has its own).
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


def duration_text(seconds: float) -> str:
    """`5400` as "1h30m", `90` as "1m30s", `1.25` as "1.2s", `0.004` as "0.004s" (not "0.0s")."""
    if seconds < 0.1:
        return f"{seconds:.2g}s"
    if seconds < 10:
        return f"{seconds:.1f}s"
    seconds = round(seconds)
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{value}{unit}" for value, unit in parts if value) or "0s"


class TimeLimit(TrainerCallback):
    """See the module docstring. `seconds`: the limit; `reached` holds the stop's one-line reason once
    the run stopped for it."""

    def __init__(self, seconds: float, clock=time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self.started = self.step_started = clock()
        self.reached: str | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = self.step_started = self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        now = self.clock()
        step_seconds, self.step_started = now - self.step_started, now
        over = now - self.started + step_seconds > self.seconds
        if state.global_step >= state.max_steps or not agreed_by_any(over):
            return control
        self.reached = (f"stopped at step {state.global_step} of {state.max_steps} to end within --max-time "
                        f"{duration_text(self.seconds)} ({duration_text(now - self.started)} trained, "
                        f"{duration_text(step_seconds)} a step)")
        control.should_save = True
        control.should_training_stop = True
        return control


def agreed_by_any(flag: bool) -> bool:
    """True on every process when it is True on any (one small collective a step, under several)."""
    from accelerate import PartialState

    if PartialState().num_processes <= 1:
        return flag
    from accelerate.utils import gather_object

    return any(gather_object([flag]))
