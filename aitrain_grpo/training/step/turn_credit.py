"""Credit per turn (`--rl-advantage outcome|turn`).

A multi-turn episode has one score, and with `outcome` (the default) TRL gives every token of it the
same advantage: the score normalised within its group. An environment that knows more rewards single
model turns (`episode.reward_turn`, env/base.py). With `turn`, the tokens of model turn t get

    A(token in turn t) = A_outcome + A_turn(t),
    A_turn(t) = (G_t - mean_group(G_t)) / (std_group(G_t) + 1e-4),  G_t = sum of the rewards of turns t, t+1, ...

where A_outcome is TRL's advantage, unchanged, and the group statistics of G_t are taken over the
episodes of the same group (same prompt) that played a turn t (sample standard deviation, as TRL's
`nanstd`; 0 where fewer than two did). This is MT-GRPO's turn-level credit (Zeng et al. 2025): a
turn is credited with what it and the turns after it earned, compared with the other episodes' turn
at the same position. GiGPO (Feng et al. 2025) instead groups steps that start from the same
environment state, which needs states that repeat across episodes (grid worlds, web pages); our
environments' states are free-form and rarely identical, so grouping by turn position is what
applies to all of them. Turn rewards are used as given (no clipping); an environment that gives none
leaves A_turn at 0, so `turn` then trains exactly as `outcome`.

How the numbers reach TRL's loss: each sequence record carries its tokens' credit (step/records.py),
and the batch's `advantages` are (rows, tokens): the episode's advantage plus its tokens' credit
(step/batch.py), the shape TRL's loss supports. Environment tokens carry their turn's value and are
masked out of the loss anyway.

An episode of several sequences (its history rewritten mid-episode) counts its turns
across them: each model turn has the episode turn its sequence numbers it with (`TokenTrace.turn_numbers`:
a `summarize` strategy's summary turn shares the number of the turn after it), or, where the sequences
do not number the episode's turns in order (an agent's segments), its order across the sequences; each
sequence's tokens get their own turns' credit (`rollout_turn_advantages`).

Left out: discounting (a factor below 1 for later turns), per-turn rewards from reward functions,
and groups spanning processes (groups are local to a process, as for --rl-zero-std-groups).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Sequence


STD_EPSILON = 1e-4  # TRL's: advantage = (r - mean) / (std + 1e-4)


def returns_to_go(turn_rewards: Sequence[float], turns: int) -> list[float]:
    """G_t for t < `turns`: the sum of the rewards of turn t and the turns after it (a turn never
    rewarded counts 0)."""
    rewards = list(turn_rewards)[:turns] + [0.0] * max(0, turns - len(turn_rewards))
    out, total = [0.0] * turns, 0.0
    for t in range(turns - 1, -1, -1):
        total += rewards[t]
        out[t] = total
    return out


def _normalised(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return [(v - mean) / (std + STD_EPSILON) for v in values]


def group_turn_advantages(turn_rewards: Sequence[Sequence[float]], turns: Sequence[int], group_size: int) -> list[list[float]]:
    """A_turn(t) for every turn of every episode; episodes come in consecutive groups of `group_size`."""
    if len(turns) % group_size:
        raise ValueError(f"{len(turns)} episodes do not split into groups of {group_size}")
    returns = [returns_to_go(rewards, n) for rewards, n in zip(turn_rewards, turns)]
    advantages = [[0.0] * n for n in turns]
    for start in range(0, len(turns), group_size):
        members = range(start, start + group_size)
        for t in range(max(turns[i] for i in members)):
            played = [i for i in members if turns[i] > t]
            for i, value in zip(played, _normalised([returns[i][t] for i in played])):
                advantages[i][t] = value
    return advantages


def token_turn_advantages(turn_advantages: Sequence[float], turn_starts: Sequence[int], num_tokens: int) -> list[float]:
    """One episode's A_turn spread over its completion tokens: each token gets its turn's value
    (tokens before the first model turn, and environment tokens after the last, get the value of the
    turn they follow; they are masked out of the loss)."""
    if not turn_starts:
        return [0.0] * num_tokens
    return [turn_advantages[max(bisect_right(turn_starts, j) - 1, 0)] if turn_advantages else 0.0 for j in range(num_tokens)]


def episode_turn_numbers(sequences) -> list[list[int]]:
    """Per sequence of one episode, the episode turn of each of its model turns: the sequences' own
    `turn_numbers` (engine/traces.py) where they number the episode's turns in order, else the turns'
    order across the sequences."""
    given = [list(getattr(t, "turn_numbers", None) or ()) for t in sequences]
    flat = [n for numbers in given for n in numbers]
    if all(len(n) == len(t.turn_starts) for n, t in zip(given, sequences)) and flat == sorted(flat):
        return given
    out, first = [], 0
    for t in sequences:
        out.append(list(range(first, first + len(t.turn_starts))))
        first += len(t.turn_starts)
    return out


def rollout_turn_advantages(episodes, sequences, group_size: int) -> list[list[list[float]]]:
    """Per episode of a played batch, per sequence of it (`sequences`: its earlier ones, then its last;
    step/records.py), A_turn per completion token."""
    numbers = [episode_turn_numbers(seqs) for seqs in sequences]
    turns = [1 + max((n for per in ep for n in per), default=-1) for ep in numbers]
    per_turn = group_turn_advantages([ep.turn_rewards for ep in episodes], turns, group_size)
    return [[token_turn_advantages([values[n] for n in per], t.turn_starts, len(t.completion_ids))
             for t, per in zip(seqs, ep_numbers)]
            for values, seqs, ep_numbers in zip(per_turn, sequences, numbers)]
