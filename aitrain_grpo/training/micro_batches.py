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
token count), in pieces. The old/reference log-probabilities are computed in chunks of M too.

Each micro-batch arrives padded to the longest episode of the whole generation batch; `trim_padding` cuts
the completion columns no episode of the micro-batch uses, so a short micro-batch costs its own length.

Left out: choosing M from a measurement of free memory at run time (the default is a constant measured in
benchmarks/MEMORY.md; `memory_check` warns when the estimate does not fit) and token-budget packing.
"""

from __future__ import annotations

from typing import Any

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


def _per_completion_token(key: str, value: Any, width: int) -> bool:
    return (not key.startswith("prompt") and hasattr(value, "dim") and value.dim() >= 2
            and value.shape[1] == width)
