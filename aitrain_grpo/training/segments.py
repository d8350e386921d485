"""Every sequence of an episode trains: the rows of its earlier sequences (issue 36).

An episode whose history was rewritten mid-episode (an agent's new segment, engine/agent_session.py; a
context strategy) is several token sequences: `RolloutBatch.earlier[i]` holds those before its last,
`traces[i]`. TRL 1.16's `rollout_func` must return one row per prompt, and its advantages are computed
over those rows, one score per episode, so the group normalisation sees each episode once. The earlier
sequences join afterwards:

- the rollout returns them as the per-sample extra field `earlier_sequences` (each a dict of its
  `prompt_ids`, `completion_ids`, `logprobs`, `env_mask`, and `turn_advantages` with `--rl-advantage
  turn`; `rows_for_trl`), none for an episode out of the loss (`--rl-zero-std-groups drop|refill`);
- after TRL scored the batch (trl_hooks.py `_generate_and_score_completions`), `with_earlier_sequences`
  appends one row per earlier sequence that has a model token: exactly its tokens (the sampled ones at
  `env_mask` 1, as sampled), its episode's advantage (and per-token turn credit), its sampling
  log-probabilities, and the old, reference and importance-sampling values wherever TRL's batch has
  them, computed by TRL's own `_get_per_token_logps_and_entropies` and mirroring TRL's rules; TRL's
  token count `num_items_in_batch` (the `dapo`/`cispo`/`vespo` normaliser) counts their model tokens.
- TRL then shuffles the rows and splits them into `steps_per_generation` equal micro-batches, keeping
  none past a multiple of it. So every process pads its batch to the same number of rows, a multiple of
  `steps_per_generation`, with blank rows (one prompt token, no completion, loss mask 0): processes run
  the same number of forwards (collective under FSDP), and no row is left out. Blank rows count where
  TRL counts an all-masked row: in the `grpo`/`sapo`/`luspo`/`dr_grpo` per-row denominators (fewer
  than `steps_per_generation` a step, plus, with several processes, the extra rows another process has
  more); `--rl-zero-std-groups drop|refill` takes them out with the dropped groups (groups.py). A
  micro-batch thus holds more rows than `--micro-batch-size` episodes (micro_batches.py).

How the loss weighs an episode of several sequences against one of one: TRL's loss type decides, rows
being rows (docs/architecture.md, "Token rules"). Token-level losses (`dapo`, TRL's default, `cispo`,
`vespo`; `bnpo` per micro-batch) weigh every model token alike, so a split episode weighs what it
would had its tokens been one sequence; per-sequence losses (`grpo`, `sapo`, `luspo`) give each
sequence weight 1, so an episode of k sequences counts k times.

Metrics (training): `sequences/per_episode` (the rows the step's episodes train over its episodes, all
processes: an agent's segments as well as a context strategy's rewrites, which `env/sequences_mean`
counts as played; a dropped group's episode as one), `sequences/extra_rows` (rows added) and
`sequences/blank_rows`.

Left out: multimodal batches (an extra row carries no image; refused), TRL's
`mask_truncated_completions` (no run sets it), and a per-row weight (docs/architecture.md says why).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from aitrain_grpo.engine.rollout import RolloutBatch, TokenTrace

EARLIER = "earlier_sequences"  # the rollout's per-sample extra field
# Keys of TRL's scored batch whose rows the extra rows fill; any other per-row key is refused.
_ROW_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask", "advantages",
             "sampling_per_token_logps", "old_per_token_logps", "ref_per_token_logps",
             "importance_sampling_ratio", "turn_advantages")

# (model, input_ids, attention_mask, logits_to_keep, batch_size) -> per-token log-probabilities
Scorer = Callable[[Any, torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def sequences_of(batch: RolloutBatch) -> list[list[TokenTrace]]:
    """Per episode, its sequences in order: the earlier ones, then `traces[i]`."""
    earlier = list(batch.earlier) + [[]] * (len(batch.traces) - len(batch.earlier))
    return [list(before) + [last] for before, last in zip(earlier, batch.traces)]


def rows_for_trl(batch: RolloutBatch, dropped: set[int] = frozenset()) -> list[list[dict[str, Any]]] | None:
    """The `earlier_sequences` extra field: per episode, its earlier sequences as plain lists (none for
    an episode in `dropped`); None when no episode has any."""
    if not any(batch.earlier):
        return None
    return [[] if i in dropped else [
        {"prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids, "logprobs": t.logprobs, "env_mask": t.env_mask}
        for t in seqs[:-1]] for i, seqs in enumerate(sequences_of(batch))]


def with_earlier_sequences(trainer, output: dict[str, Any], inputs: Sequence[dict[str, Any]], score: Scorer) -> dict[str, Any]:
    """TRL's scored batch `output` with a row for each earlier sequence of its episodes (`inputs`, the
    rows TRL left the rollout's extra fields in), and blank rows; see the module docstring. `score` is
    TRL's log-probability pass. Every process calls it (it gathers)."""
    extra = [(i, row) for i, item in enumerate(inputs) for row in item.get(EARLIER) or () if any(row["env_mask"])]
    device = output["advantages"].device
    local = torch.tensor([len(extra), sum(sum(row["env_mask"]) for _, row in extra), len(inputs)], device=device)
    totals = trainer.accelerator.gather(local.unsqueeze(0)).view(-1, 3)
    most, processes = int(totals[:, 0].max()), totals.shape[0]
    training = trainer.model.training
    steps = trainer.args.steps_per_generation if training else 1
    padding = (-(len(inputs) + most)) % steps if most else 0
    blank = most - len(extra) + padding
    if training:
        added, episodes = int(totals[:, 0].sum()), int(totals[:, 2].sum())
        trainer.step_metrics.update({
            "sequences/per_episode": (episodes + added) / max(episodes, 1),
            "sequences/extra_rows": float(added),
            "sequences/blank_rows": float(processes * (most + padding) - added),
        })
    if most == 0:
        return output
    refused = [k for k, v in output.items() if k not in _ROW_KEYS and _per_row(v, len(inputs))]
    if refused:
        raise RuntimeError(f"an episode of several sequences cannot train with batch keys {refused} (multimodal)")
    block = _block(trainer, output, extra, blank)
    size = trainer.args.per_device_train_batch_size if training else trainer.args.per_device_eval_batch_size
    _score_block(trainer, output, block, score, size)
    joined = _joined(output, block, _pad_id(trainer))
    joined["num_items_in_batch"] = output["num_items_in_batch"] + totals[:, 1].sum().to(output["num_items_in_batch"])
    return joined


def _block(trainer, output: dict[str, Any], extra: list[tuple[int, dict]], blank: int) -> dict[str, torch.Tensor]:
    """The extra rows (and `blank` blank rows) as tensors of their own widths."""
    device = output["advantages"].device
    anchor = int(output["prompt_ids"][0, -1])  # a real token (prompts are left-padded): the blank rows' prompt
    rows = [row for _, row in extra] + [{"prompt_ids": [anchor], "completion_ids": [], "logprobs": [],
                                          "env_mask": []}] * blank
    prompt_width = max(len(r["prompt_ids"]) for r in rows)
    width = max(1, max(len(r["completion_ids"]) for r in rows))  # TRL scores `logits_to_keep` >= 1 columns

    def left(values, fill, dtype=torch.long):
        return torch.tensor([[fill] * (prompt_width - len(v)) + list(v) for v in values], dtype=dtype, device=device)

    def right(values, fill, dtype=torch.long):
        return torch.tensor([list(v) + [fill] * (width - len(v)) for v in values], dtype=dtype, device=device)

    pad = _pad_id(trainer)
    block = {
        "prompt_ids": left([r["prompt_ids"] for r in rows], pad),
        "prompt_mask": left([[1] * len(r["prompt_ids"]) for r in rows], 0),
        "completion_ids": right([r["completion_ids"] for r in rows], pad),
        "completion_mask": right([[1] * len(r["completion_ids"]) for r in rows], 0),
        "tool_mask": right([r["env_mask"] for r in rows], 0),
        "sampling_per_token_logps": right([r["logprobs"] for r in rows], 0.0, torch.float32),
        "advantages": torch.cat([output["advantages"][[i for i, _ in extra]],
                                 output["advantages"].new_zeros(blank)]),
    }
    if "turn_advantages" in output:
        block["turn_advantages"] = right([r.get("turn_advantages", [0.0] * len(r["completion_ids"])) for r in rows],
                                         0.0, torch.float32)
    return block


def _score_block(trainer, output: dict[str, Any], block: dict[str, torch.Tensor], score: Scorer, size: int) -> None:
    """The old, importance-sampling and reference values of the block's rows, where TRL's batch has them,
    computed as TRL computes its own (grpo_trainer.py `_generate_and_score_completions`, trl 1.16)."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    ids = torch.cat([block["prompt_ids"], block["completion_ids"]], dim=1)
    mask = torch.cat([block["prompt_mask"], block["completion_mask"]], dim=1)
    keep = block["completion_ids"].shape[1]
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        if "old_per_token_logps" in output or "importance_sampling_ratio" in output:
            block["old_per_token_logps"] = score(trainer.model, ids, mask, keep, size)
        if "importance_sampling_ratio" in output:
            block["importance_sampling_ratio"] = importance_ratio(
                trainer, block["old_per_token_logps"], block["sampling_per_token_logps"],
                block["completion_mask"] * block["tool_mask"])
        if "ref_per_token_logps" in output:
            if trainer.ref_model is not None:
                block["ref_per_token_logps"] = score(trainer.ref_model, ids, mask, keep, size)
            else:  # a LoRA run: the base model (or the adapter loaded as "ref"), as TRL does
                model = trainer.accelerator.unwrap_model(trainer.model)
                with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                    block["ref_per_token_logps"] = score(trainer.model, ids, mask, keep, size)
    if "old_per_token_logps" not in output:
        block.pop("old_per_token_logps", None)


def importance_ratio(trainer, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio (token or sequence level, truncated or masked at TRL's bounds)."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    mode = trainer.vllm_importance_sampling_mode
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    low, high = trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=low, max=high)
    low = -float("inf") if low is None else low
    high = float("inf") if high is None else high
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def _joined(output: dict[str, Any], block: dict[str, torch.Tensor], pad: int) -> dict[str, Any]:
    """`output`'s rows then `block`'s: prompts left-padded and completions right-padded to the wider."""
    rows = output["advantages"].shape[0]
    prompt_width = max(output["prompt_ids"].shape[1], block["prompt_ids"].shape[1])
    width = max(output["completion_ids"].shape[1], block["completion_ids"].shape[1])
    joined = dict(output)
    for key, value in output.items():
        if key not in _ROW_KEYS or not _per_row(value, rows):
            continue
        other = block[key].to(value.dtype)
        if value.dim() >= 2 and key.startswith("prompt"):
            fill = pad if key == "prompt_ids" else 0
            value, other = (_pad(t, prompt_width, fill, left=True) for t in (value, other))
        elif value.dim() >= 2 and not value.shape[1] == other.shape[1] == 1:  # (rows, 1): a sequence-level ratio
            fill = pad if key == "completion_ids" else 0
            value, other = (_pad(t, width, fill, left=False) for t in (value, other))
        joined[key] = torch.cat([value, other])
    return joined


def _pad(tensor: torch.Tensor, width: int, fill, *, left: bool) -> torch.Tensor:
    missing = width - tensor.shape[1]
    if missing <= 0:
        return tensor
    return torch.nn.functional.pad(tensor, (missing, 0) if left else (0, missing), value=fill)


def _per_row(value: Any, rows: int) -> bool:
    return (isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows) or \
        (isinstance(value, list) and len(value) == rows)


def _pad_id(trainer) -> int:
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    pad = getattr(tokenizer, "pad_token_id", None)
    return 0 if pad is None else int(pad)


__all__ = ["EARLIER", "importance_ratio", "rows_for_trl", "sequences_of", "with_earlier_sequences"]
