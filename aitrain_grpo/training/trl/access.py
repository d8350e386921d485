"""Every private attribute, method or key of TRL's `GRPOTrainer` (and transformers' `Trainer`) this package
reads, calls or sets outside the overrides themselves (trl/hooks.py), behind one named function each.

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
- weight sync: where TRL moves the weights (CUDA), its engine's `sync_weights` (`push_weights_through_trl`);
  `use_vllm`, which the trainer turns on itself where this package moves them (trl/hooks.py
  `use_importance_sampling`), so TRL's loss applies the importance-sampling weights the step computes;
- playing steps ahead (rollout/async_steps.py): `_get_train_sampler`;
- checkpoints (run/checkpoints.py): `_save_checkpoint` called outside the training loop, and TRL's
  `RepeatSampler` (its `shuffle`, `seed`, `generator`, `num_samples`, and for the curriculum its batch
  shape `batch_size`, `repeat_count`, `mini_repeat_count`), which run/checkpoints.py subclasses and
  re-classes in place;
- the shared-prefix loss (step/shared_prefix.py): the accelerator-wrapped model (`model_wrapped`).

Left out: public API (`accelerator`, `args`, `state`, `processing_class`, `num_generations`,
`reward_funcs`, `reward_weights`, `beta`, `ref_model`, the `vllm_importance_sampling_*` settings,
`top_entropy_quantile`, `off_policy_mask_threshold` and TRL's own masks for them, `get_high_entropy_mask` and
`get_off_policy_mask`, callbacks), the batch keys TRL's loss reads (the step makes them: step/batch.py), and the private methods
overridden (trl/hooks.py, pinned by signature in tests/test_trl_hooks.py).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager

from trl.trainer.utils import RepeatSampler  # subclassed by checkpoints.ResumableRepeatSampler

# Trainer methods called here (not overridden): name -> the parameter names they were read with.
PINNED_METHODS = {
    "_get_train_sampler": ("self", "dataset"),
    "_save_checkpoint": ("self", "model", "trial"),
}
# Trainer instance attributes read or set here: each is assigned `self.<name> = ...` by TRL or transformers.
PINNED_ATTRIBUTES = ("use_vllm", "vllm_generation", "model_wrapped")
# Attributes of TRL's `VLLMGeneration` (`trainer.vllm_generation`) read here.
PINNED_VLLM_GENERATION = ("llm", "tp_group", "tensor_parallel_size")
# Attributes of TRL's `RepeatSampler` that checkpoints.ResumableRepeatSampler reads.
PINNED_SAMPLER = ("shuffle", "seed", "generator", "num_samples", "batch_size", "repeat_count", "mini_repeat_count")
# TRL functions called here: dotted name -> the leading parameter names passed.
PINNED_FUNCTIONS = {
    "trl.models.unwrap_model_for_generation": ("model", "accelerator", "gather_deepspeed3_params"),
}

__all__ = ["RepeatSampler", "generation_handles", "model_for_generation", "save_checkpoint",
           "push_weights_through_trl", "train_sampler", "wrapped_model"]


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


def push_weights_through_trl(trainer) -> None:
    """TRL's engine moves the trainer's weights into vLLM (colocated on CUDA, or a server over NCCL)."""
    trainer.vllm_generation.sync_weights()


# ------------------------------------------------------------------------------------------- data


def train_sampler(trainer, dataset):
    """The sampler TRL's training data loader draws from (run/checkpoints.py makes its order resumable)."""
    return trainer._get_train_sampler(dataset)


def wrapped_model(trainer):
    """The model as the accelerator wrapped it (the plain model before wrapping)."""
    return getattr(trainer, "model_wrapped", None) or trainer.model


# -------------------------------------------------------------------------------------- checkpoints


def save_checkpoint(trainer) -> None:
    """Save the current step's checkpoint outside the training loop, through the trainer's `_save_checkpoint`
    (so the atomic override in trl/hooks.py writes it)."""
    trainer._save_checkpoint(trainer.model_wrapped, None)
