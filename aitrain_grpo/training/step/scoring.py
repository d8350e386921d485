"""The step's scoring forwards: old-policy and reference log-probabilities, and vLLM's importance weights.

Which forwards a step needs, as TRL 1.16 decides them, with one change (issue 49):

- reference (`ref_per_token_logps`): when the KL term is on (`--rl-kl-coef` > 0): the frozen reference
  model, or under LoRA the base (adapters off, or the adapter loaded as "ref"), as TRL does;
- old policy (`old_per_token_logps`): when a generation batch trains over more than one optimizer step
  (TRL's `steps_per_generation` or `num_iterations` past the accumulation window), the policy moves
  between sampling and the later micro-batches, so the ratio needs the policy as it sampled;
- importance weights (`importance_sampling_ratio`, vLLM sampled the tokens: colocated, a server, or an
  engine this package syncs): exp(old - sampled), truncated or masked at TRL's bounds. When the batch
  trains once, the old policy *is* the policy of the loss pass, so the weights are computed there from
  its own log-probabilities, detached (step/loss.py `IMPORTANCE_FROM_LOSS_PASS`): TRL runs a second
  forward over the whole batch for numbers the loss pass computes anyway. The loss and its gradients are
  the same (tests/test_no_second_forward.py compares both paths on one batch).

All forwards run without gradients, through the trainer's own log-probability pass (shared prefix
included, training/step/shared_prefix.py) and over each chunk's own length (training/trl/scoring_passes.py).

Left out: multimodal forward arguments.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

# (model, input_ids, attention_mask, logits_to_keep, batch_size) -> per-token log-probabilities
Scorer = Callable[[Any, torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def importance_ratio(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, *, mode: str,
                     low: float | None, high: float | None) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio (token or sequence level, truncated or masked at its bounds)."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=low, max=high)
    if mode not in ("sequence_mask", "token_mask"):
        raise ValueError(f"importance sampling mode {mode!r} is not one of token_truncate, token_mask, "
                         f"sequence_truncate, sequence_mask")
    low = -float("inf") if low is None else low
    high = float("inf") if high is None else high
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def sampling_metrics(ratio: torch.Tensor, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor,
                     gather: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
    """How far the sampler's log-probabilities are from the policy's, and the weights' spread (TRL's
    `sampling/*` metrics), plus `sampling/is_masked_frac`: the share of model tokens weighted 0."""
    mask = mask.bool()
    delta = torch.abs(old - sampling)[mask]
    delta = delta[~torch.isnan(delta)]
    zero = torch.tensor(0.0, device=old.device)
    weights = ratio.expand_as(mask) if ratio.shape != mask.shape else ratio
    flat = ratio.flatten() if ratio.shape[-1] == 1 and mask.shape[-1] != 1 else ratio[mask]
    tokens = gather(mask.sum().float().reshape(1)).sum()
    masked = gather(((weights == 0) & mask).sum().float().reshape(1)).sum()
    return {
        "sampling/sampling_logp_difference/mean": gather((delta.mean() if delta.numel() else zero).reshape(1)).mean().item(),
        "sampling/sampling_logp_difference/max": gather((delta.max() if delta.numel() else zero).reshape(1)).max().item(),
        "sampling/importance_sampling_ratio/min": gather((flat.min() if flat.numel() else zero).reshape(1)).min().item(),
        "sampling/importance_sampling_ratio/mean": gather((flat.mean() if flat.numel() else zero).reshape(1)).mean().item(),
        "sampling/importance_sampling_ratio/max": gather((flat.max() if flat.numel() else zero).reshape(1)).max().item(),
        "sampling/is_masked_frac": (masked / tokens.clamp(min=1)).item(),
    }


__all__ = ["Scorer", "importance_ratio", "sampling_metrics"]
