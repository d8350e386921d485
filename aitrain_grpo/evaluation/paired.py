"""Whether one set of episodes beats another on the same tasks: the difference with its 95 % interval.

Two users: `aitrain eval --baseline` (the model against its baseline) and the held-back evaluation during
training (held_back.py: each evaluation against the one before step 1).

Why: `aitrain eval --baseline` plays both models on the same tasks from the same sampling seed, and its
table shows the difference of the means. On 32 tasks a difference of 0.1 can be noise or a gain, and the
table alone does not say which. Both models played the same tasks, so the difference is taken task by task
(each task's mean over its k episodes, model minus baseline), which removes the spread between easy and
hard tasks from the comparison, and the interval is a t-interval over those per-task differences:
mean(d) +- t(0.975, n-1) * sd(d) / sqrt(n). "a tie" when the interval holds 0.

What is left out: corrections for reading several metrics at once (each interval is read on its own), and
the variation between training runs: the interval says whether these weights beat the baseline on tasks
like these, not whether training again would (that takes several seeds: benchmarks/HEAD_TO_HEAD.md).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

# Two-sided 95% quantiles of Student's t by degrees of freedom (scipy is not a dependency); between entries
# the next smaller one's, which is wider; 1.96 from 120 on.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    return T975[max(k for k in T975 if k <= df)] if df < 120 else 1.960


@dataclass(frozen=True)
class PairedDifference:
    """Model minus baseline over tasks both played: the mean per-task difference, its 95 % interval (None
    below two tasks), and how many tasks."""

    metric: str
    mean: float
    low: float | None
    high: float | None
    tasks: int

    @property
    def direction(self) -> int:
        """1 when the interval is above 0, -1 when below, 0 when it holds 0 (a tie) or there is none."""
        if self.low is None or self.high is None or self.low <= 0 <= self.high:
            return 0
        return 1 if self.low > 0 else -1

    @property
    def verdict(self) -> str:
        if self.low is None:
            return "no interval from one task"
        return {0: "a tie (the interval holds 0; more --episodes narrow it)", 1: "the model is ahead",
                -1: "the baseline is ahead"}[self.direction]

    def shown(self, scale: float = 1.0, unit: str = "") -> str:
        """The difference and its interval, values multiplied by `scale` (100 for points), e.g.
        "+12.5 pts, 95% interval [-3.1, +28.1]"."""
        digits = 1 if scale != 1.0 else 3
        text = f"{self.mean * scale:+.{digits}f}{unit}"
        if self.low is not None and self.high is not None:
            text += f", 95% interval [{self.low * scale:+.{digits}f}, {self.high * scale:+.{digits}f}]"
        return text

    def line(self, scale: float = 1.0, unit: str = "") -> str:
        """One line for `aitrain eval`'s output."""
        return f"{self.metric}, model - baseline: {self.shown(scale, unit)} over {self.tasks} tasks played by both: {self.verdict}"


def paired_difference(metric: str, model: Sequence[tuple[int, float]], baseline: Sequence[tuple[int, float]],
                      value: Callable[[float], float] = float) -> PairedDifference | None:
    """The per-task difference of `value(score)` (the score, or 1.0 for a success) between two models'
    episodes, each given as (task, score); tasks only one model played are left out. None when no task
    was played by both."""
    per_task: list[dict[int, list[float]]] = [defaultdict(list), defaultdict(list)]
    for side, episodes in zip(per_task, (model, baseline)):
        for task, score in episodes:
            side[task].append(value(score))
    shared = sorted(set(per_task[0]) & set(per_task[1]))
    if not shared:
        return None
    diffs = [statistics.mean(per_task[0][t]) - statistics.mean(per_task[1][t]) for t in shared]
    mean = statistics.mean(diffs)
    if len(diffs) < 2:
        return PairedDifference(metric, mean, None, None, len(diffs))
    half = t975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return PairedDifference(metric, mean, mean - half, mean + half, len(diffs))
