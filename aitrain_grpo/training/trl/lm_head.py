"""TRL's fused LM head scores only the positions that have a label, on a CPU as on CUDA.

Why: TRL 1.16 computes every log-probability of the loss and of the reference/old passes through a
fused LM head (`trl.trainer.utils.add_fused_lm_head`): the backbone's hidden states go through the
head in tiles, without the (batch, length, vocabulary) logits. Where Triton runs (CUDA, XPU) it scores
only the positions whose label counts, the completion tokens. Everywhere else it scores every
position, prompt and padding included, and zeroes the result afterwards, because devices that compile
per shape (Neuron) would recompile whenever the number of positions changes. A CPU runs eagerly and
compiles nothing, so there it only pays: the head's product with the whole vocabulary (49,152 rows for
SmolLM2), the running log-sum-exp and the entropy per position in the forward, and the same again in
the backward, for prompt positions whose values are thrown away. On issue 33's tool environment 79 %
of the positions are the prompt.

`scoring_labelled_positions` wraps TRL's `_use_triton` as `trl.trainer.utils` reads it: in that module it
decides only `compact` (which positions go through the head), not which kernel runs (the kernel
module keeps its own reference, so a CPU still folds its tiles with torch ops). Exact: each
position's log-probability and entropy come from its own hidden state and label alone; the compact
path computes the same ones and scatters them into zeros, where the full path zeroes the rest
(tests/test_lm_head.py compares log-probabilities, entropies and gradients). Installed through
training/trl/hooks.py, which pins what it was read with.

Left out: devices other than the CPU (CUDA already takes the compact path; others keep TRL's choice)
and TRL's distillation trainer, which reads its own reference to `_use_triton`.
"""

from __future__ import annotations

import functools
from typing import Callable


def scoring_labelled_positions(use_triton: Callable) -> Callable:
    """`use_triton` (TRL's `_use_triton(device)`) answering True for a CPU; the same function if it is
    wrapped already."""
    if getattr(use_triton, "scores_labelled_positions_on_cpu", False):
        return use_triton

    @functools.wraps(use_triton)
    def compact(device):
        return device.type == "cpu" or use_triton(device)

    compact.scores_labelled_positions_on_cpu = True
    return compact
