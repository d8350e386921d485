"""One typed record per trained sequence: what the rollout side hands the trainer.

A played episode is one token sequence, or several when its history was rewritten mid-episode (a
context strategy, an agent's new segment: `RolloutBatch.earlier`). Each sequence that trains becomes a
`SequenceRecord` holding exactly its tokens, its loss mask, the log-probabilities it was sampled with,
and the advantage its tokens train on, with the ids that tie it to its episode and group. Everything
that decides an advantage is settled here, before the trainer sees a tensor:

- the episode's advantage (its group-normalised reward, step/advantages.py) on every sequence of it;
- with `--rl-advantage turn`, each token's turn credit on top (training/step/turn_credit.py), per sequence;
- a dropped group's episodes (`--rl-zero-std-groups drop|refill`, training/rollout/groups.py) keep their last
  sequence with an all-zero mask (`in_loss` False; TRL needs one row per episode it handed out) and lose
  their earlier ones;
- an earlier sequence with no model token is left out (nothing in it trains).

Order is the batch's contract with TRL's shuffle (and so with every earlier run's numbers): each
episode's last sequence in episode order, then the earlier sequences in episode and sequence order.
`step/batch.py` turns the list into TRL's padded tensors in one place.

Left out: multimodal fields (no record carries an image; an environment with images is refused before
training) and a per-row loss weight (docs/architecture.md, "Token rules", says why rows are rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from aitrain_grpo.engine.traces import TokenTrace
from aitrain_grpo.training.step.turn_credit import rollout_turn_advantages


@dataclass(frozen=True)
class SequenceRecord:
    """One sequence the step trains on. `env_mask[i]` is 1 where the model sampled `completion_ids[i]`
    and the token counts in the loss; `sampling_logps` are the sampler's log-probabilities (0 at
    environment tokens); `advantage` is the episode's, `turn_credit` (or None) what each completion token
    adds to it. `episode` indexes this process's batch, `group` the GRPO group, `sequence` the episode's
    sequences in order (`last` marks the one it ended on). `weight_version` is the policy version that
    sampled it (--rl-async-steps; None otherwise)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    env_mask: tuple[int, ...]
    sampling_logps: tuple[float, ...]
    advantage: float
    turn_credit: tuple[float, ...] | None
    episode: int
    group: int
    sequence: int
    last: bool
    in_loss: bool = True
    weight_version: int | None = None

    @property
    def model_tokens(self) -> int:
        """Tokens of this sequence that count in the loss."""
        return sum(self.env_mask)


def sequences_of(earlier: Sequence[Sequence[TokenTrace]], traces: Sequence[TokenTrace]) -> list[list[TokenTrace]]:
    """Per episode, its sequences in order: the earlier ones, then its last (`traces[i]`)."""
    before = list(earlier) + [[]] * (len(traces) - len(earlier))
    return [list(seqs) + [last] for seqs, last in zip(before, traces)]


def sequence_records(batch, advantages: Sequence[float], group_size: int, *, dropped: set[int] = frozenset(),
                     turn_credit: bool = False, weight_versions: Sequence[int] | None = None) -> list[SequenceRecord]:
    """The records of a played `batch` (engine/rollout.py's `RolloutBatch`), in the order the module
    docstring gives. `advantages` holds each episode's advantage; `dropped` the episodes out of the loss."""
    sequences = sequences_of(batch.earlier, batch.traces)
    credit = rollout_turn_advantages(batch.episodes, sequences, group_size) if turn_credit else None
    last, earlier = [], []
    for i, seqs in enumerate(sequences):
        for j, trace in enumerate(seqs):
            is_last = j == len(seqs) - 1
            if not is_last and (i in dropped or not any(trace.env_mask)):
                continue
            mask = trace.env_mask if i not in dropped else [0] * len(trace.env_mask)
            record = SequenceRecord(
                prompt_ids=tuple(trace.prompt_ids), completion_ids=tuple(trace.completion_ids),
                env_mask=tuple(mask), sampling_logps=tuple(trace.logprobs), advantage=float(advantages[i]),
                turn_credit=tuple(credit[i][j]) if credit is not None else None,
                episode=i, group=i // group_size, sequence=j, last=is_last, in_loss=i not in dropped,
                weight_version=weight_versions[i] if weight_versions is not None else None)
            (last if is_last else earlier).append(record)
    return last + earlier


__all__ = ["SequenceRecord", "sequence_records", "sequences_of"]
