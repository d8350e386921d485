"""The process's peak memory per training step, so a run killed for memory is recognisable from its
last progress line (`mem 3.1G`) and `metrics.jsonl` says which step grew.

Linux keeps the process's resident high-water mark in /proc/self/status (`VmHWM`); writing "5" to
/proc/self/clear_refs resets it, so each step's peak is its own. Where that file cannot be written (not
Linux, or not allowed) the peak is the run's so far, which still grows when a step needs more.

Left out: GPU memory (torch.cuda.max_memory_allocated belongs beside it once a GPU run needs it) and
child processes (a vLLM server is its own process).
"""

from __future__ import annotations

import resource
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def peak_rss_bytes() -> int:
    """The resident high-water mark since the last `reset_peak` (or the process start)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def reset_peak() -> bool:
    """Start a new high-water mark at the current resident size; False where that is not possible."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False
