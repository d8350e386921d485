"""Every private attribute, method or key of TRL's `GRPOTrainer` (and transformers' `Trainer`) this package
reads, calls or sets outside the overrides themselves (trl_hooks.py), behind one named function each.

Why one module: these names are not TRL's API and change without notice. Here each is written once,
`PINNED_*` lists them, and tests/test_trl_access.py fails naming the one TRL 1.16.0 (transformers 5.17)
no longer has, instead of a run failing mid-step. The same test checks that no other module of the
package touches them, and that nothing outside training/ and sft/ imports TRL: the engine is handed
plain objects (`generation_handles`: a callable opening the model to generate with, or the vLLM engine
TRL built), never the trainer.

The touches, by who needs them:
- the engine's backends (`generation_handles`): TRL's `unwrap_model_for_generation` around the
  trainer's `model_wrapped` (hf), and TRL's colocated engine `vllm_generation.llm` with its
  tensor-parallel group (vllm_colocate);
- weight sync this package does itself (generation.py, trainer.py): `use_vllm` turned on after TRL's
  `__init__` built nothing, so TRL applies its importance-sampling correction
  (`turn_on_importance_sampling`), and `_last_loaded_step` marking TRL's own push as done
  (`mark_weights_pushed`);
- playing steps ahead (async_rollout.py): `_get_train_sampler`, `_train_batch_size`, and the keys of
  TRL's scored batch (`importance_weights`);
- checkpoints (checkpoints.py): transformers' `_get_output_dir` and `_save_checkpoint` called outside
  the training loop, and TRL's `RepeatSampler` (its `shuffle`, `seed`, `generator`, `num_samples`),
  which checkpoints.py subclasses and re-classes in place;
- the shared-prefix loss (shared_prefix.py): TRL's micro-batch buffer `_buffered_inputs` and its step
  counter `_step`;
- the difficulty curriculum (curriculum.py): the rewards of the batch TRL scored last, from all processes
  (its completion log `_logs`), and the `RepeatSampler`'s batch shape (`batch_size`, `repeat_count`,
  `mini_repeat_count`).

Left out: public API (`accelerator`, `args`, `state`, `processing_class`, `num_generations`, callbacks),
the batch keys the loss-side modules read from TRL's inputs (groups, micro_batches, turn_credit,
shared_prefix; their tests run TRL's own step), and the private methods overridden (trl_hooks.py, pinned
by signature in tests/test_trl_hooks.py).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager

from trl.trainer.utils import RepeatSampler  # subclassed by checkpoints.ResumableRepeatSampler

# Trainer methods called here (not overridden): name -> the parameter names they were read with.
PINNED_METHODS = {
    "_get_train_sampler": ("self", "dataset"),
    "_get_output_dir": ("self", "trial"),
    "_save_checkpoint": ("self", "model", "trial"),
}
# Trainer instance attributes read or set here: each is assigned `self.<name> = ...` by TRL or transformers.
PINNED_ATTRIBUTES = ("_train_batch_size", "_last_loaded_step", "_buffered_inputs", "_step", "use_vllm",
                     "vllm_generation", "model_wrapped", "_logs")
# Attributes of TRL's `VLLMGeneration` (`trainer.vllm_generation`) read here.
PINNED_VLLM_GENERATION = ("llm", "tp_group", "tensor_parallel_size")
# Attributes of TRL's `RepeatSampler` that checkpoints.ResumableRepeatSampler reads.
PINNED_SAMPLER = ("shuffle", "seed", "generator", "num_samples", "batch_size", "repeat_count", "mini_repeat_count")
# Keys of the batch TRL's `_generate_and_score_completions` returns, read by `importance_weights`.
PINNED_OUTPUT_KEYS = ("completion_mask", "tool_mask", "importance_sampling_ratio")
# TRL functions called here: dotted name -> the leading parameter names passed.
PINNED_FUNCTIONS = {
    "trl.models.unwrap_model_for_generation": ("model", "accelerator", "gather_deepspeed3_params"),
}

__all__ = ["RepeatSampler", "buffered_micro_batches", "generation_handles", "importance_weights",
           "last_rewards", "mark_weights_pushed", "model_for_generation", "run_output_dir", "save_checkpoint", "set_buffered_micro_batches",
           "step_in_generation", "train_batch_size", "train_sampler", "turn_on_importance_sampling", "wrapped_model"]


# ------------------------------------------------------------------------------- generation (engine)


def model_for_generation(trainer) -> Callable[[], ContextManager]:
    """A callable opening the model to sample with: TRL's `unwrap_model_for_generation` around the wrapped
    model (DeepSpeed ZeRO-3 parameters gathered as `ds3_gather_for_generation` says)."""
    from trl.models import unwrap_model_for_generation

    def open_model():
        return unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                           gather_deepspeed3_params=trainer.args.ds3_gather_for_generation)

    return open_model


def colocated_vllm(trainer) -> dict[str, Any]:
    """The in-process vLLM engine TRL built (`llm`) and its tensor-parallel group and size."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None or getattr(generation, "llm", None) is None:
        raise RuntimeError("the trainer has no colocated vLLM engine; set use_vllm=True and vllm_mode='colocate'")
    return {"llm": generation.llm, "tp_group": getattr(generation, "tp_group", None),
            "tp_size": getattr(generation, "tensor_parallel_size", 1)}


def generation_handles(trainer, kind: str) -> dict[str, Any]:
    """What `engine.backends.choice.build_backend(kind, ...)` needs of the trainer, as plain objects: for
    "hf" the model opener, tokenizer and device; for "vllm_colocate" TRL's engine; nothing for a server."""
    if kind == "hf":
        return {"open_model": model_for_generation(trainer), "tokenizer": trainer.processing_class,
                "device": trainer.accelerator.device}
    if kind == "vllm_colocate":
        return colocated_vllm(trainer)
    return {}


def turn_on_importance_sampling(trainer) -> None:
    """TRL gates its importance-sampling correction on `use_vllm`: set after TRL's `__init__` built no vLLM
    of its own (this package moves the weights), so the correction runs. `mark_weights_pushed` then keeps
    TRL from looking for an engine to push to."""
    trainer.use_vllm = True


def mark_weights_pushed(trainer) -> None:
    """Mark the weights as pushed for this step, so TRL's `_generate` does not push them itself."""
    trainer._last_loaded_step = trainer.state.global_step


# ------------------------------------------------------------------------------ data and scored batch


def train_sampler(trainer, dataset):
    """The sampler TRL's training data loader draws from (checkpoints.py makes its order resumable)."""
    return trainer._get_train_sampler(dataset)


def train_batch_size(trainer) -> int:
    """transformers' per-device batch size of one data-loader batch (TRL's micro-batch)."""
    return trainer._train_batch_size


def importance_weights(output: dict[str, Any]):
    """From a batch TRL scored: (its importance-sampling ratio, the mask of model tokens), or (None, None)
    when the correction is off."""
    ratio = output.get("importance_sampling_ratio")
    if ratio is None:
        return None, None
    mask = output["completion_mask"]
    if "tool_mask" in output:
        mask = mask * output["tool_mask"]
    return ratio, mask


def last_rewards(trainer) -> list[float]:
    """The reward of each episode of the generation batch TRL scored last, every process's in the sampler's
    order (TRL gathers them): its reward functions weighted and summed as TRL does, NaN where none scored.
    Read from TRL's completion log, which holds exactly one generation batch."""
    import math

    columns = [list(trainer._logs["rewards"][name]) for name in trainer.reward_func_names]
    weights = [float(w) for w in trainer.reward_weights]
    rewards = []
    for values in zip(*columns):
        scored = [w * v for w, v in zip(weights, values) if not math.isnan(v)]
        rewards.append(sum(scored) if scored else math.nan)
    return rewards


def buffered_micro_batches(trainer):
    """The micro-batches TRL split its latest generation batch into (None before the first)."""
    return getattr(trainer, "_buffered_inputs", None)


def set_buffered_micro_batches(trainer, batches) -> None:
    trainer._buffered_inputs = batches


def step_in_generation(trainer) -> int:
    """Which of the buffered micro-batches TRL hands out now."""
    return trainer._step % trainer.args.steps_per_generation


def wrapped_model(trainer):
    """The model as the accelerator wrapped it (the plain model before wrapping)."""
    return getattr(trainer, "model_wrapped", None) or trainer.model


# -------------------------------------------------------------------------------------- checkpoints


def run_output_dir(trainer) -> str:
    """transformers' own `_get_output_dir`: the run's folder, not the staging folder trl_hooks.py's override
    points at while a checkpoint is written."""
    from trl import GRPOTrainer

    return GRPOTrainer._get_output_dir(trainer, None)


def save_checkpoint(trainer) -> None:
    """Save the current step's checkpoint outside the training loop, through the trainer's `_save_checkpoint`
    (so the atomic override in trl_hooks.py writes it)."""
    trainer._save_checkpoint(trainer.model_wrapped, None)
