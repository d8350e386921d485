"""How `aitrain grpo` ends its process once training is over, stopped or not.

Environment calls that timed out may still be running in worker threads, and Python waits for such
threads at exit: one stuck for good would hang a finished run forever. So when some are left after a
short grace period, the process ends without waiting for them.

A stop by a signal (training/run/signals.py) is in a hurry: its sender kills the job after a grace period
(SLURM and Kubernetes: 30 s by default), and the calls left are those of the step it dropped. So its
grace is shorter, and once the exit handlers have run (the run lock, MCP servers, trackers) the process
ends without the interpreter's teardown, which frees every module one by one: about 3 s on the tiny
model, of a stop that otherwise takes 0.1 s (docs/operations.md).

Left out: daemon threads and child processes an environment started itself (its own `close` or the
exit handlers it registered are its way to end them).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

import typer
from rich.console import Console


def exit_without_waiting_for_env_calls(code: int, err: Console, *, at_once: bool = False) -> None:
    """Exit with `code`; `at_once` for a stop by a signal (see the module docstring)."""
    deadline = time.monotonic() + (0.5 if at_once else 2.0)
    workers = [t for t in threading.enumerate() if t.name.startswith("aitrain-env")]
    for thread in workers:  # idle workers end as soon as their pool shuts down
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [t for t in workers if t.is_alive()]
    if stuck:
        calls = "of the dropped step" if at_once else "that timed out"
        err.print(f"note: {len(stuck)} environment call(s) {calls} are still running; exiting without them", markup=False)
    if at_once:
        atexit._run_exitfuncs()  # what a normal exit runs first; then no teardown
    if stuck or at_once:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise typer.Exit(code)
