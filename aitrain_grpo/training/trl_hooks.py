"""Every private method of TRL's `GRPOTrainer` (and transformers' `Trainer`) this package overrides, in
one place, each with why. Read from trl 1.16.0 with transformers 5.17 and 5.23; `PINNED` holds the
parameter names each was read with, and tests/test_trl_hooks.py fails naming the method when TRL or
transformers change one (then re-read that method before raising the pin).

What each override does lives in the module of its concern; the hooks only call it:
- `_generate_and_score_completions`: hands the batch's dataset rows to the rollout first (TRL gives
  `rollout_func` only the prompts; an episode needs its row), then after TRL's scoring adds the
  share of importance-sampling-masked tokens to the step's metrics (async_rollout.py), the turn
  credit of `--rl-advantage turn` to the batch (turn_credit.py), and a row for each sequence an
  episode played before its last, with its episode's advantage (segments.py).
- `_generate`: with weights synced by this package (generation.py), marks TRL's own push before each
  rollout as done, so TRL does not push them a second time.
- `_compute_loss`: per micro-batch, cuts padding no row uses (micro_batches.py), makes the advantages
  per token for turn credit (turn_credit.py), and takes dropped groups' all-masked rows out of the loss
  and its normalisation (groups.py); then TRL's own loss.
- `_get_per_token_logps_and_entropies` (the loss pass and the old/reference log-prob passes): each
  distinct prompt of a chunk forwarded once and its episodes' continuations on it, where the model
  allows and it pays (shared_prefix.py, `--shared-prefix-loss`).
- `_prepare_inputs`: after TRL shuffles a new generation batch into micro-batches, the episodes of one
  prompt are put next to each other while the shared-prefix loss is on, so a micro-batch holds whole
  groups to share (shared_prefix.py, micro_batches.py).
- `_get_train_sampler`: TRL's sampler re-classed so its order after a resume is the uninterrupted
  run's (checkpoints.py), and with `--rl-curriculum pools` so the curriculum draws its batches
  (curriculum.py), which `_generate_and_score_completions` feeds each scored batch's rewards.
- `_get_output_dir`, `_save_checkpoint`: checkpoints written into a staging folder and renamed into
  place when whole, with the run's own state (checkpoints.py); a signal waits for the write (signals.py).
- `_load_optimizer_and_scheduler`: on resume, several CPU processes load the optimizer state onto
  `cpu`, not `cpu:<rank>`, which torch cannot restore to (checkpoints.py).

And one private module function, replaced in its module (`PINNED_FUNCTIONS`, `replace_trl_functions`):
- `trl.trainer.utils._use_triton`: answers True for a CPU, so TRL's fused LM head scores only the
  completion positions there too, as it does on CUDA (lm_head.py).

Left out: public methods and callbacks (`train`, `log`; TrainerCallback events), which are stable API,
and the private attributes and methods read or set without overriding them (trl_access.py, pinned by
tests/test_trl_access.py).
"""

from __future__ import annotations

from aitrain_grpo.training.async_rollout import masked_share_metrics
from aitrain_grpo.training.checkpoints import plain_cpu_device, resumable_sampler, save_checkpoint_atomically
from aitrain_grpo.training.curriculum import curriculum_sampler, record_groups
from aitrain_grpo.training.groups import without_masked_rows
from aitrain_grpo.training.lm_head import scoring_labelled_positions
from aitrain_grpo.training.micro_batches import trim_padding
from aitrain_grpo.training.segments import with_earlier_sequences
from aitrain_grpo.training.shared_prefix import group_micro_batches, shared_logps
from aitrain_grpo.training.signals import uninterrupted
from aitrain_grpo.training.trl_access import mark_weights_pushed
from aitrain_grpo.training.turn_credit import attach_turn_advantages, with_turn_advantages

# Method -> the parameter names it was read with (trl 1.16.0; transformers 5.17 and 5.23 for Trainer's).
PINNED = {
    "_generate_and_score_completions": ("self", "inputs"),
    "_generate": ("self", "prompts"),
    "_compute_loss": ("self", "model", "inputs"),
    "_get_per_token_logps_and_entropies": (
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
        "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
        "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids"),
    "_prepare_inputs": ("self", "generation_batch"),
    "_get_train_sampler": ("self", "dataset"),
    "_get_output_dir": ("self", "trial"),
    "_save_checkpoint": ("self", "model", "trial"),
    "_load_optimizer_and_scheduler": ("self", "checkpoint"),
}

# Module function -> the parameter names it was read with (trl 1.16.0), replaced by replace_trl_functions.
PINNED_FUNCTIONS = {
    "trl.trainer.utils._use_triton": ("device",),
}


def replace_trl_functions() -> None:
    """Install the PINNED_FUNCTIONS replacements in their modules (idempotent; read at call time)."""
    import trl.trainer.utils as utils

    utils._use_triton = scoring_labelled_positions(utils._use_triton)


class TRLHooks:
    """Mixin placed before `GRPOTrainer`. The trainer sets `rollout`, `step_metrics` (the run's metrics
    sink), `drop_masked_rows` (leave rows whose loss mask is all zero out of the loss: --rl-zero-std-groups
    drop/refill) and `external_weight_sync` (this package, not TRL, moves the weights into vLLM)."""

    drop_masked_rows = False
    external_weight_sync = False
    _staging_dir = None  # a checkpoint being written (checkpoints.py)

    def _generate_and_score_completions(self, inputs):
        self.rollout.take_rows(inputs)
        output = super()._generate_and_score_completions(inputs)
        self.step_metrics.update(masked_share_metrics(self, output))  # the run's metrics sink
        self.step_metrics.update(record_groups(self))  # --rl-curriculum pools (curriculum.py)
        # TRL leaves the rollout's per-sample extra fields in `inputs`: turn credit joins the batch here,
        # then each episode's earlier sequences, scored by TRL's own log-probability pass.
        output = attach_turn_advantages(output, inputs)
        return with_earlier_sequences(self, output, inputs, lambda model, ids, mask, keep, size: (
            self._get_per_token_logps_and_entropies(model, ids, mask, keep, batch_size=size)[0]))

    def _generate(self, prompts):
        if self.external_weight_sync:
            mark_weights_pushed(self)  # marks TRL's weights as pushed: ours are
        return super()._generate(prompts)

    def _compute_loss(self, model, inputs):
        inputs = trim_padding(inputs)
        inputs = with_turn_advantages(inputs)
        if self.drop_masked_rows:
            inputs = without_masked_rows(inputs)
        return super()._compute_loss(model, inputs)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **extras):
        def plain(ids, mask, size):
            return super(TRLHooks, self)._get_per_token_logps_and_entropies(
                model, ids, mask, logits_to_keep, batch_size=size, compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss, **extras)

        return shared_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size,
                            compute_entropy, compute_aux_loss, extras, plain)

    def _prepare_inputs(self, generation_batch):
        return group_micro_batches(self, super()._prepare_inputs(generation_batch))

    def _get_train_sampler(self, dataset=None):
        return curriculum_sampler(self, resumable_sampler(super()._get_train_sampler(dataset)))

    def _get_output_dir(self, trial):
        if self._staging_dir is not None:
            return str(self._staging_dir)
        return super()._get_output_dir(trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        with plain_cpu_device(self.args):
            return super()._load_optimizer_and_scheduler(checkpoint)

    def _save_checkpoint(self, model, trial):
        with uninterrupted():  # a signal lets the write finish (signals.py)
            save_checkpoint_atomically(self, trial, lambda: super(TRLHooks, self)._save_checkpoint(model, trial),
                                       run_dir=super()._get_output_dir(trial))
