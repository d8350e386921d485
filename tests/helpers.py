"""Helpers the test modules share (import them with `from helpers import ...`; conftest.py keeps only
fixtures): the repository root, running the `aitrain` CLI as a user would (in a subprocess, or in-process
with `in_process_cli`), reading env check's table (`policy_row`), and ports that two test runs
on one machine cannot both take (`free_port`, `refused_port`, `retry_on_port_clash`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: str | Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `aitrain ARGS` in a subprocess (the installed entry point's module), capturing output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", *args],
        cwd=str(cwd or REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def in_process_cli(monkeypatch, folder: str | Path):
    """`aitrain ARGS` run in this process from `folder` (environment modules resolve from the current
    folder, as for a user): the same code and exit codes as the command, without a process start."""
    from typer.testing import CliRunner

    from aitrain_grpo.commands.cli import app

    monkeypatch.chdir(folder)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def policy_row(stdout: str, policy: str) -> list[str]:
    """The cells of one policy's row in env check's episodes table: mean, min, max, turns, errors, ..."""
    import re

    for line in stdout.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if cells and cells[0] == policy:
            return cells[1:]
    raise AssertionError(f"no row for policy {policy!r} in:\n{stdout}")


# What a process prints when the port it was handed was taken between our pick and its bind.
PORT_CLASH_MARKERS = ("Address already in use", "EADDRINUSE", "address already in use")


def free_port() -> int:
    """A port the OS just handed out on 127.0.0.1. It is released before the caller's process binds it,
    so another process may take it first: start anything on it through `retry_on_port_clash`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def retry_on_port_clash(start: Callable[[int], subprocess.CompletedProcess], attempts: int = 4) -> subprocess.CompletedProcess:
    """Run `start(port)` on a fresh free port, again on another one if it failed because the port was
    taken meanwhile. (`accelerate launch` itself moves off a port that is taken when it starts; this
    covers the moment between its check and torch's bind.)"""
    for _ in range(attempts - 1):
        result = start(free_port())
        output = (result.stdout or "") + (result.stderr or "")
        if result.returncode == 0 or not any(marker in output for marker in PORT_CLASH_MARKERS):
            return result
    return start(free_port())


@contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 where connections are refused for as long as the block runs: bound here, so
    no other process can take it, but never listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
