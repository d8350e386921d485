"""A warning before training when a step could need more memory than the machine has free.

A step's peak grows with the episodes in one forward/backward pass (`--micro-batch-size`) times their
length, and per token with the vocabulary: the logits and their log-softmax, entropy and gradients are
float32 rows of the vocabulary's size. Measured with SmolLM2 (benchmarks/MEMORY.md), each token of a pass
held about `BYTES_PER_TOKEN_PER_VOCAB` bytes per vocabulary entry; the worst case is every episode filling
the prompt plus `--rl-max-completion-length`. The estimate is that worst case, so the warning names the
two flags that bound it; a run whose episodes stay short may still fit.

Left out: GPU memory (the CUDA allocator reports its own), and refusing to start: an estimate warns, the
per-step `memory/peak_rss_gb` says what happened.
"""

from __future__ import annotations

from pathlib import Path

# float32 copies of a vocabulary row per token of a pass (logits, log-softmax, entropy, their
# gradients): SmolLM2 on envs.weather, 8 vs 4 episodes a pass, 18.1 vs 9.7 GB (benchmarks/MEMORY.md).
BYTES_PER_TOKEN_PER_VOCAB = 36
GIB = 2**30


def available_bytes() -> int | None:
    """Memory the kernel says can be taken without swapping (MemAvailable), or None off Linux."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def step_estimate_bytes(*, parameters: int, vocab: int, micro_batch: int, tokens_per_episode: int) -> int:
    """Worst-case peak of one step: float32 weights (with the reference pass and optimizer state for
    what trains, bounded by twice the weights) plus one pass of `micro_batch` full-length episodes."""
    return 2 * 4 * parameters + micro_batch * tokens_per_episode * vocab * BYTES_PER_TOKEN_PER_VOCAB


def memory_warning(*, parameters: int, vocab: int, batch_size: int, micro_batch: int, tokens_per_episode: int,
                   available: int | None) -> str | None:
    """One line when the worst-case step does not fit in `available` bytes, else None; it suggests the
    largest micro-batch that divides `batch_size` and fits, or a shorter budget."""
    if available is None:
        return None
    needed = step_estimate_bytes(parameters=parameters, vocab=vocab, micro_batch=micro_batch,
                                 tokens_per_episode=tokens_per_episode)
    if needed <= available:
        return None
    per_episode = (needed - 2 * 4 * parameters) / micro_batch
    fits = max(int((available - 2 * 4 * parameters) // per_episode), 0)
    divisors = [d for d in range(1, min(fits, micro_batch - 1) + 1) if batch_size % d == 0]
    advice = f"lower --micro-batch-size to {divisors[-1]}" if divisors else "lower --rl-max-completion-length"
    return (f"warning: a step may need up to {needed / GIB:.1f} GB ({micro_batch} episodes a pass of up to "
            f"{tokens_per_episode} tokens after the prompt, vocabulary {vocab}) and {available / GIB:.1f} GB is "
            f"free; {advice}, or the run may be killed for memory")
