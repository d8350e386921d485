"""One live run per output folder: a lock file in the folder, held by the run's main process.

Two `aitrain grpo` started together without `--output-dir` both took `outputs/letterenv`: metrics.jsonl
held steps 1,1,2,2,3,3, one adapter overwrote the other, and both exited 0. Every check of the folder's
contents (run/checkpoints.py) runs before either run has written anything, so only a lock held for the
run's lifetime tells a live run from an abandoned folder.

The lock is `fcntl.flock` on `<output_dir>/.aitrain.lock`, which holds the owner's pid for the message.
The kernel drops a flock when its process dies, however it dies (SIGKILL included), so a lock file left
by a dead run is simply taken over: there is no stale-pid guessing. A second run into a locked folder is
refused in one line naming the live pid; a run given no `--output-dir` goes to the next free numbered
folder instead (as when the default folder holds a finished run). Under `accelerate launch` only rank 0
locks, and a busy default folder is refused rather than moved (the other ranks could not follow the move).

The lock file is removed, with any folder the lock itself created that is still empty, when the process
exits, so a run refused later (an environment that does not load) leaves nothing behind. In one process
the same folder may be locked again (the Python API trains several times in one process).

Left out: file systems where flock is not shared between machines (some NFS set-ups): two nodes could
still both take one shared folder there.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
from pathlib import Path

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.outputs import LOCK_NAME, has_entries

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows has no flock; runs there are not locked
    fcntl = None

# folder -> (open lock file descriptor, folders the lock created, innermost first)
_held: dict[Path, tuple[int, list[Path]]] = {}


class OutputDirBusy(ConfigError):
    """The output folder is locked by another live process."""

    def __init__(self, folder: Path, pid: str):
        self.pid = pid
        super().__init__(f"--output-dir {folder} is in use by a live run (pid {pid}); wait for it to finish, or "
                         f"pass another --output-dir")


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


def lock_output_dir(folder: Path) -> None:
    """Hold the lock of `folder` (created if missing) until this process exits; `OutputDirBusy` when a
    live process holds it."""
    if fcntl is None:
        return
    folder = folder.absolute()
    if folder in _held:
        return
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    path = folder / LOCK_NAME
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only folder (a resume into someone else's run)
            raise ConfigError(f"--output-dir {folder} cannot be written ({exc.strerror or type(exc).__name__}); "
                              f"pass a folder you can write to") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            os.close(fd)
            raise OutputDirBusy(folder, pid) from None
        try:  # the file may have been removed by its exiting owner between our open and our flock
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    if not _held:
        atexit.register(release_all)
    _held[folder] = (fd, created)


def release(folder: Path) -> None:
    """Remove and unlock `folder`'s lock, and the folders the lock created if they are still empty."""
    entry = _held.pop(folder.absolute(), None)
    if entry is None:
        return
    fd, created = entry
    try:
        (folder.absolute() / LOCK_NAME).unlink(missing_ok=True)
    except OSError:
        pass
    os.close(fd)
    for made in created:  # innermost first; one that now holds files stays
        try:
            made.rmdir()
        except OSError:
            break


def release_all() -> None:
    for folder in list(_held):
        release(folder)


def _numbered(base: Path, number: int) -> Path:
    return base.with_name(f"{base.name}-{number}")


def claim_output_dir(config: RunConfig, *, movable: bool) -> tuple[RunConfig, str | None]:
    """Lock the run's output folder (on rank 0). A busy folder is refused, unless `movable` (no
    --output-dir was given, and this is a single-process run): then the run goes to the next numbered
    folder that is free and empty, and the returned note says so."""
    if os.environ.get("RANK", "0") != "0":
        return config, None
    base = config.resolved_output_dir()
    try:
        lock_output_dir(base)
        return config, None
    except OutputDirBusy as busy:
        if not movable or os.environ.get("WORLD_SIZE", "1") != "1":
            raise
        pid = busy.pid
    default = dataclasses.replace(config, output_dir=None).resolved_output_dir()  # outputs/<class>
    number = 2  # numbered from the default folder, not from one a taken default moved to (-3-2 for -4)
    while True:
        candidate = _numbered(default, number)
        number += 1
        if candidate.exists() and (not candidate.is_dir() or has_entries(candidate)):
            continue
        try:
            lock_output_dir(candidate)
        except OutputDirBusy:
            continue
        note = (f"note: {base} is in use by a live run (pid {pid}), so this run writes to {candidate} (pass "
                f"--output-dir to choose the folder)")
        return dataclasses.replace(config, output_dir=str(candidate)), note
