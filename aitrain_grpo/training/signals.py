"""Ctrl-C and `kill` during training: finish the step, save a checkpoint, say how to resume, exit 130/143.

`SignalStop` is a trainer callback. While `train()` runs it handles SIGINT and SIGTERM by noting the
signal and letting the current step finish; at the end of that step it asks HF Trainer to save a
checkpoint and stop. `stopping.clean_stops` then turns the stop into `TrainingStopped` with exit code
128 + the signal number (130 for SIGINT, 143 for SIGTERM), the shell convention for "killed by".

A second Ctrl-C (or SIGTERM) restores the default handlers' behaviour and stops at once, without a
new checkpoint: someone pressing it twice does not want to wait for a slow step.

With several processes (torchrun), a signal may reach them at different steps; the flag is combined
across processes at each step end, so all of them stop after the same step.

Left out: SIGKILL (cannot be caught; the checkpoints already on disk are the answer), SIGHUP, and
handling signals outside `train()` (model loading stops the usual way, with KeyboardInterrupt).
"""

from __future__ import annotations

import os
import signal
import threading

import torch
import torch.distributed as dist
from transformers import TrainerCallback

HANDLED = (signal.SIGINT, signal.SIGTERM)


class SignalStop(TrainerCallback):
    """Turns SIGINT/SIGTERM into "save a checkpoint and stop after this step"."""

    def __init__(self):
        self.received: int | None = None  # the first signal's number
        self._previous: dict[int, object] = {}

    # ------------------------------------------------------------------------- handlers

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python only lets the main thread set handlers; a Python-API run in a thread keeps the defaults
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

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
        os.write(2, f"\nreceived {name}: finishing this step, then saving a checkpoint (send it again to stop now)\n".encode())

    # ------------------------------------------------------------------------- trainer events

    def on_step_end(self, args, state, control, **kwargs):
        if self._agreed_signal() is not None:
            control.should_save = True
            control.should_training_stop = True
        return control

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
