"""The process's peak memory per training step, so a run killed for memory is recognisable from its
last progress line (`mem 3.1G`) and `metrics.jsonl` says which step grew.

Linux keeps the process's resident high-water mark in /proc/self/status (`VmHWM`); writing "5" to
/proc/self/clear_refs resets it, so each step's peak is its own. Where that file cannot be written (not
Linux, or not allowed) the peak is the run's so far, which still grows when a step needs more.

A step's peak is also split by phase (`StepPeaks`): the rollout (generation and environment), the loss
(the log-probabilities TRL computes from the rollout where it needs them, then the forward and backward
of every micro-batch), and the optimizer step. The phases follow each other, so each mark reads the peak since
the last one and starts a new one; the step's peak is the largest.

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


class StepPeaks:
    """One step's peak resident memory per phase, in GB: `start()` when the step begins, `mark(phase)`
    when a phase ends (the peak since the previous mark), `metrics()` at the step's end."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}

    def start(self) -> None:
        self.peaks = {}
        reset_peak()

    def mark(self, phase: str) -> None:
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), peak_rss_bytes() / 2**30)
        reset_peak()

    def metrics(self) -> dict[str, float]:
        """`memory/<phase>_peak_rss_gb` for each phase marked, and `memory/peak_rss_gb`, the step's."""
        out = {f"memory/{phase}_peak_rss_gb": gb for phase, gb in self.peaks.items()}
        out["memory/peak_rss_gb"] = max(self.peaks.values(), default=peak_rss_bytes() / 2**30)
        return out
