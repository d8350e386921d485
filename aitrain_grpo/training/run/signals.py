"""Ctrl-C and `kill` during training: drop the step in progress, save the last finished one, say how to
resume, exit 130/143.

Clusters stop jobs with SIGTERM and a grace period of about 30 s before SIGKILL, and a step of a real
model can take minutes, so a signal does not wait for the step. `SignalStop` is a trainer callback; while
`train()` runs it handles SIGINT and SIGTERM by raising `StepAbandoned` from the handler, which Python
runs in the main thread between two bytecodes: wherever the step is (a rollout waiting on its
episodes, a generate loop, a loss pass between two torch calls, a wait on a server), it is left at
once. `clean_stops` (run/stopping.py) catches it and calls `abandon_step`: the gradients the step had
accumulated are zeroed, the random state is put back to what it was when the last step ended, and the
checkpoint of that step is saved. Nothing else a checkpoint holds changes before the optimizer step,
so that checkpoint is the one a save at the end of that step would have written, and HF's resume
(which skips `global_step * gradient_accumulation_steps` batches of the epoch our resumable sampler
reorders the same way: run/checkpoints.py) plays the dropped step's rows again, in the same order. The exit
code is 128 + the signal number (130 for SIGINT, 143 for SIGTERM), the shell convention for "killed by".

Some spans must not be cut, as their state would be half-changed: `train()` until its loop begins
(a resumed run loading its checkpoint: a stop then would save a half-loaded optimizer as step N), from
the optimizer step to the start of the next step (optimizer, scheduler, step counter, the step's logs
and scheduled checkpoint), a checkpoint write, a weight sync into vLLM. Those run inside
`uninterrupted()` (or between the callbacks that open and close them); a signal that lands there is
noted and acted on when the span ends (at the end of a step: the step counts, and is saved the old way,
by `on_step_end`). The worst case is therefore one optimizer step plus one checkpoint write (plus a
weight sync). The process's own end, in a hurry too, is commands/exits.py's.

A backward pass is one torch call, and Python runs no handler until it returns: 7 s for one micro-batch
of SmolLM2 on a busy CPU. So each trainable parameter gets a gradient hook that does nothing: a Python
call in the middle of the backward (which runs on the calling thread on a CPU), where a pending signal's
handler runs and its exception leaves the backward. On a GPU the backward runs in torch's device
threads, where no handler runs, and takes far less time anyway.

A second Ctrl-C (or SIGTERM) restores the default handlers' behaviour and stops at once, without a
new checkpoint: someone pressing it twice does not want to wait for a save.

Left out: several processes (torchrun). A rank that leaves its step while the others sit in a collective
would hang them, so there the old behaviour stays: the signal is noted, combined across processes at
each step end, and all of them stop after the same (finished) step. Also left out: SIGKILL (cannot be
caught; the checkpoints already on disk are the answer), SIGHUP, handling signals outside `train()`
(model loading stops the usual way, with KeyboardInterrupt), and `--rl-async-steps`: a run that plays
the next step ahead on a server pool did not end within five minutes of a dropped step (its worker
waits on the pool and the weights the dropped step never synced), so there too the step finishes first
(`finish_step`), as before.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import TrainerCallback

HANDLED = (signal.SIGINT, signal.SIGTERM)
_active: SignalStop | None = None  # the installed handler, for `uninterrupted()`


class StepAbandoned(BaseException):
    """Raised in the main thread when a signal drops the step in progress. Not an `Exception`, so no
    episode's fault handling takes it for the episode's error; not a KeyboardInterrupt either, which
    asyncio re-raises out of the event loop from every task that awaits the one it ended, so closing
    the rollout's loop afterwards would raise it again."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def uninterrupted():
    """A span a signal must not cut (see the module docstring): a signal landing in it is acted on
    when it ends. Does nothing when no handler is installed (outside `train()`, or not the main thread)."""
    stop = _active
    if stop is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    stop.deferred += 1
    try:
        yield
    finally:
        stop.deferred -= 1
    stop.raise_if_pending()


def rng_state() -> dict:
    """The random states HF Trainer saves with a checkpoint (`_save_rng_state`)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _let_a_signal_in(grad):
    """A gradient hook: being Python, it lets a pending signal's handler run inside the backward."""
    return None


class SignalStop(TrainerCallback):
    """Turns SIGINT/SIGTERM into "drop this step, save the last finished one, stop"; see the module docstring."""

    def __init__(self, *, finish_step: bool = False):
        self.received: int | None = None  # the first signal's number
        self.deferred = 0  # depth of `uninterrupted()` spans the main thread is in
        # One process: drop the step; several, or async steps (`finish_step`): finish it (module docstring).
        self.abandon = int(os.environ.get("WORLD_SIZE", "1")) <= 1 and not finish_step
        self.rng_at_step_end: dict | None = None  # the random state a checkpoint of the last step holds
        self._raised = False
        self._in_step_end = False
        self._loading = False  # installed, training loop not begun yet
        self._hooks: list = []  # gradient hooks, removed when training ends
        self._previous: dict[int, object] = {}

    # ------------------------------------------------------------------------- handlers

    def install(self) -> None:
        global _active
        if threading.current_thread() is not threading.main_thread():
            return  # Python only lets the main thread set handlers; a Python-API run in a thread keeps the defaults
        if not self._loading:
            self._loading = True
            self.deferred += 1  # until on_train_begin: a resume loads its checkpoint (module docstring)
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        _active = self

    def uninstall(self) -> None:
        global _active
        self._remove_hooks()  # also after a stop, which skips on_train_end (a Python caller keeps its model)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if _active is self:
            _active = None

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            # The second signal: give up on the clean stop.
            self.uninstall()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        # os.write, not print: a handler may run while the console is in the middle of a line.
        name = signal.Signals(signum).name
        if not self.abandon:
            what = "finishing this step, then saving a checkpoint"
        elif self.deferred:
            what = "letting the optimizer step, save, weight sync or checkpoint load in progress finish, then stopping"
        else:
            what = "dropping the step in progress and saving the last finished one"
        os.write(2, f"\nreceived {name}: {what} (send it again to stop now)\n".encode())
        self.raise_if_pending()

    def raise_if_pending(self) -> None:
        """Leave the step now if a signal asked for it and nothing in progress must finish first."""
        if self.abandon and self.received is not None and not self._raised and self.deferred == 0:
            self._raised = True
            raise StepAbandoned(self.received)

    # ------------------------------------------------------------------------- trainer events

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.abandon and model is not None:  # the backward's way in (module docstring)
            self._hooks = [p.register_hook(_let_a_signal_in) for p in model.parameters()
                           if p.requires_grad and p.device.type == "cpu"]  # a GPU's backward runs no handler
        if self._loading:  # everything is loaded: the first step may be dropped
            self._loading = False
            self.deferred -= 1
            self.raise_if_pending()
        return control

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # From here to the next step's start the step is being made to count: not cut (module docstring).
        if not self._in_step_end:
            self._in_step_end = True
            self.deferred += 1
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.rng_at_step_end = rng_state()  # nothing draws between here and a scheduled save
        if self._agreed_signal() is not None:
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        self._end_of_step_over(raise_pending=True)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._remove_hooks()
        self._end_of_step_over(raise_pending=False)
        self.abandon = False  # no step left to drop: a signal now lets the run end as it is ending
        return control

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _end_of_step_over(self, *, raise_pending: bool) -> None:
        if self._in_step_end:
            self._in_step_end = False
            self.deferred -= 1
            if raise_pending:
                self.raise_if_pending()

    def _agreed_signal(self) -> int | None:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.received
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        flag = torch.tensor([self.received or 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.received = int(flag.item()) or None
        return self.received

    @property
    def exit_code(self) -> int:
        return 128 + int(self.received or 0)


def abandon_step(trainer, stop: SignalStop) -> Path | None:
    """After `StepAbandoned`: the checkpoint of the last finished step (None when none finished). The
    dropped step's gradients are zeroed (a checkpoint does not hold them, but nothing may step on them)
    and the random state is the one that step ended with, so the resumed run draws as an unstopped one."""
    with uninterrupted():
        trainer.model.zero_grad(set_to_none=True)
        if stop.rng_at_step_end is not None:
            set_rng_state(stop.rng_at_step_end)
        return trainer.save_checkpoint_now()
