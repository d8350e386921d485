"""Episode statistics: one summary per finished episode, and one aggregation of many.

`EpisodeSummary` is the part of an `Episode` that numbers are computed from: small, typed and
picklable, because training gathers every process's summaries with accelerate's `gather_object`.
`episode_stats` turns summaries (or episodes) into `EpisodeStats`, the one place mean score, success
rate, turns, truncations, errors, tool use, stop reasons, context rewrites (engine/context.py: rewrites and
sequences per episode, the latter an agent's own rewrites included, tokens the rewrites left out, results cut to --rl-max-tool-result-tokens) and the
environment's own metrics are computed. Training logs it as `env/*` (`EpisodeStats.env_metrics`), `aitrain eval` prints it per model
and `aitrain env check` per policy.

Left out: timing and token counts (they belong to a rollout, not to its episodes: engine/rollout.py
and training), and pass@k (it needs the task of each episode: commands/evaluation.py).
"""

from __future__ import annotations

import contextlib
import numbers
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from aitrain_grpo.env.base import STOP_REASONS, Episode

# env/ metrics logged beside env_metrics' own: the per-turn reward's mean, and the step's repeated replies
# (runlog/group_replies.py).
LOGGED_BESIDE = {"env/turn_reward_mean", "env/group_one_reply_frac", "env/group_same_reply"}


def is_logged_metric(value: object) -> bool:
    """Numbers of any kind (numpy's too) and flags (True counts 1: the mean is a share) are logged; text is not."""
    return isinstance(value, numbers.Real)


def episode_scores(episodes: Iterable[Episode]) -> list[float]:
    """Each episode's score as a float (0.0 for one never scored), in order."""
    return [float(ep.score or 0.0) for ep in episodes]


SUCCESS = 1.0 - 1e-9  # a score of 1.0 counts as solved (floats from environments may be 0.9999999999)


@dataclass(frozen=True)
class EpisodeSummary:
    """The numbers of one finished episode."""

    score: float
    turns: int
    truncated: bool
    error: str | None
    tool_calls: int
    tool_errors: int
    stop_reason: str | None = None
    truncated_turns: int = 0
    metrics: dict[str, float] = field(default_factory=dict)  # the environment's own numbers
    tool_forms: dict[str, int] = field(default_factory=dict)  # model turns read as calls, per form
    turn_reward: float | None = None  # the sum of its turn rewards (episode.reward_turn); None if it gave none
    rewrites: int = 0  # times a context strategy rewrote its history (each starts a new sequence)
    tokens_saved: int = 0  # tokens those rewrites left out of the context
    tool_results_cut: int = 0  # tool/environment results cut to --rl-max-tool-result-tokens
    sequences: int = 1  # token sequences it played: one more per rewrite, a context strategy's or an agent's

    @classmethod
    def of(cls, episode: Episode) -> EpisodeSummary:
        return cls(
            score=float(episode.score or 0.0), turns=episode.turns,
            truncated=episode.truncated, error=episode.error,
            tool_calls=episode.num_tool_calls, tool_errors=episode.num_tool_errors,
            stop_reason=episode.stop_reason, truncated_turns=episode.truncated_turns,
            tool_forms=dict(Counter(form for form in episode.tool_call_forms if form)),
            metrics={k: float(v) for k, v in episode.metrics.items() if is_logged_metric(v)},
            turn_reward=float(sum(episode.turn_rewards)) if episode.turn_rewards else None,
            rewrites=len(episode.log.rewrite_turns), tokens_saved=episode.log.tokens_saved,
            tool_results_cut=episode.log.tool_results_cut,
            sequences=episode.log.sequences,
        )


@dataclass(frozen=True)
class EpisodeStats:
    """What a set of episodes adds up to. Means are over episodes; `errors`, `truncated` and
    `tool_errors` are counts."""

    episodes: int
    score_mean: float
    success_rate: float
    turns_mean: float
    truncated: int
    truncated_turns_mean: float
    errors: int
    tool_calls_mean: float
    tool_errors: int
    stop_fractions: dict[str, float]  # every reason in STOP_REASONS, 0.0 where none stopped so
    tool_forms: dict[str, int]  # model turns whose calls were read in each form (engine/tool_parsers.py)
    metrics: dict[str, float]  # each environment metric's mean over the episodes that reported it
    # Mean reward per model turn, over the episodes whose environment rewarded turns (None: none did).
    turn_reward_mean: float | None = None
    rewrites_mean: float = 0.0  # context-strategy rewrites per episode
    sequences_mean: float = 1.0  # sequences per episode, whichever rewrite (a strategy's, an agent's) made them
    tokens_saved_mean: float = 0.0
    tool_results_cut: int = 0

    def env_metrics(self) -> dict[str, float]:
        """The per-step training metrics, named as `metrics.jsonl` and the trackers show them."""
        n = max(self.episodes, 1)
        logged = {
            "env/score_mean": self.score_mean,
            "env/turns_mean": self.turns_mean,
            "env/truncated_frac": self.truncated / n,
            "env/truncated_turns_mean": self.truncated_turns_mean,
            "env/errors": float(self.errors),
            "env/tool_calls_mean": self.tool_calls_mean,
            "env/tool_errors": float(self.tool_errors),
            "env/episodes": float(self.episodes),
            "env/context_rewrites_mean": self.rewrites_mean,
            "env/sequences_mean": self.sequences_mean,
            "env/context_tokens_saved_mean": self.tokens_saved_mean,
            "env/tool_results_cut": float(self.tool_results_cut),
        }
        logged.update({f"env/stop/{reason}": share for reason, share in self.stop_fractions.items()})
        # The environment's own numbers; one named like the engine's (errors, score_mean, ...) goes under
        # env/metric/ rather than replace it (a step line read "errors 0" with every episode failed).
        engine = set(logged) | LOGGED_BESIDE
        logged.update({(f"env/metric/{key}" if f"env/{key}" in engine or key.startswith("stop/") else f"env/{key}"): value
                       for key, value in self.metrics.items()})
        logged.update({f"tools/format/{form}": float(count) for form, count in self.tool_forms.items()})
        if self.turn_reward_mean is not None:
            logged["env/turn_reward_mean"] = self.turn_reward_mean
        return logged


def episode_stats(items: Iterable[EpisodeSummary | Episode]) -> EpisodeStats:
    """Aggregate finished episodes (or their summaries, possibly gathered from several processes)."""
    summaries = [item if isinstance(item, EpisodeSummary) else EpisodeSummary.of(item) for item in items]
    n = max(len(summaries), 1)
    stops = {reason: 0 for reason in STOP_REASONS}
    custom: dict[str, list[float]] = {}
    rewarded = [s for s in summaries if s.turn_reward is not None]
    for s in summaries:
        if s.stop_reason in stops:
            stops[s.stop_reason] += 1
        for key, value in s.metrics.items():
            custom.setdefault(key, []).append(value)
    return EpisodeStats(
        episodes=len(summaries),
        score_mean=sum(s.score for s in summaries) / n,
        success_rate=sum(1 for s in summaries if s.score >= SUCCESS) / n,
        turns_mean=sum(s.turns for s in summaries) / n,
        truncated=sum(1 for s in summaries if s.truncated),
        truncated_turns_mean=sum(s.truncated_turns for s in summaries) / n,
        errors=sum(1 for s in summaries if s.error),
        tool_calls_mean=sum(s.tool_calls for s in summaries) / n,
        tool_errors=sum(s.tool_errors for s in summaries),
        stop_fractions={reason: count / n for reason, count in stops.items()},
        metrics={key: sum(values) / len(values) for key, values in custom.items()},
        tool_forms=dict(sum((Counter(s.tool_forms) for s in summaries), Counter())),
        turn_reward_mean=(sum(s.turn_reward for s in rewarded) / max(sum(s.turns for s in rewarded), 1)
                          if rewarded else None),
        rewrites_mean=sum(s.rewrites for s in summaries) / n,
        sequences_mean=sum(s.sequences for s in summaries) / n if summaries else 1.0,
        tokens_saved_mean=sum(s.tokens_saved for s in summaries) / n,
        tool_results_cut=sum(s.tool_results_cut for s in summaries),
    )


class BusyClock:
    """Wall time during which at least one call of a kind (generation, environment) was under way."""

    def __init__(self):
        self.seconds, self._open, self._since = 0.0, 0, 0.0

    @contextlib.contextmanager
    def running(self):
        if self._open == 0:
            self._since = time.perf_counter()
        self._open += 1
        try:
            yield
        finally:
            self._open -= 1
            if self._open == 0:
                self.seconds += time.perf_counter() - self._since
