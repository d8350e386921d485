"""Groups without signal (`--rl-zero-std-groups keep|drop|refill`).

GRPO scores each episode against the others of its group (the `--rl-num-generations` episodes of one
prompt). When every episode of a group scored the same, each advantage is 0: the group teaches the
policy nothing, yet in TRL it still costs a forward and backward pass, still carries the KL and
entropy terms, and still counts in the loss normalisation (tokens for bnpo/dapo/cispo, sequences for
grpo/sapo/luspo, the batch size for dr_grpo), which shrinks the step the informative groups get.

- `keep` (default): TRL's behaviour, unchanged.
- `drop`: the episodes of such groups leave the loss. Their records' `env_mask` is zeroed (so no token
  of theirs counts in the loss, the KL, the entropy bonus or TRL's token count `num_items_in_batch`), their
  earlier sequences (an episode of several) get no record (step/records.py),
  and `without_masked_rows` takes their all-masked rows out of each micro-batch before TRL's loss, so
  the per-sequence and batch-size normalisations count only the groups that are left.
- `refill` (DAPO's dynamic sampling): plays further prompts from the training dataset until the batch
  has as many informative groups as it was handed, replacing the flat groups in place, so TRL still
  gets exactly one completion per prompt it sent. The extra prompts are drawn from the seed and the
  step number alone (a resumed run draws the same ones), at most `max_extra_episodes` episodes a
  step; flat groups still there when that cap is reached are dropped as above.

Metrics: `groups/zero_std_frac` (share of the groups TRL handed over that were flat),
`groups/refill_rollouts` (extra episodes played this step), `groups/dropped_frac` (share of the
returned groups that are out of the loss).

Left out: filtering on anything but score equality (DAPO's overlong filter is `--rl-mask-truncated`, step/flow.py), refilling in eval,
and multimodal inputs in `without_masked_rows` (rows are sliced by their leading dimension).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from aitrain_grpo.engine.rollout import RolloutBatch
from aitrain_grpo.training.step.records import sequences_of

# Scores closer than this count as equal: TRL's advantage is (r - mean) / (std + 1e-4), so a spread
# this small gives advantages of 1e-2 at most, i.e. noise rather than signal.
EQUAL_SCORES = 1e-6


def flat_groups(scores: Sequence[float], group_size: int) -> list[int]:
    """Indexes of the groups (consecutive runs of `group_size` episodes) whose scores are all equal."""
    if len(scores) % group_size:
        raise ValueError(f"{len(scores)} scores do not split into groups of {group_size}")
    flat = []
    for g in range(len(scores) // group_size):
        group = scores[g * group_size:(g + 1) * group_size]
        if max(group) - min(group) <= EQUAL_SCORES:
            flat.append(g)
    return flat


def refill_indices(num_rows: int, seed: int, step: int, round_index: int, count: int) -> list[int]:
    """`count` dataset indexes for a refill round, a function of (seed, step, round) alone."""
    rng = random.Random(f"aitrain-refill/{seed}/{step}/{round_index}")
    if count <= num_rows:
        return rng.sample(range(num_rows), count)
    return [rng.randrange(num_rows) for _ in range(count)]


@dataclass
class GroupedRollout:
    """A rollout after the zero-std policy: the batch to train on and which episodes are out of the loss."""

    batch: RolloutBatch
    dropped: set[int] = field(default_factory=set)  # episode indexes whose tokens leave the loss
    metrics: dict[str, float] = field(default_factory=dict)
    # Per episode, the weight version it was sampled with (async runs: rollout/async_steps.py; else None).
    weight_versions: list[int] | None = None


@dataclass(frozen=True)
class ZeroStdGroups:
    """Applies `--rl-zero-std-groups` to one rollout. `rows_at(indexes)` returns dataset rows for refills."""

    policy: str  # keep | drop | refill
    group_size: int
    seed: int = 0
    max_extra_episodes: int = 0

    def play(
        self,
        play: Callable[[list[dict[str, Any]]], RolloutBatch],
        rows: list[dict[str, Any]],
        *,
        step: int = 0,
        num_dataset_rows: int = 0,
        rows_at: Callable[[list[int]], list[dict[str, Any]]] | None = None,
    ) -> GroupedRollout:
        batch = play(rows)
        if self.policy == "keep":
            return GroupedRollout(batch)
        g = self.group_size
        num_groups = len(batch.episodes) // g
        flat = flat_groups(batch.scores, g)
        metrics = {"groups/zero_std_frac": len(flat) / max(num_groups, 1)}
        extra_episodes = 0
        if self.policy == "refill" and flat and rows_at is not None and num_dataset_rows:
            batch, flat, extra_episodes = self._refill(play, batch, flat, step, num_dataset_rows, rows_at)
            metrics["groups/refill_rollouts"] = float(extra_episodes)
        elif self.policy == "refill":
            metrics["groups/refill_rollouts"] = 0.0
        metrics["groups/dropped_frac"] = len(flat) / max(num_groups, 1)
        dropped = {i for group in flat for i in range(group * g, (group + 1) * g)}
        return GroupedRollout(batch, dropped, metrics)

    def _refill(self, play, batch: RolloutBatch, flat: list[int], step: int, num_rows: int, rows_at):
        """Replace flat groups with informative groups from extra prompts, round by round, within the cap.
        Each round asks for as many groups as are missing, scaled up by the share of flat groups seen so
        far (most of a round would otherwise come back flat again)."""
        g = self.group_size
        episodes, traces = list(batch.episodes), list(batch.traces)
        earlier = [seqs[:-1] for seqs in sequences_of(batch.earlier, batch.traces)]  # each episode's sequences before its last
        waiting = list(flat)  # flat group slots still to fill, in batch order
        played = 0
        seen_groups = len(batch.episodes) // g
        seen_informative = seen_groups - len(flat)
        round_index = 0
        while waiting:
            budget_groups = (self.max_extra_episodes - played) // g
            if budget_groups < 1:
                break
            hit_rate = max(seen_informative / seen_groups, 1 / seen_groups)
            want = min(budget_groups, math.ceil(len(waiting) / hit_rate))
            prompts = rows_at(refill_indices(num_rows, self.seed, step, round_index, want))
            extra = play([row for row in prompts for _ in range(g)])
            played += want * g
            round_index += 1
            extra_flat = set(flat_groups(extra.scores, g))
            seen_groups += want
            seen_informative += want - len(extra_flat)
            batch.generate_seconds += extra.generate_seconds
            batch.env_seconds += extra.env_seconds
            batch.wall_seconds += extra.wall_seconds
            batch.generate_calls += extra.generate_calls
            for source in range(want):
                if source in extra_flat or not waiting:
                    continue
                slot = waiting.pop(0)
                episodes[slot * g:(slot + 1) * g] = extra.episodes[source * g:(source + 1) * g]
                traces[slot * g:(slot + 1) * g] = extra.traces[source * g:(source + 1) * g]
                earlier[slot * g:(slot + 1) * g] = [seqs[:-1] for seqs in sequences_of(extra.earlier, extra.traces)][source * g:(source + 1) * g]
        batch.episodes, batch.traces, batch.earlier = episodes, traces, earlier
        return batch, waiting, played


def without_masked_rows(inputs: dict[str, Any]) -> dict[str, Any]:
    """One micro-batch of TRL's `_compute_loss` without its rows whose loss mask is all zero (the
    dropped groups), so no loss type counts them in its normalisation and they cost no forward pass.
    Applied for `drop` and `refill` only (trl/hooks.py): with `keep`, a row masked out for another
    reason, such as an episode whose reset failed, keeps TRL's treatment. A micro-batch of masked rows
    only is left whole (TRL needs a row to run)."""
    mask = inputs.get("tool_mask")
    if mask is None:
        return inputs
    rows = inputs["completion_ids"].shape[0]
    keep = (mask * inputs["completion_mask"]).sum(-1) > 0
    if not 0 < int(keep.sum()) < rows:
        return inputs
    return {key: value[keep] if hasattr(value, "dim") and value.dim() >= 1 and value.shape[0] == rows else value
            for key, value in inputs.items()}


def play_groups(
    play: Callable[[list[dict[str, Any]]], RolloutBatch],
    rows: list[dict[str, Any]],
    trainer,
    config,
    *,
    step: int | None = None,
    training: bool | None = None,
) -> GroupedRollout:
    """The training rollout's entry point: play `rows` under `config.rl_zero_std_groups` (training
    only; evaluation keeps every group), refilling from the trainer's dataset. `step` and `training`
    default to the trainer's (a step played ahead passes its own)."""
    training = trainer.model.training if training is None else training
    if config.rl_zero_std_groups == "keep" or not training:
        return GroupedRollout(play(rows))
    dataset = trainer.train_dataset
    cap = config.rl_refill_max_episodes
    policy = ZeroStdGroups(
        config.rl_zero_std_groups,
        trainer.num_generations,
        seed=config.seed,
        max_extra_episodes=2 * len(rows) if cap is None else cap,
    )
    return policy.play(
        play,
        rows,
        step=trainer.state.global_step if step is None else step,
        num_dataset_rows=len(dataset),
        rows_at=lambda indexes: [dict(dataset[i]) for i in indexes],
    )
