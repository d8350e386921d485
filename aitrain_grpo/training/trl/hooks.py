"""Every private method of TRL's `GRPOTrainer` (and transformers' `Trainer`) this package overrides, in
one place, each with why. Read from trl 1.16.0 with transformers 5.17 and 5.23; `PINNED` holds the
parameter names each was read with, and tests/test_trl_hooks.py fails naming the method when TRL or
transformers change one (then re-read that method before raising the pin).

The step is ours (step/flow.py); the hooks are where TRL's loop hands over to it:
- `_prepare_inputs`: transformers' loop asks for each micro-batch. At a step's first, the step's
  generation batch is made by `generation_batch` (rollout, rewards, advantages, typed records, TRL's
  tensors, reference forwards) and split into micro-batches (step/loss.py); the rest are handed out in
  turn. This replaces TRL's `_generate_and_score_completions`, `_generate` and its micro-batch buffer:
  none of them runs.
- `_compute_loss`: per micro-batch, padding no row uses cut and dropped groups' rows taken out
  (step/loss.py); importance weights from the loss pass where they come from there, and the shares of
  tokens TRL's entropy and off-policy masks keep (step/loss.py `token_mask_shares`); then TRL's loss.
- `_get_per_token_logps_and_entropies` (the loss pass and the reference/old passes): each distinct
  prompt of a chunk forwarded once and its episodes' continuations on it, where the model allows and it
  pays (step/shared_prefix.py, `--shared-prefix-loss`); the loss pass's log-probabilities feed the
  importance weights.
- `_get_train_sampler`: TRL's sampler re-classed so its order after a resume is the uninterrupted
  run's (run/checkpoints.py), and with `--rl-curriculum pools` so the curriculum draws its batches
  (rollout/curriculum.py).
- `_save_checkpoint`: checkpoints written into a staging folder and renamed into place when whole,
  with the run's own state (run/checkpoints.py); a signal waits for the write (run/signals.py).
- `_load_optimizer_and_scheduler`: on resume, several CPU processes load the optimizer state onto
  `cpu`, not `cpu:<rank>`, which torch cannot restore to (run/checkpoints.py).

And one private module function, replaced for the trainer's `train()` only and put back after
(`PINNED_FUNCTIONS`, `trl_functions_replaced`):
- `trl.trainer.utils._use_triton`: answers True for a CPU, so TRL's fused LM head scores only the
  completion positions there too, as it does on CUDA (trl/lm_head.py).

Left out: public methods and callbacks (`train`, `log`, `compute_loss`; TrainerCallback events), which
are stable API, and the private attributes read or set without overriding them (trl/access.py, pinned by
tests/test_trl_access.py).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from aitrain_grpo.training.run.checkpoints import plain_cpu_device, resumable_sampler, save_checkpoint_atomically
from aitrain_grpo.training.rollout.curriculum import curriculum_sampler
from aitrain_grpo.training.trl.lm_head import scoring_labelled_positions
from aitrain_grpo.training.run.context import RunContext
from aitrain_grpo.training.step.shared_prefix import shares_micro_batches, shared_logps
from aitrain_grpo.training.run.signals import uninterrupted
from aitrain_grpo.training.step.flow import generation_batch, importance_from_loss_pass
from aitrain_grpo.training.step.loss import (importance_from_logps, loss_inputs, split_micro_batches,
                                              token_mask_shares, without_group_ids)
from aitrain_grpo.training.trl.access import wrapped_model

# Method -> the parameter names it was read with (trl 1.16.0; transformers 5.17 and 5.23 for Trainer's).
PINNED = {
    "_prepare_inputs": ("self", "generation_batch"),
    "_compute_loss": ("self", "model", "inputs"),
    "_get_per_token_logps_and_entropies": (
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
        "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
        "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids"),
    "_get_train_sampler": ("self", "dataset"),
    "_save_checkpoint": ("self", "model", "trial"),
    "_load_optimizer_and_scheduler": ("self", "checkpoint"),
}

# Module function -> the parameter names it was read with (trl 1.16.0), replaced by trl_functions_replaced.
PINNED_FUNCTIONS = {
    "trl.trainer.utils._use_triton": ("device",),
}


@contextlib.contextmanager
def trl_functions_replaced() -> Iterator[None]:
    """The PINNED_FUNCTIONS replacements installed in their modules for the block, then put back."""
    import trl.trainer.utils as utils

    original = utils._use_triton
    utils._use_triton = scoring_labelled_positions(original)
    try:
        yield
    finally:
        utils._use_triton = original


class TRLHooks:
    """Mixin placed before `GRPOTrainer`. The trainer sets `run` (the run's `RunContext`) and
    `drop_masked_rows` (leave rows whose loss mask is all zero out of the loss: --rl-zero-std-groups
    drop/refill)."""

    run: RunContext
    drop_masked_rows = False
    _micro_batches: list | None = None  # this step's micro-batches, handed out in turn
    _micro_step = 0  # micro-batches handed out, counted from step 0 (a resume counts on from its step)
    _awaiting_weights: dict | None = None  # the micro-batch whose importance weights the loss pass gives
    _loss_pass_inputs: dict | None = None  # the micro-batch in TRL's loss now, for its masks' shares

    def use_importance_sampling(self) -> None:
        """TRL's loss applies the importance-sampling weights only with `use_vllm` set: set after TRL's
        `__init__` built no vLLM of its own, where this package moves the weights into vLLM."""
        self.use_vllm = True

    def _prepare_inputs(self, generation_batch_rows):
        if not self.model.training:  # an evaluation batch: scored whole, no buffering
            return without_group_ids(generation_batch(self, self.run, list(generation_batch_rows)))
        steps = self.args.steps_per_generation
        if self._micro_batches is None:  # the run's first micro-batch: count on from the step it starts at (a
            # resume between a batch's --rl-num-iterations updates plays that batch's prompts again, and the
            # batches after it start where they would have)
            self._micro_step = self.state.global_step * self.args.gradient_accumulation_steps
        if self._micro_step % (steps * self.num_iterations) == 0 or self._micro_batches is None:
            batch = generation_batch(self, self.run, list(generation_batch_rows))
            self._micro_batches = split_micro_batches(batch, steps, together=shares_micro_batches(
                self.accelerator, self.run.shared_prefix, self.model, wrapped_model(self)))
        inputs = self._micro_batches[self._micro_step % steps]
        self._micro_step += 1
        return inputs

    def _compute_loss(self, model, inputs):
        inputs = loss_inputs(inputs, drop_masked_rows=self.drop_masked_rows)
        if "importance_sampling_ratio" not in inputs and importance_from_loss_pass(self):
            inputs = dict(inputs)  # the weights go into this pass's own copy, not the step's buffered micro-batch
            self._awaiting_weights = inputs
        self._loss_pass_inputs = inputs
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._awaiting_weights = self._loss_pass_inputs = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **extras):
        def plain(ids, mask, size, on=None):
            return super(TRLHooks, self)._get_per_token_logps_and_entropies(
                model if on is None else on, ids, mask, logits_to_keep, batch_size=size, compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss, **extras)

        out = shared_logps(self.accelerator, self.run.shared_prefix, model, input_ids, attention_mask, logits_to_keep,
                           batch_size, compute_entropy, compute_aux_loss, extras, plain)
        if compute_entropy and self._awaiting_weights is not None:  # the loss pass (only it asks for entropies)
            inputs, self._awaiting_weights = self._awaiting_weights, None
            self.run.metrics.update(importance_from_logps(
                inputs, out[0], mode=self.vllm_importance_sampling_mode, low=self.vllm_importance_sampling_clip_min,
                high=self.vllm_importance_sampling_clip_max, gather=self.accelerator.gather))
        if compute_entropy and self._loss_pass_inputs is not None and self.model.training:
            inputs, self._loss_pass_inputs = self._loss_pass_inputs, None
            self.run.metrics.update(token_mask_shares(self, inputs, out[0], out[1]))
        return out

    def _get_train_sampler(self, dataset=None):
        return curriculum_sampler(self.run, resumable_sampler(super()._get_train_sampler(dataset)), self.train_dataset)

    def _load_optimizer_and_scheduler(self, checkpoint):
        with plain_cpu_device(self.args):
            return super()._load_optimizer_and_scheduler(checkpoint)

    def _save_checkpoint(self, model, trial):
        def save_into(staging):  # transformers writes into args.output_dir: the staging folder, for this save only
            run_dir, self.args.output_dir = self.args.output_dir, str(staging)
            try:
                super(TRLHooks, self)._save_checkpoint(model, trial)
            finally:
                self.args.output_dir = run_dir

        with uninterrupted():  # a signal lets the write finish (run/signals.py)
            save_checkpoint_atomically(self, self.run, save_into)
