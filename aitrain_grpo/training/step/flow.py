"""The step, read top to bottom: one generation batch from dataset rows to TRL's loss inputs.

`generation_batch(trainer, run, rows)` is the step up to the loss; the trainer (training/trainer.py)
calls it at the start of every step, splits its result into micro-batches and hands them to TRL's loss:

1. rollout: the episodes of `rows` played (training/rollout/training_rollout.py; `--rl-zero-std-groups` there);
2. rewards: every reward function on the episodes (step/rewards.py), gathered from every process;
3. advantages: group-normalised, TRL's rule (step/advantages.py); the curriculum records the groups;
4. records: one typed record per trained sequence (step/records.py): advantages, turn credit, dropped
   groups and an episode's several sequences all settled on the rollout side;
5. batch: the records as TRL's tensors, blank rows where processes differ (step/batch.py);
6. reference and old log-probabilities, and vLLM's importance weights where the loss pass cannot give
   them (step/scoring.py), each forward timed as `ref_logprobs`;

then, outside this function and in transformers' loop: 7. the loss passes, one per micro-batch (TRL's
`_compute_loss`, with this package's loss-side rules: step/loss.py), timed as `loss_forward_backward`;
8. the optimizer step, timed as `optimizer_step` (runlog/step_timing.py marks both from the loop's
events). Stages 2 to 5 are the `score` phase.

Metrics (the run's sink): `reward`, `reward_std`, `rewards/<name>/mean|std`, `frac_reward_zero_std`,
`completions/mean_length|min_length|max_length` (model tokens an episode), `num_tokens`,
`sequences/per_episode|extra_rows|blank_rows`, `groups/masked_truncated_frac` (`--rl-mask-truncated`: the
share of the step's episodes it took out of the loss), and vLLM's `sampling/*` (step/scoring.py).

Left out: multimodal rows (refused), TRL's `mask_truncated_completions` (`--rl-mask-truncated` takes the
truncated episodes out at step 4 instead: an episode's truncation is its stop reason, not a missing EOS) and
`pad_to_multiple_of` (no run sets it), and TRL's completion table (`log_completions`: the run writes episodes.jsonl instead).
"""

from __future__ import annotations

from typing import Any

import torch

from aitrain_grpo.training.step.advantages import group_advantages
from aitrain_grpo.training.step.batch import blank_record, blank_rows_needed, loss_mask, trl_batch
from aitrain_grpo.training.step.micro_batches import scoring_chunk_rows
from aitrain_grpo.training.step.records import sequence_records
from aitrain_grpo.training.step.rewards import call_reward_functions, decoded_completions
from aitrain_grpo.training.step.scoring import importance_ratio, sampling_metrics


def generation_batch(trainer, run, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The step's batch for TRL's loss (see the module docstring). Every process calls it (it gathers)."""
    accelerator, args, clock = trainer.accelerator, trainer.args, run.timing.clock
    training = trainer.model.training
    group_size = trainer.num_generations if training else trainer.num_generations_eval
    device = accelerator.device

    # 1. rollout
    grouped = run.rollout.play(rows, trainer)
    batch = grouped.batch

    # 2. rewards, from every process
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    played_rows = [episode.row for episode in batch.episodes]
    completions = decoded_completions(tokenizer, [t.completion_ids for t in batch.traces],
                                      conversational=isinstance(played_rows[0].get("prompt"), list))
    logged: dict[str, list[float]] = {}
    local_rewards = call_reward_functions(trainer.reward_funcs, trainer.reward_func_names, played_rows, completions,
                                          [t.completion_ids for t in batch.traces], {"episode_score": batch.scores},
                                          trainer.state, logged)
    rewards_per_func = accelerator.gather(local_rewards.to(device))

    # 3. advantages
    scored = group_advantages(rewards_per_func, trainer.reward_weights, group_size,
                              scale=trainer.scale_rewards, aggregation=trainer.multi_objective_aggregation)
    mine = slice(accelerator.process_index * len(rows), (accelerator.process_index + 1) * len(rows))
    if training and run.curriculum is not None:  # --rl-curriculum pools (rollout/curriculum.py)
        run.metrics.update(run.curriculum.record(scored.rewards.tolist(), group_size))

    # 4. records
    masked: set[int] = set()
    if training and run.config.rl_mask_truncated:  # DAPO's overlong filter: truncated episodes leave the loss
        masked = {i for i, episode in enumerate(batch.episodes) if episode.truncated}
        run.metrics.update({"groups/masked_truncated_frac": len(masked) / max(len(batch.episodes), 1)})
    records = sequence_records(batch, scored.advantages[mine].tolist(), group_size, dropped=grouped.dropped | masked,
                               turn_credit=run.config.rl_advantage == "turn",
                               weight_versions=grouped.weight_versions)

    # 5. batch, with blank rows where an episode of several sequences added rows
    episodes = len(batch.episodes)
    counts = torch.tensor([[len(records) - episodes, sum(r.model_tokens for r in records[episodes:]), episodes]],
                          device=device)
    totals = accelerator.gather(counts).view(-1, 3)
    steps = args.steps_per_generation if training else 1
    blanks = blank_rows_needed(episodes, len(records) - episodes, int(totals[:, 0].max()), steps)
    anchor = records[0].prompt_ids[-1]
    out = trl_batch(records + [blank_record(anchor)] * blanks, _pad_id(tokenizer), device)
    mask = loss_mask(out)
    out["num_items_in_batch"] = accelerator.gather(mask[:episodes].sum()).sum() + totals[:, 1].sum().to(device)

    # 6. reference and old log-probabilities, importance weights (no gradients)
    out.update(scoring_passes(trainer, out, training, clock))

    if training:
        trainer.state.num_input_tokens_seen += accelerator.gather(
            (out["prompt_mask"][:episodes].sum() + mask[:episodes].sum()).reshape(1)).sum().item()
        run.metrics.update(step_metrics(trainer, scored, rewards_per_func, out, totals,
                                        len(records) - episodes + blanks, logged))
    return out


def importance_from_loss_pass(trainer) -> bool:
    """vLLM sampled the tokens and the batch trains in one optimizer step: the loss pass's own
    log-probabilities (detached) are the old policy's, so no second forward (step/scoring.py)."""
    return importance_sampling_on(trainer.use_vllm, trainer.vllm_importance_sampling_correction) and \
        not batch_reused(trainer.args, trainer.num_iterations)


def importance_sampling_on(use_vllm: bool, correction: bool) -> bool:
    """TRL's rule: the correction runs where vLLM sampled (or this package's sync turned it on)."""
    return bool(use_vllm and correction)


def batch_reused(args, num_iterations: int) -> bool:
    """A generation batch trains over more than one optimizer step (TRL's rule for old log-probabilities)."""
    return args.gradient_accumulation_steps % (args.steps_per_generation * num_iterations) != 0


def scoring_passes(trainer, out: dict[str, Any], training: bool, clock) -> dict[str, torch.Tensor]:
    """The old and reference log-probabilities and importance weights `out` needs (step/scoring.py), in
    chunks of a loss pass's rows (`scoring_chunk_rows`); each forward's time is charged to `clock`'s
    `ref_logprobs` phase."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    keep = out["completion_ids"].shape[1]
    args = trainer.args
    size = scoring_chunk_rows(ids.size(0), args.per_device_train_batch_size, args.steps_per_generation) \
        if training else args.per_device_eval_batch_size

    def logps(model):
        with clock.phase("ref_logprobs"):
            return trainer._get_per_token_logps_and_entropies(model, ids, attention, keep, batch_size=size)[0]

    scored: dict[str, torch.Tensor] = {}
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        if batch_reused(trainer.args, trainer.num_iterations):
            scored["old_per_token_logps"] = logps(trainer.model)
            if importance_sampling_on(trainer.use_vllm, trainer.vllm_importance_sampling_correction):
                scored["importance_sampling_ratio"] = importance_ratio(
                    scored["old_per_token_logps"], out["sampling_per_token_logps"], loss_mask(out),
                    mode=trainer.vllm_importance_sampling_mode, low=trainer.vllm_importance_sampling_clip_min,
                    high=trainer.vllm_importance_sampling_clip_max)
        if trainer.beta != 0.0:
            if trainer.ref_model is not None:
                scored["ref_per_token_logps"] = logps(trainer.ref_model)
            else:  # LoRA: the base model, or the adapter loaded as "ref", as TRL does
                model = trainer.accelerator.unwrap_model(trainer.model)
                with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                    scored["ref_per_token_logps"] = logps(trainer.model)
    return scored


def step_metrics(trainer, scored, rewards_per_func: torch.Tensor, out: dict[str, Any], totals: torch.Tensor,
                 rows_past_episodes: int, logged: dict[str, list[float]]) -> dict[str, float]:
    """The step's reward, length and sequence metrics (names as TRL logs its own, where it has them).
    `totals`: per process (extra rows, their model tokens, episodes); `rows_past_episodes`: this
    process's rows after its episodes' last sequences (extra and blank), the same on every process."""
    from trl.trainer.utils import nanstd

    accelerator = trainer.accelerator
    metrics: dict[str, float] = {}
    for i, name in enumerate(trainer.reward_func_names):
        metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        metrics[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
    metrics["reward"] = torch.nanmean(scored.rewards).item()
    metrics["reward_std"] = nanstd(scored.rewards).item()
    metrics["frac_reward_zero_std"] = scored.zero_std.float().mean().item()
    episodes = int(totals[0, 2])
    lengths = accelerator.gather(loss_mask(out)[:episodes].sum(dim=1).float()) if "tool_mask" in out else None
    if lengths is not None and lengths.numel():
        metrics.update({"completions/mean_length": lengths.mean().item(), "completions/min_length": lengths.min().item(),
                        "completions/max_length": lengths.max().item()})
    metrics["num_tokens"] = float(trainer.state.num_input_tokens_seen)
    added, all_episodes = int(totals[:, 0].sum()), int(totals[:, 2].sum())
    metrics["sequences/per_episode"] = (all_episodes + added) / max(all_episodes, 1)
    metrics["sequences/extra_rows"] = float(added)
    metrics["sequences/blank_rows"] = float(totals.shape[0] * rows_past_episodes - added)
    for name, values in logged.items():
        local = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=accelerator.device)
        total, count = accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
        metrics[name] = total / max(count, 1)
    if "importance_sampling_ratio" in out and "old_per_token_logps" in out:
        metrics.update(sampling_metrics(out["importance_sampling_ratio"], out["old_per_token_logps"],
                                        out["sampling_per_token_logps"], loss_mask(out), accelerator.gather))
    return metrics


def _pad_id(tokenizer) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return 0 if pad is None else int(pad)


__all__ = ["batch_reused", "generation_batch", "importance_from_loss_pass", "importance_sampling_on"]
