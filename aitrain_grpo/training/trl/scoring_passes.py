"""TRL's scoring forwards (the reference and old log-probabilities, without gradient) over each chunk's
own length instead of the whole batch's.

Why: TRL pads a generation batch once, every completion to the batch's longest, and runs the reference
(and, where it needs them, the old) log-probabilities over it in chunks of rows (here a loss pass's,
step/micro_batches.py `scoring_chunk_rows`) without trimming them. One long episode makes every chunk as long as it is: on issue 33's tool
environment (SmolLM2, batch 16) the reference forward took 1.74x the same forward over each chunk's own
length, 0.98x with this and trl/lm_head.py (CPU time, benchmarks/STEP_LIMIT.md). The loss pass does not pay
this: micro_batches.trim_padding cuts its micro-batches before TRL's `_compute_loss`.

How: forward hooks (public torch API) on the policy and TRL's reference model. Before a forward that
TRL's fused LM head serves (`fused_lm_head=True`, labels given, no cache) and that runs without
gradient, the trailing columns that no row of the chunk attends to are cut from `input_ids`,
`attention_mask` and `labels`; after it, each per-token output of the head (`log_probs`, `entropy`,
...) is padded back with the zeros TRL's head writes at unlabelled positions. Exact: a causal model's
earlier positions never see later ones, and the cut columns are padding that no row attends to and no
label scores (tests/test_scoring_passes.py compares with TRL's own pass).

Left out: forwards with gradient (the loss pass is trimmed already; the shared-prefix path passes a
cache), inputs beyond ids, mask and labels (multimodal rows keep TRL's path), and the prompts' left
padding, which would move every real token's position.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

PER_TOKEN_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
_TRIMMED = "_aitrain_trimmed_lengths"  # per module: the uncut length of each forward under way (or None)


def trailing_cut(kwargs: dict[str, Any]) -> int | None:
    """The length to cut a scoring forward's inputs to, or None to leave the forward alone."""
    if torch.is_grad_enabled() or not kwargs.get("fused_lm_head") or kwargs.get("past_key_values") is not None:
        return None
    mask, ids, labels = kwargs.get("attention_mask"), kwargs.get("input_ids"), kwargs.get("labels")
    if mask is None or ids is None or labels is None or mask.dim() != 2:
        return None
    if any(isinstance(v, torch.Tensor) for k, v in kwargs.items() if k not in ("input_ids", "attention_mask", "labels")):
        return None  # images, token types, explicit positions: TRL's path
    used = mask.any(dim=0).nonzero()
    keep = int(used[-1]) + 1 if used.numel() else 1
    return keep if keep < mask.shape[1] else None


def _cut(module, args, kwargs):
    keep = None if args else trailing_cut(kwargs)
    lengths = module.__dict__.setdefault(_TRIMMED, [])
    lengths.append(None if keep is None else kwargs["input_ids"].shape[1])
    if keep is None:
        return None
    for key in ("input_ids", "attention_mask", "labels"):
        kwargs[key] = kwargs[key][:, :keep]
    return args, kwargs


def _pad_back(module, args, kwargs, output):
    lengths = module.__dict__.get(_TRIMMED)
    length = lengths.pop() if lengths else None
    if length is None or output is None:
        return None
    for name in PER_TOKEN_OUTPUTS:
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            # The head scores position t's next token: L - 1 columns for L inputs.
            setattr(output, name, torch.nn.functional.pad(value, (0, length - 1 - value.shape[1])))
    return output


def trim_scoring_passes(modules: Iterable[Any]) -> None:
    """Install the hooks on each of `modules` (None skipped): the policy and TRL's reference model."""
    for module in modules:
        if module is not None:
            module.register_forward_pre_hook(_cut, with_kwargs=True)
            module.register_forward_hook(_pad_back, with_kwargs=True, always_call=True)
