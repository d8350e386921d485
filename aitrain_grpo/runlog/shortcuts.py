"""Shortcuts in sight: the reward climbs while a behaviour that usually means the score is being gamed moves with it.

GRPO follows whatever raises the score, and the cheapest route is often one the task did not mean: the
quick start's tiny model learns to fill every 16-token turn with " a a a" so the turn is cut and the
episode ends after one turn (score 0.06 -> 0.48, turns 2.1 -> 1.0, episodes ended by a cut turn
0.75 -> 1.0); a tool policy learns to call more and fail more because failed calls cost nothing. A rising
reward alone looks like success, so nothing else warned. This module looks for the pair: over one
window of steps, the score rises AND one of these moves the shortcut's way:

- episodes ended by a budget (a turn cut at its token limit, the turn limit, the completion budget, the
  context window: `env/stop/*`, or `env/truncated_frac`, which counts them all, in older runs) rise;
- turns per episode collapse towards 1;
- model turns cut at their token limit (the episode going on) climb;
- tool calls or tool errors per episode climb;
- one identical reply takes over the groups (`env/group_same_reply`, group_replies.py: the share of a
  group's other episodes that wrote, token for token, what its most common reply wrote).

When it fires and the run logged `probe/<name>` (how alike its best replies and env check's shortcut probes'
are, probe_resemblance.py), the message also names the probe they resemble, the mean of the window's last
`EDGE` steps from probe_resemblance.RESEMBLES up; the replies often become the probe's a few steps after
the warning first fires, so training prints it once more then (health.py) and a replay names it too.

Each watched behaviour compares the mean of the first `EDGE` steps of the window with the mean of its
last `EDGE` steps (means of several steps, so one noisy batch does not fire it; of half the window when
it is shorter, so a real model's first 6-9 steps are looked at too). The thresholds were
measured (benchmarks/SHORTCUTS.md): the quick start's letters run crosses them at step 18 of 60
on its default seed and at step 11 on seeds 1 and 2 (its cut-turn share then goes on to rise 0.9 at its
largest, three times SHARE_RISE); each rule asks for a move that a learning run's batch noise does not make
over 5-step means.

Pure functions of the metric records (no torch), so training (health.py), `aitrain report` and
`aitrain eval` share them. Left out: printing (health.py) and judging whether the shortcut is bad: a
person reads the best transcripts and the score function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from aitrain_grpo.runlog.probe_resemblance import resembled_probe

Record = dict[str, Any]

WINDOW = 20          # steps looked at: the last 20 (fewer at the start of a run)
EDGE = 5             # the window's start and end are each the mean of 5 steps ...
MIN_STEPS = 6        # ... or, in a shorter window (a real model's first hour), of half of it, 3 steps at least
REWARD_RISE = 0.05   # the score must rise at least this much (scores are in [0, 1])
SHARE_RISE = 0.3     # a share of episodes (ended by a budget) rising this much ...
SHARE_NOW = 0.5      # ... to at least half the batch,
PINNED = 0.95        # or to (almost) every episode ...
PINNED_RISE = 0.15   # ... after rising this much (the quick start's seeds 1-2 start at 0.78 cut and end at 1.0)
ONE_TURN = 1.2       # turns per episode "collapsed to 1" at or below this ...
TURNS_DROP = 0.5     # ... after falling at least this much
CUT_TURNS_RISE = 0.5  # model turns cut at their limit, per episode, rising this much
TOOL_CALLS_RISE = 1.0  # tool calls per episode rising this much and by half ...
TOOL_CALLS_NOW = 2.0   # ... to more than one call an episode: learning to call a tool at all is no shortcut
TOOL_ERRORS_RISE = 0.3  # tool errors per episode rising this much and doubling
SAME_REPLY_RISE = 0.3  # env/group_same_reply rising this much ...
SAME_REPLY_NOW = 0.4   # ... to this: the quick start's seed 42 goes 0 -> 0.47 over steps 15-34 (its score 0.33 -> 0.47)

ADVICE = ("read the best-scoring transcripts of recent steps in episodes.jsonl (report.html shows the first and "
          "last steps' best side by side) and check that the score function pays only for what the task means; "
          "if it pays for the shortcut, fix the score (or the budget) before training on")


def _number(record: Record, key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _tool_errors_per_episode(record: Record) -> float | None:
    errors, episodes = _number(record, "env/tool_errors"), _number(record, "env/episodes")
    return errors / episodes if errors is not None and episodes else None


def _share_rose(start: float, now: float) -> bool:
    return (now - start >= SHARE_RISE and now >= SHARE_NOW) or (now - start >= PINNED_RISE and now >= PINNED)


@dataclass(frozen=True)
class Behaviour:
    """One metric that moves a known way when a shortcut pays: how to read it and when it has moved."""
    metric: str                                   # its name in metrics.jsonl (or a derived name)
    label: str                                    # what it counts, for the message
    read: Callable[[Record], float | None]
    moved: Callable[[float, float], bool]         # (start, now) -> moved the shortcut's way
    chart: str                                    # the report chart that shows it


def _key(metric: str) -> Callable[[Record], float | None]:
    return lambda record: _number(record, metric)


BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour("env/stop/turn_tokens", "share of episodes ended by a turn cut at its token limit",
              _key("env/stop/turn_tokens"), _share_rose, "stops"),
    Behaviour("env/stop/max_turns", "share of episodes stopped by the turn limit",
              _key("env/stop/max_turns"), _share_rose, "stops"),
    Behaviour("env/stop/completion_budget", "share of episodes stopped by the completion budget",
              _key("env/stop/completion_budget"), _share_rose, "stops"),
    Behaviour("env/stop/context", "share of episodes stopped by the context window",
              _key("env/stop/context"), _share_rose, "stops"),
    Behaviour("env/turns_mean", "turns per episode",
              _key("env/turns_mean"), lambda a, b: b <= ONE_TURN and a - b >= TURNS_DROP, "turns"),
    Behaviour("env/truncated_turns_mean", "model turns cut at their token limit per episode",
              _key("env/truncated_turns_mean"), lambda a, b: b - a >= CUT_TURNS_RISE, "env/truncated_turns_mean"),
    Behaviour("env/tool_calls_mean", "tool calls per episode",
              _key("env/tool_calls_mean"),
              lambda a, b: b - a >= TOOL_CALLS_RISE and b >= 1.5 * a and b >= TOOL_CALLS_NOW, "turns"),
    Behaviour("tool_errors_per_episode", "tool errors per episode (env/tool_errors / env/episodes)",
              _tool_errors_per_episode, lambda a, b: b - a >= TOOL_ERRORS_RISE and b >= 2 * a, "errors"),
    Behaviour("env/group_same_reply", "share of a group's episodes writing its most common reply",
              _key("env/group_same_reply"), lambda a, b: b - a >= SAME_REPLY_RISE and b >= SAME_REPLY_NOW,
              "env/group_same_reply"),
)
BY_METRIC = {behaviour.metric: behaviour for behaviour in BEHAVIOURS}
# A run without the per-reason stop shares (older runs) still has the share cut by any budget.
TRUNCATED = Behaviour("env/truncated_frac", "share of episodes cut by a budget",
                      _key("env/truncated_frac"), _share_rose, "env/truncated_frac")


@dataclass(frozen=True)
class Move:
    """One behaviour's value at the window's start and now."""
    metric: str
    label: str
    start: float
    now: float
    chart: str

    def words(self) -> str:
        return f"{self.label} ({self.metric}) {self.start:.2f} -> {self.now:.2f}"


@dataclass(frozen=True)
class Shortcut:
    """The score rose over steps first_step..step while `moves` moved the shortcut's way."""
    first_step: int
    step: int
    reward_start: float
    reward_now: float
    moves: tuple[Move, ...]
    probe: tuple[str, float] | None = None  # (name, similarity) of the probe its replies resemble ...
    probe_step: int | None = None           # ... from this step, when later than `step` (a replay: first_shortcut)

    def message(self) -> str:
        since = f" from step {self.probe_step}" if self.probe_step not in (None, self.step) else ""
        resembles = (f";{since} its replies resemble the probe '{self.probe[0]}' (similarity {self.probe[1]:.2f})"
                     if self.probe else "")
        return (f"possible shortcut: the score rose {self.reward_start:.2f} -> {self.reward_now:.2f} over steps "
                f"{self.first_step}-{self.step} while " + "; ".join(m.words() for m in self.moves) + resembles)

    def to_dict(self) -> dict[str, Any]:
        return {"first_step": self.first_step, "step": self.step, "reward_start": self.reward_start,
                "reward_now": self.reward_now, "message": self.message(), "advice": ADVICE,
                "moves": [vars(m) for m in self.moves],
                "probe": {"name": self.probe[0], "similarity": self.probe[1], "step": self.probe_step or self.step}
                if self.probe else None}


def _edges(records: Sequence[Record], read: Callable[[Record], float | None]) -> tuple[float, float] | None:
    """Mean of the first and the last EDGE steps (half the window when shorter), when each one has the value."""
    edge = min(EDGE, len(records) // 2)
    first = [read(r) for r in records[:edge]]
    last = [read(r) for r in records[-edge:]]
    if any(v is None for v in first + last):
        return None
    return sum(first) / edge, sum(last) / edge  # type: ignore[arg-type]


def _score(record: Record) -> float | None:
    score = _number(record, "env/score_mean")
    return score if score is not None else _number(record, "reward")


def find_shortcut(records: Sequence[Record]) -> Shortcut | None:
    """The shortcut pattern over the last WINDOW records, or None (too few steps, a flat score, nothing moved)."""
    window = list(records[-WINDOW:])
    if len(window) < MIN_STEPS:
        return None
    reward = _edges(window, _score)
    if reward is None or reward[1] - reward[0] < REWARD_RISE:
        return None
    behaviours = BEHAVIOURS if any("env/stop/turn_tokens" in r for r in window) else (TRUNCATED, *BEHAVIOURS)
    moves = []
    for behaviour in behaviours:
        edges = _edges(window, behaviour.read)
        if edges is not None and behaviour.moved(*edges):
            moves.append(Move(behaviour.metric, behaviour.label, edges[0], edges[1], behaviour.chart))
    if not moves:
        return None
    step = lambda r, default: int(r.get("step", default))  # noqa: E731
    probe = resembled_probe(window, min(EDGE, len(window) // 2))  # over the same last steps as the moves
    return Shortcut(step(window[0], 1), step(window[-1], len(records)), reward[0], reward[1], tuple(moves), probe)


def first_shortcut(records: Sequence[Record]) -> Shortcut | None:
    """Replay a finished run: the shortcut as first seen (the step a training run printed it), with the probe
    its replies resemble at the first step the pattern still held and one was named (training prints the
    line again then: health.HealthCallback); a shortcut's replies often turn into the probe's a few steps
    after the score and the behaviour first moved together (benchmarks/SHORTCUTS.md)."""
    first = None
    for end in range(MIN_STEPS, len(records) + 1):
        found = find_shortcut(records[max(0, end - WINDOW):end])
        if found is None:
            continue
        first = first or found
        if found.probe is not None:
            return first if found is first else replace(first, probe=found.probe, probe_step=found.step)
    return first


# ------------------------------------------------------------------------------------ evaluation


def eval_shifts(model: dict[str, float], baseline: dict[str, float], against: str = "the baseline's") -> list[str]:
    """The shortcut's moves between two evaluations' summaries (evaluate.EvalResult.summary()), with the
    training thresholds: more episodes cut by a budget, turns collapsed to 1 (or up by TURNS_DROP while more
    episodes are cut by a budget), tool errors per episode up and doubled. Only the shortcut's direction: the
    stations runs of benchmarks/TOOL_USE.md learn to stop at the turn limit less (28 -> 5 of 64) and to fail
    fewer calls (105 -> 19), which is no warning, while the issue's tool run (turn limit 0 -> 16 of 32, tool
    errors 7 -> 23, turns 1.9 -> 2.5) is. More turns with fewer cut is a task learned, not a shortcut: the
    quick start's model plays all three of its turns where the base ended early on cut ones (2 -> 3 turns,
    27 -> 0 of 32 cut, benchmarks/FIRST_RUN.md)."""
    def per_episode(summary: dict[str, float], key: str) -> float | None:
        episodes = summary.get("episodes")
        return summary[key] / episodes if episodes and key in summary else None

    cut_now, cut_base = per_episode(model, "truncated"), per_episode(baseline, "truncated")
    more_cut = cut_now is not None and cut_base is not None and cut_now > cut_base

    def turns_moved(base: float, now: float) -> bool:
        return (now <= ONE_TURN and base - now >= TURNS_DROP) or (more_cut and now - base >= TURNS_DROP)

    shifts = []
    checks = (("truncated", "share of episodes cut by a budget", per_episode, _share_rose),
              ("mean_turns", "turns per episode", lambda s, k: s.get(k), turns_moved),
              ("tool_errors", "tool errors per episode", per_episode, BY_METRIC["tool_errors_per_episode"].moved))
    for key, label, read, moved in checks:
        now, base = read(model, key), read(baseline, key)
        if now is not None and base is not None and moved(base, now):
            shifts.append(f"{label}: {now:.2f} against {against} {base:.2f}")
    return shifts


def run_start(run_dir: str | Path) -> dict[str, float] | None:
    """A training run's first EDGE logged steps as an evaluation summary (one "episode" holding the mean
    shares): how the model it started from played, for an eval given no baseline."""
    from aitrain_grpo.runlog.records import METRICS_FILE, read_jsonl  # only an eval of a run folder reads one

    path = Path(run_dir) / METRICS_FILE
    records = [r for r in read_jsonl(path) if isinstance(r.get("step"), int)] if path.is_file() else []
    first = sorted(records, key=lambda r: r["step"])[:EDGE]
    reads = {"truncated": TRUNCATED.read, "mean_turns": _key("env/turns_mean"), "tool_errors": _tool_errors_per_episode}
    summary: dict[str, float] = {"episodes": 1.0}
    for key, read in reads.items():
        values = [v for v in (read(r) for r in first) if v is not None]
        if values:
            summary[key] = sum(values) / len(values)
    return summary if len(summary) > 1 else None


def eval_warning(summaries: Sequence[dict[str, float]], model: str) -> str | None:
    """`aitrain eval`'s line when the model plays very differently from its baseline, or, with no baseline,
    from the start of the training run in `model` (its metrics.jsonl); None when nothing shifted."""
    if len(summaries) > 1:
        shifts = eval_shifts(summaries[0], summaries[1])
    else:
        folder = Path(model).expanduser()
        start = next((s for s in (run_start(folder), run_start(folder.parent)) if s), None) if folder.is_dir() else None
        shifts = eval_shifts(summaries[0], start, "the training run's first steps'") if start else []
    if not shifts:
        return None
    return ("the model plays differently: " + "; ".join(shifts) + ". A higher score that comes with this is often "
            "a shortcut: read the transcripts (--output FILE) and check what the score function pays for")
