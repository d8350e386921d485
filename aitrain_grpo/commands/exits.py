"""How the commands end: a user error as one `error:` line and its exit code, Ctrl-C outside training as
`interrupted` and 130 (`reported_errors`, `fail`), and how `aitrain grpo` ends its process once training is
over, stopped or not (`exit_without_waiting_for_env_calls`).

Environment calls that timed out may still be running in worker threads, and Python waits for such
threads at exit: one stuck for good would hang a finished run forever. So when some are left after a
short grace period, the process ends without waiting for them. Only calls of this command count
(engine/env_threads.py knows which pool threads are inside a call, and since when).

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
import contextlib
import os
import sys
import time

import typer
from rich.console import Console

from aitrain_grpo.errors import EXIT_USAGE, UserError, one_line
from aitrain_grpo.training.run.lock import release_all

# Where the commands print: results on stdout, notes and errors on stderr.
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
out = Console(highlight=False, soft_wrap=True, emoji=False)


def exit_without_waiting_for_env_calls(code: int, err: Console, *, since: float, at_once: bool = False) -> None:
    """Exit with `code`; `at_once` for a stop by a signal (see the module docstring). Only environment
    calls that began at or after `since` (the command's start, a time.monotonic() reading) are waited for:
    a command run inside a longer-lived process does not end that process for an earlier run's calls."""
    from aitrain_grpo.engine.env_threads import calls_running

    deadline = time.monotonic() + (0.5 if at_once else 2.0)
    while calls_running(since) and time.monotonic() < deadline:
        time.sleep(0.02)
    stuck = calls_running(since)
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


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is meant for the user as it stands."""
    return (UserError,)


def early_stops() -> tuple[type[BaseException], ...]:
    """Ends of training before its last step, with a checkpoint (imported only when one happens:
    training/run/stopping.py imports torch)."""
    from aitrain_grpo.training.run.stopping import TrainingStopped

    return (TrainingStopped,)


@contextlib.contextmanager
def reported_errors(debug: bool):
    """A `UserError` raised inside becomes `error: <one line>` and its exit code (2 unless it says
    otherwise); with `--debug` it propagates with its traceback. Ctrl-C says so and exits 130."""
    try:
        yield
    except user_errors() as exc:
        release_all()  # a refused sft run leaves no lock, nor the folder the lock made
        if debug:
            raise
        fail(str(exc), code=getattr(exc, "exit_code", EXIT_USAGE))
    except KeyboardInterrupt:
        release_all()
        if debug:
            raise
        err.print("interrupted", markup=False)
        raise typer.Exit(130) from None


def fail(message: str, code: int = EXIT_USAGE) -> None:
    err.print(f"error: {one_line(message, limit=10_000)}", markup=False)
    raise typer.Exit(code)
