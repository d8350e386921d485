"""Episodes per optimizer step apart from episodes per forward pass (`--batch-size` vs `--micro-batch-size`).

A GRPO step needs its whole group of episodes (`--batch-size`, a multiple of `--rl-num-generations`) to
compute advantages, but the forward and backward passes need not see them all at once: the activations,
the log-probabilities and their gradients grow with the episodes in one pass times their padded length.
TRL already separates the two: one generation batch of `per_device_train_batch_size *
steps_per_generation` episodes is played, its advantages computed over the whole batch, then it is split
into `steps_per_generation` micro-batches that accumulate gradients into one optimizer step. So
`--batch-size B --micro-batch-size M` becomes `per_device_train_batch_size=M` and
`gradient_accumulation_steps = (B / M) * --gradient-accumulation-steps`, with TRL's default
`steps_per_generation` (= the accumulation steps): the same episodes, advantages and loss normalisation
as one pass of B (every TRL loss type divides by the accumulation steps or by the generation batch's
token count), in pieces. The old/reference log-probabilities are computed in chunks of a loss pass's
rows (`scoring_chunk_rows`: M, or more where an episode trains several sequences).

An episode whose history was rewritten mid-episode trains a row per sequence (step/records.py): its earlier
sequences' rows join the generation batch before TRL shuffles and splits it, with blank rows up to a
multiple of the micro-batches, so a pass then holds more rows than `--micro-batch-size` episodes (each
pass grows by the step's extra rows over its passes; a lower `--micro-batch-size` makes room).

Each micro-batch arrives padded to the longest episode of the whole generation batch; `trim_padding` cuts
the completion columns no episode of the micro-batch uses, so a short micro-batch costs its own length.

Keeping a group's rows together (`keep_prompts_together`, while the shared-prefix loss is on):
TRL shuffles the generation batch's episodes before splitting it, so with groups of 4 in a batch of 16
a micro-batch of 2 holds two episodes of one prompt only one time in five, and the shared-prefix loss
(step/shared_prefix.py) saves only within a micro-batch. The shuffled batch is re-ordered by group (groups
in the order TRL's shuffle first reached them, a group's rows, an episode's several sequences among them,
in the order of their tokens) and split again into as many micro-batches of the same size. What that does to the loss, per TRL loss type (trl 1.16
`_compute_loss`): a step's gradient is the sum of its equal-sized micro-batches', so for `grpo`, `sapo`
and `luspo` (a mean over the micro-batch's episodes, divided by the accumulation steps), `dr_grpo` (a
token sum over micro-batch size x max completion length) and `dapo`, `cispo`, `vespo` (a token sum over
the whole generation batch's token count) an episode's weight does not depend on where it lands: the
step is TRL's, to float rounding. `bnpo` divides each micro-batch by its own token count, as do the
entropy bonus (`--rl-entropy-coef`) and TRL's `top_entropy_quantile` mask: there an episode's weight is
1 / the tokens of its micro-batch, over a random partition of groups instead of TRL's random partition
of episodes (a group's episodes weighted alike, as one pass over the step would). Neither is one pass of
the step; the two differ as two shuffles of TRL's do.

Left out: choosing M from a measurement of free memory at run time (the default is a constant measured in
benchmarks/MEMORY.md; `memory_check` warns when the estimate does not fit) and token-budget packing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from aitrain_grpo.errors import ConfigError

# Episodes in one forward/backward pass when --micro-batch-size is not given. Measured with SmolLM2 on
# a CPU (benchmarks/MEMORY.md, envs.weather, batch 8): peak 18.1 / 9.7 / 5.9 GB at 8 / 4 / 2 episodes a
# pass, step time 146 / 121 / 124 s: smaller passes cost no time here, and 2 keeps a real model's step
# within a few gigabytes.
DEFAULT_MICRO_BATCH = 2


def micro_batch_size(batch_size: int, asked: int | None, *, whole_step: bool = False) -> int:
    """The episodes per forward pass for a step of `batch_size` episodes. Given (`asked`), it must
    divide the batch; by default the largest divisor of the batch up to `DEFAULT_MICRO_BATCH`.

    `whole_step` (--rl-zero-std-groups drop/refill): one pass. TRL normalises each micro-batch's loss
    on its own and shuffles the step's episodes across them, so the dropped groups' rows would still
    count in the normalisation of the micro-batches they land in, and the informative groups would not
    get the full step that `drop` promises."""
    if whole_step:
        if asked is not None and asked < batch_size:
            raise ConfigError(f"--micro-batch-size {asked} with --rl-zero-std-groups drop or refill: dropped groups "
                              f"leave the loss of one whole pass only; use --micro-batch-size {batch_size}, or "
                              f"--rl-zero-std-groups keep")
        return batch_size
    if asked is not None:
        if asked > batch_size:
            return batch_size  # a micro-batch larger than the step is the step
        if batch_size % asked:
            divisors = [d for d in range(1, batch_size + 1) if batch_size % d == 0 and d <= max(asked, 1) * 2]
            raise ConfigError(f"--batch-size {batch_size} is not a multiple of --micro-batch-size {asked}; use a "
                              f"divisor of the batch, e.g. {', '.join(map(str, divisors[-3:]))}")
        return asked
    return max(d for d in range(1, min(batch_size, DEFAULT_MICRO_BATCH) + 1) if batch_size % d == 0)


def trl_batch_arguments(batch_size: int, asked_micro: int | None, accumulation: int, *,
                        whole_step: bool = False) -> dict[str, int]:
    """TRL's batch arguments (GRPOConfig and SFTConfig alike) for `--batch-size`, `--micro-batch-size`
    and `--gradient-accumulation-steps`: episodes per optimizer step stay `batch_size * accumulation`."""
    micro = micro_batch_size(batch_size, asked_micro, whole_step=whole_step)
    return {
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accumulation * (batch_size // micro),
    }


@dataclass(frozen=True)
class BatchShape:
    """How a run's steps are cut into forward/backward passes, decided once in the run plan (run/plan.py)
    before any model loads, so a micro-batch that does not divide the batch is refused first."""

    episodes_per_pass: int  # TRL's per_device_train_batch_size
    accumulation_steps: int  # TRL's gradient_accumulation_steps: the passes of one optimizer step

    @classmethod
    def of(cls, config: Any, *, whole_step: bool | None = None) -> "BatchShape":
        """The shape of `config`'s steps (a RunConfig): `--batch-size`, `--micro-batch-size` and
        `--gradient-accumulation-steps`; one pass a batch with --rl-zero-std-groups drop/refill unless
        `whole_step` says otherwise (aitrain sft passes False)."""
        if whole_step is None:
            whole_step = getattr(config, "rl_zero_std_groups", "keep") != "keep"
        arguments = trl_batch_arguments(config.batch_size, config.micro_batch_size,
                                        config.gradient_accumulation_steps, whole_step=whole_step)
        return cls(arguments["per_device_train_batch_size"], arguments["gradient_accumulation_steps"])

    def trl_arguments(self) -> dict[str, int]:
        return {"per_device_train_batch_size": self.episodes_per_pass,
                "gradient_accumulation_steps": self.accumulation_steps}


def scoring_chunk_rows(rows: int, episodes_per_pass: int, passes: int) -> int:
    """Rows a no-gradient scoring forward (reference, old policy) takes at once: as many as one loss pass
    holds, i.e. the step's rows over its passes, an episode's extra sequences and the blank rows included
    (there are enough blanks to make the rows a multiple of the passes). TRL chunks these forwards by
    `per_device_train_batch_size` episodes, which under a context strategy cuts an episode's sequences
    and a group's episodes apart, so the shared-prefix tree over a reference chunk shared less than the
    loss pass's (benchmarks/PREFIX_TREE.md). A chunk holds no more than a loss pass, and no gradients."""
    return max(episodes_per_pass, -(-rows // max(passes, 1)))


def trim_padding(inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` (one micro-batch of TRL's `_compute_loss`) without the trailing completion columns that
    no row uses: every tensor whose second dimension is the completion length is cut to the last column
    any row's `completion_mask` keeps. The loss is unchanged (cut columns are masked everywhere, and a
    causal model's earlier positions never see later ones). Prompt tensors are left alone: prompts are
    padded on the left, and cutting there would move the positions of the real tokens."""
    mask = inputs.get("completion_mask")
    if mask is None or mask.dim() != 2 or mask.shape[1] == 0:
        return inputs
    width = mask.shape[1]
    used = mask.any(dim=0).nonzero()
    keep = int(used[-1]) + 1 if used.numel() else 1
    if keep >= width:
        return inputs
    return {
        key: value[:, :keep] if _per_completion_token(key, value, width) else value
        for key, value in inputs.items()
    }


def keep_prompts_together(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TRL's shuffled micro-batches of one generation batch, split again with the rows of one group next to
    each other: the same rows, as many micro-batches of the same size. A row's group is its `group_ids`
    entry (step/batch.py: an episode's several sequences share their episode's group) or, without it,
    its prompt (`prompt_ids` where `prompt_mask` is 1). Groups come in the order TRL's shuffle first
    reached them; within a group, rows in the order of their tokens, so an episode's sequences, and
    episodes that open alike, sit side by side for the shared-prefix tree. Values are treated as TRL's
    `shuffle_sequence_dict`/`split_tensor_dict` treat them: tensors of one dimension or more and lists
    per row, 0-dimensional tensors and None the same in every micro-batch."""
    if len(batches) < 2 or any("prompt_ids" not in b or "prompt_mask" not in b for b in batches):
        return batches
    whole = {key: _joined([b[key] for b in batches]) for key in batches[0]}
    rows = whole["prompt_ids"].size(0)
    if rows % len(batches):
        return batches
    tokens = [ids[m.bool()].tolist() for ids, m in zip(whole["prompt_ids"], whole["prompt_mask"])]
    groups = whole["group_ids"].tolist() if "group_ids" in whole else [tuple(t) for t in tokens]
    if "completion_ids" in whole and "completion_mask" in whole:
        tokens = [t + ids[m.bool()].tolist() for t, ids, m in zip(tokens, whole["completion_ids"],
                                                                  whole["completion_mask"])]
    rank: dict[Any, int] = {}
    for group in groups:
        rank.setdefault(group, len(rank))
    order = sorted(range(rows), key=lambda i: (rank[groups[i]], tokens[i]))
    size = rows // len(batches)
    return [{key: _rows(value, order[i * size:(i + 1) * size]) for key, value in whole.items()}
            for i in range(len(batches))]


def _joined(values: list[Any]) -> Any:
    first = values[0]
    if first is None or (isinstance(first, torch.Tensor) and first.dim() == 0):
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(values)
    return [item for value in values for item in value]


def _rows(value: Any, index: list[int]) -> Any:
    if value is None or (isinstance(value, torch.Tensor) and value.dim() == 0):
        return value
    if isinstance(value, torch.Tensor):
        return value[torch.tensor(index, device=value.device)]
    return [value[i] for i in index]


def _per_completion_token(key: str, value: Any, width: int) -> bool:
    return (not key.startswith("prompt") and hasattr(value, "dim") and value.dim() >= 2
            and value.shape[1] == width)
