"""Helpers the test modules share (import them with `from helpers import ...`; conftest.py keeps only
fixtures, and no test module imports from another): the repository root, the files git tracks in it
(`tracked_files`, `copy_tracked`: a fresh clone's, never those a user made), the fixture environments'
folder, running the `aitrain` CLI as a user would (in a subprocess, in-process with `in_process_cli`,
under `accelerate launch`), a command's options as `--help` shows them, reading env check's table
(`policy_row`), a one-line error's message, and ports that two test runs on one machine cannot both
take (`free_port`, `refused_port`, `retry_on_port_clash`). Topic helpers are submodules: `helpers.vllm`
(real vLLM servers), `helpers.rollouts` (scripted rollouts to compare), `helpers.browser` (report.html
in Chromium), `helpers.fake_judge` (an OpenAI-compatible judge served in the test's process).
Plugins, registered by conftest.py: `helpers.module_order` (the order `-n` runs modules in),
`helpers.extras` (the tests that need a package README's install lacks)."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Environment packages written for the tests; they import as `envs_fixtures.<name>` from tests/.
FIXTURES_DIR = REPO / "tests" / "envs_fixtures"


@functools.lru_cache(maxsize=None)
def tracked_files(folder: str) -> tuple[Path, ...]:
    """The files under `folder` (relative to the repository root) that git tracks, relative to the root:
    what a fresh clone has, without what a user made in theirs by following README (`aitrain init my_task`
    writes envs/my_task.py and tests/test_my_task.py, runs write outputs/). Outside a git checkout (or where
    git lists nothing there) there is no telling, and every file under `folder` but caches is taken."""
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--", folder], capture_output=True,
                                text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    files = [Path(name) for name in listed.split("\0") if name and (REPO / name).is_file()]
    if not files:
        files = [path.relative_to(REPO) for path in sorted((REPO / folder).rglob("*"))
                 if path.is_file() and "__pycache__" not in path.parts]
    return tuple(files)


def copy_tracked(folder: str, destination: str | Path) -> None:
    """Copy the tracked files under `folder` into `destination`, at the same relative paths."""
    import shutil

    for name in tracked_files(folder):
        target = Path(destination) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)


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


def require(module: str, install: str = ""):
    """Import `module` for a test module that needs it, or skip the module saying it could not be
    imported. A skip for a missing package is checked (tests/helpers/extras.py): the module must be marked
    extras, and in CI's second pass, which installs the extras, it fails instead, so that a broken install
    cannot pass as a skip."""
    import importlib

    import pytest

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(f"could not import {module!r} ({exc}){'; install: ' + install if install else ''}",
                    allow_module_level=True)


def accelerate_launch(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`aitrain ARGS` under `accelerate launch` with examples/accelerate/cpu2.yaml (two processes) on a
    port of its own (the yaml names none, so that two runs on one machine do not both take torch's
    default 29500), again on another port if it was taken."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def launch(port: int) -> subprocess.CompletedProcess:
        command = [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "examples/accelerate/cpu2.yaml"),
            "--main_process_port", str(port), "-m", "aitrain_grpo", *args,
        ]
        return subprocess.run(command, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=timeout)

    return retry_on_port_clash(launch)


def command_options(*path: str) -> dict[str, tuple[str, object]]:
    """`--flag -> (help, default)` of a command, as `aitrain ... --help` shows them."""
    from typer.main import get_command

    from aitrain_grpo.commands.cli import app

    command = get_command(app)
    for name in path:
        command = command.commands[name]
    return {param.opts[0]: (param.help, param.default) for param in command.params}


def one_line(info) -> str:
    """The message of the exception in a `pytest.raises` block, checked to be one line."""
    message = str(info.value)
    assert "\n" not in message and message.strip() == message, message
    return message


def policy_row(stdout: str, policy: str) -> list[str]:
    """The cells of one policy's row in env check's episodes table: mean, min, max, turns, errors, ... A
    name folded within its cell (a narrow console: a line with only the name's cell filled) is joined."""
    import re

    rows: list[list[str]] = []
    for line in stdout.splitlines():
        parts = re.split(r"[│┃|]", line)
        cells = [c.strip() for c in parts[1:-1]] if len(parts) > 2 else [c.strip() for c in parts if c.strip()]
        if not cells or not cells[0]:
            continue
        if rows and len(cells) > 1 and not any(cells[1:]):
            rows[-1][0] += cells[0]
            continue
        rows.append(cells)
    for cells in rows:
        if cells[0] == policy:
            return [c for c in cells[1:] if c]
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
