"""The process's peak memory per training step, so a run killed for memory is recognisable from its
last progress line (`mem 3.1G`) and `metrics.jsonl` says which step grew.

Linux keeps the process's resident high-water mark in /proc/self/status (`VmHWM`); writing "5" to
/proc/self/clear_refs resets it, so each step's peak is its own. Where that file cannot be written (not
Linux, or not allowed) the peak is the run's so far, which still grows when a step needs more.

A step's peak is also split by phase (`StepPeaks`): the rollout (generation and environment), the loss
(the log-probabilities TRL computes from the rollout where it needs them, then the forward and backward
of every micro-batch), and the optimizer step. The phases follow each other, so each mark reads the peak since
the last one and starts a new one; the step's peak is the largest.

On CUDA, `memory/peak_gpu_gb` is the step's peak of memory torch allocated on this process's GPU
(`torch.cuda.max_memory_allocated`, reset when the step starts): what decides whether a step fits on
the card. It is read only where torch is already imported and sees a GPU.

Left out: GPU memory per phase and memory torch did not allocate (colocated vLLM's KV cache is
reserved up front by `--vllm-gpu-memory-utilization`; cuDNN/NCCL workspaces), and child processes (a
vLLM server is its own process).
"""

from __future__ import annotations

import resource
import sys
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


def _cuda():
    """torch.cuda where torch is loaded and a GPU is visible, else None (never imports torch itself)."""
    torch = sys.modules.get("torch")
    try:
        return torch.cuda if torch is not None and torch.cuda.is_available() else None
    except Exception:  # a broken driver must not stop the run's logging
        return None


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
        cuda = _cuda()
        if cuda is not None:
            cuda.reset_peak_memory_stats()

    def mark(self, phase: str) -> None:
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), peak_rss_bytes() / 2**30)
        reset_peak()

    def metrics(self) -> dict[str, float]:
        """`memory/<phase>_peak_rss_gb` for each phase marked, `memory/peak_rss_gb`, the step's, and on
        CUDA `memory/peak_gpu_gb`."""
        out = {f"memory/{phase}_peak_rss_gb": gb for phase, gb in self.peaks.items()}
        out["memory/peak_rss_gb"] = max(self.peaks.values(), default=peak_rss_bytes() / 2**30)
        cuda = _cuda()
        if cuda is not None:
            out["memory/peak_gpu_gb"] = cuda.max_memory_allocated() / 2**30
        return out
