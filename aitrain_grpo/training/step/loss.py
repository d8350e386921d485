"""The loss side of the step: what happens to a micro-batch before and inside TRL's loss pass.

TRL's `_compute_loss` (its loss types, clipping, KL, entropy bonus) stays TRL's. Around it:

- `split_micro_batches`: the generation batch shuffled and split as TRL splits it (its own
  `shuffle_sequence_dict` and `split_tensor_dict`, so the draws are TRL's), then, where the shared-prefix
  loss runs, re-split with each group's rows together (step/micro_batches.py `keep_prompts_together`);
- `loss_inputs`: the trailing completion columns no row uses cut (step/micro_batches.py `trim_padding`), and
  with `--rl-zero-std-groups drop|refill` the all-masked rows of dropped groups taken out (rollout/groups.py);
- `importance_from_logps`: with vLLM's importance-sampling correction on a batch trained once
  (step/flow.py `importance_from_loss_pass`), the weights come from the loss pass's own
  log-probabilities, detached, as soon as the pass has them and before TRL's loss reads them: TRL would
  otherwise run a second forward over the whole batch for the same numbers (step/scoring.py);
- `token_mask_shares`: the shares of a pass's model tokens TRL's entropy and off-policy masks keep or take
  out, logged (TRL computes both masks inside its loss and logs neither).

Left out: anything that changes TRL's loss itself.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from aitrain_grpo.training.rollout.groups import without_masked_rows
from aitrain_grpo.training.step.micro_batches import keep_prompts_together, trim_padding
from aitrain_grpo.training.step.batch import GROUP_IDS, loss_mask
from aitrain_grpo.training.step.scoring import importance_ratio, sampling_metrics


def split_micro_batches(batch: dict[str, Any], steps: int, *, together: bool) -> list[dict[str, Any]]:
    """`batch` shuffled and split into `steps` micro-batches, as TRL does; `together`: each prompt's rows
    next to each other (the shared-prefix loss shares within a micro-batch)."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    batches = split_tensor_dict(shuffle_sequence_dict(batch), steps)
    if together:
        batches = keep_prompts_together(batches)
    return [without_group_ids(b) for b in batches]


def without_group_ids(batch: dict[str, Any]) -> dict[str, Any]:
    """`batch` as TRL's loss takes it: the rows' group ids (step/batch.py) are the split's alone."""
    return {key: value for key, value in batch.items() if key != GROUP_IDS}


def loss_inputs(inputs: dict[str, Any], *, drop_masked_rows: bool) -> dict[str, Any]:
    """One micro-batch as TRL's loss takes it (see the module docstring)."""
    inputs = trim_padding(inputs)
    return without_masked_rows(inputs) if drop_masked_rows else inputs


def importance_from_logps(inputs: dict[str, Any], logps: torch.Tensor, *, mode: str, low: float | None,
                          high: float | None, gather: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
    """Write the micro-batch's `importance_sampling_ratio` from the loss pass's own log-probabilities
    `logps` (detached: the old policy's, on a batch trained once), where TRL's loss reads it after the
    pass; returns the `sampling/*` metrics. `mode`, `low`, `high`: TRL's importance-sampling settings."""
    old = logps.detach()
    mask = loss_mask(inputs)
    ratio = importance_ratio(old, inputs["sampling_per_token_logps"], mask, mode=mode, low=low, high=high)
    inputs["importance_sampling_ratio"] = ratio
    return sampling_metrics(ratio, old, inputs["sampling_per_token_logps"], mask, gather)


def token_mask_shares(trainer, inputs: dict[str, Any], logps: torch.Tensor,
                      entropies: torch.Tensor | None) -> dict[str, float]:
    """What TRL's token masks leave in a loss pass, as shares of its model tokens on every process:
    `entropy/trained_frac` under `--rl-top-entropy-quantile` (the tokens at or above the pass's entropy
    quantile) and `off_policy/masked_frac` under `--rl-off-policy-mask` (tokens of sequences with a negative
    advantage and a mean KL from the sampling policy above the threshold), each computed by TRL's own
    function on the pass's log-probabilities and entropies, so they are the masks its loss applies. TRL
    logs neither."""
    mask = loss_mask(inputs)
    counts: dict[str, torch.Tensor] = {}
    if trainer.top_entropy_quantile < 1.0 and entropies is not None:  # a collective: every process calls it
        kept = trainer.get_high_entropy_mask(entropies, mask, 1 - trainer.top_entropy_quantile)
        counts["entropy/trained_frac"] = kept.float().sum()
    if trainer.off_policy_mask_threshold is not None:
        advantages = inputs["advantages"]
        keep = trainer.get_off_policy_mask(advantages if advantages.dim() > 1 else advantages.unsqueeze(1), logps,
                                           inputs["sampling_per_token_logps"], mask, trainer.off_policy_mask_threshold)
        counts["off_policy/masked_frac"] = ((1 - keep) * mask).sum()
    if not counts:
        return {}
    local = torch.stack([*counts.values(), mask.sum()]).float().reshape(1, -1)
    totals = trainer.accelerator.gather(local).sum(dim=0)
    return {name: (totals[i] / totals[-1].clamp(min=1.0)).item() for i, name in enumerate(counts)}


__all__ = ["importance_from_logps", "loss_inputs", "split_micro_batches", "token_mask_shares", "without_group_ids"]
