"""The loss side of the step: what happens to a micro-batch before and inside TRL's loss pass.

TRL's `_compute_loss` (its loss types, clipping, KL, entropy bonus) stays TRL's. Around it:

- `split_micro_batches`: the generation batch shuffled and split as TRL splits it (its own
  `shuffle_sequence_dict` and `split_tensor_dict`, so the draws are TRL's), then, where the shared-prefix
  loss runs, re-split with each prompt's episodes together (micro_batches.py `keep_prompts_together`);
- `loss_inputs`: the trailing completion columns no row uses cut (micro_batches.py `trim_padding`), and
  with `--rl-zero-std-groups drop|refill` the all-masked rows of dropped groups taken out (groups.py);
- `LossPassImportance`: with vLLM's importance-sampling correction on a batch trained once
  (step/flow.py `importance_from_loss_pass`), the weights come from the loss pass's own
  log-probabilities, detached, as soon as the pass has them and before TRL's loss reads them: TRL would
  otherwise run a second forward over the whole batch for the same numbers (step/scoring.py).

Left out: anything that changes TRL's loss itself.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from aitrain_grpo.training.groups import without_masked_rows
from aitrain_grpo.training.micro_batches import keep_prompts_together, trim_padding
from aitrain_grpo.training.step.batch import loss_mask
from aitrain_grpo.training.step.scoring import importance_ratio, sampling_metrics


def split_micro_batches(batch: dict[str, Any], steps: int, *, together: bool) -> list[dict[str, Any]]:
    """`batch` shuffled and split into `steps` micro-batches, as TRL does; `together`: each prompt's rows
    next to each other (the shared-prefix loss shares within a micro-batch)."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    batches = split_tensor_dict(shuffle_sequence_dict(batch), steps)
    return keep_prompts_together(batches) if together else batches


def loss_inputs(inputs: dict[str, Any], *, drop_masked_rows: bool) -> dict[str, Any]:
    """One micro-batch as TRL's loss takes it (see the module docstring)."""
    inputs = trim_padding(inputs)
    return without_masked_rows(inputs) if drop_masked_rows else inputs


class LossPassImportance:
    """Importance weights from the loss pass. `arm(inputs)` before TRL's loss on a micro-batch whose
    weights are still to come; `fill(logps)` when the pass's log-probabilities are computed (the call
    with entropies: only the loss pass asks for them) writes `importance_sampling_ratio` into that
    micro-batch, where TRL's loss reads it; `disarm()` after. `settings` are TRL's mode and bounds."""

    def __init__(self, *, mode: str, low: float | None, high: float | None,
                 gather: Callable[[torch.Tensor], torch.Tensor], record: Callable[[dict[str, float]], None]):
        self.mode, self.low, self.high = mode, low, high
        self.gather, self.record = gather, record
        self._inputs: dict[str, Any] | None = None

    def arm(self, inputs: dict[str, Any]) -> None:
        self._inputs = inputs if "importance_sampling_ratio" not in inputs else None

    def disarm(self) -> None:
        self._inputs = None

    def fill(self, logps: torch.Tensor) -> None:
        inputs, self._inputs = self._inputs, None
        if inputs is None:
            return
        old = logps.detach()
        mask = loss_mask(inputs)
        ratio = importance_ratio(old, inputs["sampling_per_token_logps"], mask, mode=self.mode, low=self.low,
                                 high=self.high)
        inputs["importance_sampling_ratio"] = ratio
        self.record(sampling_metrics(ratio, old, inputs["sampling_per_token_logps"], mask, self.gather))


__all__ = ["LossPassImportance", "loss_inputs", "split_micro_batches"]
