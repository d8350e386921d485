"""Sequence records into TRL's batch: the one place tensors are made from a step's episodes.

TRL's loss (`GRPOTrainer._compute_loss`, trl 1.16) reads a dict of per-row tensors: `prompt_ids` and
`prompt_mask` (left-padded), `completion_ids` and `completion_mask` (right-padded), `tool_mask` (1 where
a completion token is the model's and trains), `advantages`, `sampling_per_token_logps`, and where its
options need them `old_per_token_logps`, `ref_per_token_logps` and `importance_sampling_ratio`
(step/scoring.py adds those), plus `num_items_in_batch` (the model tokens of the whole generation batch,
every process: the `dapo`/`cispo`/`vespo` normaliser). `advantages` is (rows, tokens): the episode's
advantage plus each token's turn credit, so the loss needs no per-token fix-up of its own.

Blank rows. TRL's split of a generation batch into `steps_per_generation` micro-batches keeps none past
a multiple of it, and processes must run the same number of forwards (collective under FSDP). An
episode of several sequences adds rows, so every process pads its batch with blank rows (one prompt
token, no completion, loss mask 0) to the most rows any process has, rounded up to a multiple of
`steps_per_generation`. Blank rows count where TRL counts an all-masked row: in the per-row denominators
of `grpo`/`sapo`/`luspo`/`dr_grpo`; `--rl-zero-std-groups drop|refill` takes them out of the loss with
the dropped groups (training/rollout/groups.py `without_masked_rows`).

Left out: `pad_to_multiple_of` (no run sets it) and multimodal keys.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from aitrain_grpo.training.step.records import SequenceRecord


def blank_rows_needed(episodes: int, extra_here: int, most_extra: int, steps: int) -> int:
    """Blank rows this process adds: up to the most extra rows (earlier sequences) any process has, then
    to a multiple of `steps` (`episodes` rows, one per episode, are the same on every process). None when
    no process has an extra row: TRL's batch then splits as it stands."""
    if most_extra == 0:
        return 0
    return most_extra - extra_here + (-(episodes + most_extra)) % steps


GROUP_IDS = "group_ids"


def blank_record(anchor: int) -> SequenceRecord:
    """A row that trains nothing: one real prompt token (`anchor`), no completion."""
    return SequenceRecord(prompt_ids=(anchor,), completion_ids=(), env_mask=(), sampling_logps=(), advantage=0.0,
                          turn_credit=None, episode=-1, group=-1, sequence=0, last=False, in_loss=False)


def trl_batch(records: Sequence[SequenceRecord], pad_id: int, device: torch.device | str) -> dict[str, Any]:
    """TRL's per-row tensors of `records` (see the module docstring); `num_items_in_batch` is the caller's."""
    prompt_width = max(len(r.prompt_ids) for r in records)
    width = max(1, max(len(r.completion_ids) for r in records))  # TRL scores `logits_to_keep` >= 1 columns

    def left(values, fill, dtype=torch.long):
        return torch.tensor([[fill] * (prompt_width - len(v)) + list(v) for v in values], dtype=dtype, device=device)

    def right(values, fill, dtype=torch.long):
        return torch.tensor([list(v) + [fill] * (width - len(v)) for v in values], dtype=dtype, device=device)

    advantages = torch.tensor([r.advantage for r in records], dtype=torch.float32, device=device)
    credit = right([r.turn_credit if r.turn_credit is not None else [0.0] * len(r.completion_ids) for r in records],
                   0.0, torch.float32)
    sampling = right([[float("nan") if v is None else v for v in r.sampling_logps] for r in records], 0.0,
                     torch.float32)
    return {
        "prompt_ids": left([r.prompt_ids for r in records], pad_id),
        "prompt_mask": left([[1] * len(r.prompt_ids) for r in records], 0),
        "completion_ids": right([r.completion_ids for r in records], pad_id),
        "completion_mask": right([[1] * len(r.completion_ids) for r in records], 0),
        "tool_mask": right([r.env_mask for r in records], 0),
        "sampling_per_token_logps": sampling,
        "advantages": advantages.unsqueeze(1) + credit,
        # which group each row is of: the loss pass keeps a group's rows together (step/micro_batches.py),
        # then drops this key before TRL sees the micro-batch
        GROUP_IDS: torch.tensor([r.group for r in records], dtype=torch.long, device=device),
    }


def loss_mask(batch: dict[str, Any]) -> torch.Tensor:
    """1 where a completion token counts in the loss."""
    return batch["completion_mask"] * batch["tool_mask"]


__all__ = ["GROUP_IDS", "blank_record", "blank_rows_needed", "loss_mask", "trl_batch"]
