"""The thread pool that environment calls run in, and which of its threads are inside a call, since when.

An `EpisodeRunner` runs sync environment methods, `asyncio.to_thread` tool functions and adapters' blocking
work in one pool of its own (also its event loop's default executor). A call that timed out goes on
running in its thread, and Python waits for busy pool threads at exit: `aitrain grpo` asks
`calls_running` which calls are still in a thread when it ends (commands/exits.py), and waits only for
those. Idle pool threads do not hold up an exit (the interpreter wakes and joins them), so they are not
counted, and neither are calls that began before `since`: a command run inside a longer-lived process
(a test, a notebook) answers for its own calls, not for whatever an earlier run left behind.

Left out: threads an environment starts itself, and child processes (its `close` ends them).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

THREAD_NAME_PREFIX = "aitrain-env"

# Each pool thread inside a call, with the time.monotonic() at which the call began.
_busy: dict[threading.Thread, float] = {}
_busy_lock = threading.Lock()


def _timed(fn, *args, **kwargs):
    thread = threading.current_thread()
    with _busy_lock:
        _busy[thread] = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        with _busy_lock:
            _busy.pop(thread, None)


class EnvCallPool(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose threads record when they are inside a call (`calls_running`)."""

    def __init__(self, max_workers: int):
        super().__init__(max_workers=max_workers, thread_name_prefix=THREAD_NAME_PREFIX)

    def submit(self, fn, /, *args, **kwargs) -> Future:
        return super().submit(_timed, fn, *args, **kwargs)


def calls_running(since: float = float("-inf")) -> list[threading.Thread]:
    """The pool threads (of every runner in this process) inside a call that began at or after `since`
    (a time.monotonic() reading)."""
    with _busy_lock:
        return [thread for thread, began in _busy.items() if began >= since and thread.is_alive()]
