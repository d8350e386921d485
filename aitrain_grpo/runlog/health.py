"""Health checks over a run's metric history, and a callback that prints each warning once, with advice.

Each check is a pure function of the per-step metric records (the dicts of `metrics.jsonl`: `step`,
TRL's `reward`, `reward_std`, `entropy`, `grad_norm`, ... the rollout's `env/*`, and a held-back
evaluation's `eval/*` every few steps), so it can be tested
on constructed sequences and rerun over a finished run by `aitrain report`. A check returns a
`HealthWarning` (what is wrong and what to do about it) or None.

The thresholds are rules of thumb for GRPO runs, not proofs of failure: a warning says "look here".

Left out: acting on a warning (stopping the run on too many environment errors belongs to training,
and to the user).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rich.console import Console
from rich.markup import escape
from transformers import TrainerCallback

from aitrain_grpo.runlog.shortcuts import ADVICE, WINDOW, find_shortcut

Record = dict[str, Any]

RECENT_STEPS = 5          # "recent" means the last five logged steps
ZERO_STD = 1e-6
SOLVED = 1.0 - 1e-9       # a step's mean score this high: every episode scored 1.0 (stats.SUCCESS's bar)
LOW_SCORE = 0.15
LOW_SCORE_AFTER_STEPS = 20
# A low score that is still climbing is a run learning, not an environment to check: README's quick start
# (benchmarks/FIRST_RUN.md) is below 0.15 at step 20 on some seeds, 0.05 above its first steps, and learns.
LOW_SCORE_RISE = 0.05
LOW_ENTROPY = 0.01
HIGH_GRAD_NORM = 10.0
ERROR_RATE = 0.1          # share of episodes ending in an environment error worth a warning
ERROR_RISE = 0.05         # and how far above the earlier rate it must be to count as rising
EARLIER_STEPS = 20        # "earlier" for rising errors: the 20 steps before the recent ones
HISTORY = max(RECENT_STEPS + EARLIER_STEPS, WINDOW)  # no check looks further back than this


@dataclass(frozen=True)
class HealthWarning:
    key: str      # one per kind of problem: a callback prints each key once
    step: int     # the step at which it was noticed
    message: str  # what is wrong, with the numbers
    advice: str   # what to do
    # What a later look adds (the probe a shortcut's replies resemble): printed once more when it first appears.
    detail: str = ""

    def line(self) -> str:
        return f"{self.message}. {self.advice}"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "step": self.step, "message": self.message, "advice": self.advice}


def _number(record: Record, key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _values(records: Sequence[Record], key: str) -> list[float]:
    return [v for v in (_number(r, key) for r in records) if v is not None]


def _step(records: Sequence[Record]) -> int:
    return int(records[-1].get("step", len(records))) if records else 0


def no_learning_signal(records: Sequence[Record], window: int = RECENT_STEPS) -> HealthWarning | None:
    """Most recent steps had equal rewards within every group: GRPO's advantages are all zero. A step on which
    every episode scored full marks (1.0) does not count: the run has learned those tasks, nothing is wrong
    (README's quick start does so from about step 45 on some seeds)."""
    recent = records[-window:]
    if len(recent) < window:
        return None

    def flat(record: Record) -> bool:
        score = _number(record, "env/score_mean")
        if score is not None and score >= SOLVED:
            return False
        std, zero_groups = _number(record, "reward_std"), _number(record, "frac_reward_zero_std")
        return (std is not None and std < ZERO_STD) or (zero_groups is not None and zero_groups >= 0.999)

    flat_steps = sum(flat(r) for r in recent)
    if flat_steps * 5 < window * 4:  # fewer than 80% of the recent steps
        return None
    return HealthWarning(
        "no_learning_signal", _step(records),
        f"no learning signal: every episode of a group scored the same on {flat_steps} of the last {window} steps",
        "GRPO learns only from score differences within a group; make scoring graded (partial credit), "
        "raise --rl-num-generations or --rl-temperature, or make the tasks easier",
    )


def _scores(records: Sequence[Record]) -> list[float]:
    return _values(records, "env/score_mean") or _values(records, "reward")


def low_score(records: Sequence[Record], after_steps: int = LOW_SCORE_AFTER_STEPS, threshold: float = LOW_SCORE,
              window: int = RECENT_STEPS, rise: float = LOW_SCORE_RISE) -> HealthWarning | None:
    """The mean score is still near zero after many steps, and not climbing: the last `window` steps' mean
    is less than `rise` above the earliest `window` steps in the history (the run's first steps, or those
    HISTORY steps back)."""
    if _step(records) < after_steps:
        return None
    scores = _scores(records[-window:])
    if not scores:
        return None
    mean = sum(scores) / len(scores)
    if mean >= threshold:
        return None
    earliest = _scores(records[:window])
    start = sum(earliest) / len(earliest) if earliest else mean
    if mean >= start + rise:
        return None
    return HealthWarning(
        "low_score", _step(records),
        f"mean score is {mean:.3f} after {_step(records)} steps ({start:.3f} at steps "
        f"{records[0].get('step', 1)}-{records[min(window, len(records)) - 1].get('step', window)})",
        "check that the environment can be solved and scores what you mean: run `aitrain env check` on it "
        "(the oracle should reach 1.0), or start from easier tasks or a stronger model",
    )


def entropy_collapse(records: Sequence[Record], threshold: float = LOW_ENTROPY, window: int = 3) -> HealthWarning | None:
    """The policy's token entropy is near zero: it samples (almost) the same text every time."""
    entropy = _values(records[-window:], "entropy")
    if len(entropy) < window or max(entropy) >= threshold:
        return None
    return HealthWarning(
        "entropy_collapse", _step(records),
        f"entropy is {entropy[-1]:.4f} (below {threshold}): the model has collapsed onto one answer",
        "episodes in a group will soon all look alike; lower --lr, raise --rl-kl-coef or --rl-temperature, "
        "or go back to an earlier checkpoint",
    )


def unstable_gradients(records: Sequence[Record], threshold: float = HIGH_GRAD_NORM) -> HealthWarning | None:
    """The latest gradient norm is large: updates this big tend to wreck the policy."""
    norms = _values(records[-1:], "grad_norm")
    if not norms or norms[-1] <= threshold:
        return None
    return HealthWarning(
        "unstable_gradients", _step(records),
        f"grad_norm is {norms[-1]:.1f} (above {threshold:g}): training is unstable",
        "lower the learning rate (--lr), e.g. by 3-10x",
    )


MASKED_ALL = 0.9  # --rl-mask-truncated took this share of a step's episodes out of the loss


def _least_share(records: Sequence[Record], key: str, at_least: float, window: int) -> float | None:
    """The smallest `key` of the last `window` records where every one of them logged it at `at_least` or
    more (a share a mask took out of the loss, step after step), else None."""
    shares = _values(records[-window:], key)
    return min(shares) if len(shares) == window and min(shares) >= at_least else None


def truncated_out_of_the_loss(records: Sequence[Record], window: int = 3) -> HealthWarning | None:
    """`--rl-mask-truncated` took (nearly) every episode out of the loss on each recent step: the budgets cut
    the episodes, and the run trains on almost nothing."""
    share = _least_share(records, "groups/masked_truncated_frac", MASKED_ALL, window)
    if share is None:
        return None
    return HealthWarning(
        "truncated_out_of_the_loss", _step(records),
        f"--rl-mask-truncated took {share:.0%} or more of the episodes out of the loss on each of the last "
        f"{window} steps (a budget or the turn cap cut them)",
        "little trains; raise --rl-max-new-tokens, --rl-max-completion-length or --rl-max-turns, or leave out "
        "--rl-mask-truncated",
    )


OFF_POLICY_MOST = 0.5  # --rl-off-policy-mask took this share of a step's model tokens out of the loss


def off_policy_mask_takes_most(records: Sequence[Record], window: int = 3) -> HealthWarning | None:
    """`--rl-off-policy-mask` took half or more of the model tokens out of the loss on each recent step: a
    threshold within the sampler's own noise (vLLM's bfloat16 against the trainer's float32 moves every
    sequence's KL off 0) drops the negative-advantage sequences whatever their staleness."""
    share = _least_share(records, "off_policy/masked_frac", OFF_POLICY_MOST, window)
    if share is None:
        return None
    return HealthWarning(
        "off_policy_mask_takes_most", _step(records),
        f"--rl-off-policy-mask took {share:.0%} or more of the model tokens out of the loss on each of the "
        f"last {window} steps (sequences with a negative advantage, judged too far from the policy that sampled them)",
        "what trains is mostly reinforcement of good episodes; raise --rl-off-policy-mask above the sampler's noise, "
        "or leave it out",
    )


def _error_rates(records: Sequence[Record]) -> list[float]:
    rates = []
    for record in records:
        errors, episodes = _number(record, "env/errors"), _number(record, "env/episodes")
        if errors is not None and episodes:
            rates.append(errors / episodes)
    return rates


def rising_errors(records: Sequence[Record], window: int = RECENT_STEPS) -> HealthWarning | None:
    """A growing share of episodes ends in an environment error (an exception, a timeout, a bad score)."""
    rates = _error_rates(records[-(window + EARLIER_STEPS):])
    if len(rates) < window:
        return None
    recent = sum(rates[-window:]) / window
    earlier_rates = rates[:-window]
    earlier = sum(earlier_rates) / len(earlier_rates) if earlier_rates else 0.0
    if recent < ERROR_RATE or recent < earlier + ERROR_RISE:
        return None
    return HealthWarning(
        "rising_errors", _step(records),
        f"environment errors are rising: {recent:.0%} of episodes in the last {window} steps (earlier {earlier:.0%})",
        "the model reaches states your environment does not handle; read the 'error' of the episodes in "
        "episodes.jsonl and fix reset/step/score_episode (tool errors do not count here)",
    )


def shortcut(records: Sequence[Record]) -> HealthWarning | None:
    """The score rises while a behaviour that usually means a gamed score moves with it (shortcuts.py); its
    detail is the probe its replies resemble, if any."""
    found = find_shortcut(records)
    if found is None:
        return None
    return HealthWarning("shortcut", found.step, found.message(), ADVICE, found.probe[0] if found.probe else "")


HELD_BACK = "eval/success"  # logged by a held-back evaluation (evaluation/held_back.py)
HELD_BACK_EVALS = 3          # two falls in a row take three evaluations


def _evaluations(records: Sequence[Record]) -> list[tuple[float, float]]:
    """(held-back success, training score) of each evaluation in `records` that has a training score: the
    mean score of the steps since the evaluation before it (at most RECENT_STEPS), its own step included.
    The evaluation before step 1 has none, so the first counted is the first after training began."""
    found, since = [], []
    for record in records:
        since.append(record)
        success = _number(record, HELD_BACK)
        if success is None:
            continue
        scores = _scores(since[-RECENT_STEPS:])
        if scores:
            found.append((success, sum(scores) / len(scores)))
        since = []
    return found


def held_back_falls(records: Sequence[Record]) -> HealthWarning | None:
    """Held-back success fell at each of the last two evaluations while the training score rose over them:
    the policy is learning something the held-back tasks do not reward (a shortcut, or tasks memorised)."""
    evaluations = _evaluations(records)[-HELD_BACK_EVALS:]
    if len(evaluations) < HELD_BACK_EVALS:
        return None
    (first, reward_then), (middle, _), (last, reward_now) = evaluations
    if not (first > middle > last and reward_now > reward_then):
        return None
    return HealthWarning(
        "held_back_falls", _step(records),
        f"held-back success fell at two evaluations in a row ({first:.1%} -> {middle:.1%} -> {last:.1%}) while the "
        f"training score rose ({reward_then:.3f} -> {reward_now:.3f})",
        "the policy may be gaming the score or memorising its training tasks: read the latest transcripts, and keep "
        "the best held-back weights (--save-best eval/success) or go back to an earlier checkpoint",
    )


GAIN = "eval/success_gain"  # held-back success since step 0, with its 95 % interval (evaluation/held_back.py)


def held_back_below_start(records: Sequence[Record]) -> HealthWarning | None:
    """The newest evaluation's held-back success is below step 0's on the same tasks, its whole 95 %
    interval under 0: whatever the training reward says, training has made the policy worse on tasks it
    does not train on, by more than the evaluation's noise."""
    gained = [r for r in records if _number(r, GAIN) is not None and _number(r, f"{GAIN}_high") is not None]
    if not gained or _number(gained[-1], f"{GAIN}_high") >= 0:
        return None
    last = gained[-1]
    return HealthWarning(
        "held_back_below_start", int(last.get("step", _step(records))),
        f"held-back success is below the start's: {last[GAIN] * 100:+.1f} pts since step 0, 95% interval "
        f"[{last[f'{GAIN}_low'] * 100:+.1f}, {last[f'{GAIN}_high'] * 100:+.1f}] over the same tasks",
        "training is making the policy worse on tasks it does not train on: read the latest transcripts for a "
        "shortcut, keep the best held-back weights (--save-best eval/success), or lower --lr",
    )


def _window_start(length: int, evals: list[int]) -> int:
    """Where the records the checks need begin, of `length` with evaluations at indices `evals`: the last
    HISTORY, or more, back to the steps before the HELD_BACK_EVALS-th last evaluation that score it."""
    start = length - HISTORY
    if evals:
        start = min(start, evals[-HELD_BACK_EVALS:][0] - RECENT_STEPS + 1)
    return max(0, start)


def kept_history(records: list[Record]) -> list[Record]:
    """The tail of `records` the checks need (`_window_start`)."""
    evals = [i for i, record in enumerate(records) if _number(record, HELD_BACK) is not None]
    return records[_window_start(len(records), evals):]


HEALTH_CHECKS: tuple[Callable[[Sequence[Record]], HealthWarning | None], ...] = (
    no_learning_signal, low_score, entropy_collapse, unstable_gradients, rising_errors, shortcut,
    truncated_out_of_the_loss, off_policy_mask_takes_most, held_back_below_start,
)


def check_health(records: Sequence[Record]) -> list[HealthWarning]:
    """Every check that fires on the history as it stands: HEALTH_CHECKS on its last HISTORY records,
    `held_back_falls` on all of it (`kept_history`: back to the evaluations it compares)."""
    found = [check(records[-HISTORY:]) for check in HEALTH_CHECKS] + [held_back_falls(records)]
    return [w for w in found if w is not None]


def _news(shown: HealthWarning | None, warning: HealthWarning) -> bool:
    """Whether `warning` is worth printing after `shown`, the one of its kind printed before: none was, or
    it brings a detail the first did not have."""
    return shown is None or (not shown.detail and bool(warning.detail))


def first_warnings(records: Sequence[Record]) -> list[HealthWarning]:
    """Replay a finished run: each kind of warning at the first step where it fired (where a detail came
    later, the warning as it was then, as training printed it last)."""
    found: dict[str, HealthWarning] = {}
    evals: list[int] = []
    for end in range(1, len(records) + 1):
        if _number(records[end - 1], HELD_BACK) is not None:
            evals.append(end - 1)
        for warning in check_health(records[_window_start(end, evals):end]):
            if _news(found.get(warning.key), warning):
                found[warning.key] = warning
    return sorted(found.values(), key=lambda w: w.step)


class HealthCallback(TrainerCallback):
    """Checks the history at each logging step and prints each kind of warning once (once more when a later
    look adds its detail: the probe a shortcut's replies came to resemble)."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False, emoji=False)
        self.history: list[Record] = []
        self.shown: dict[str, HealthWarning] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        self.history.append({"step": state.global_step, **logs})
        self.history = kept_history(self.history)
        for warning in check_health(self.history):
            if not _news(self.shown.get(warning.key), warning):
                continue
            self.shown[warning.key] = warning
            self.console.print(f"[yellow]warning:[/yellow] {escape(warning.line())}")
