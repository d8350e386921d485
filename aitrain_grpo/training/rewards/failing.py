"""A reward that keeps failing stops the run (`FailureBound`, `RewardFailing`), instead of training without it
(a reward function abstains on a batch it fails) or on `--rl-judge-fallback` (a judge) to its end.

Why: a failed call (an exception in a `--rl-reward-funcs` function, an HTTP error or an unreadable reply
from the judge) is right to absorb now and then; but a source that fails every call left the run training
without that signal, after a single warning, and exiting 0.

What counts: each batch a source scores reports its calls and how many failed (a reward function: one call a
batch; the judge, `Judge.score` in rewards/judge.py: its calls, cache hits not counted). FAILED_BATCHES
batches in a row in which every call failed raise `RewardFailing`, one line naming the source, the last
failure and the fix; run/stopping.py's `clean_stops` turns it into a stop with a checkpoint of the last
finished step and exit 1. A batch with one call that scored starts the count again.

Left out: a bound on the share of failed calls (a source that fails half its calls still gives a signal),
retries, and several processes: each process scores its own episodes, so one process stops while the
others wait for it in the step's collectives, up to `--ddp-timeout`.
"""

from __future__ import annotations

FAILED_BATCHES = 3  # batches in a row whose every call failed, before the run stops


class RewardFailing(BaseException):
    """Every call of a reward source in FAILED_BATCHES batches in a row failed; the message is one line for
    the user. Not an `Exception`, as run/signals.py's `StepAbandoned` is not: the reward wrapper
    (rewards/functions.py), which turns a function's exception into an abstention, must let it end the step."""


class FailureBound:
    """Counts the batches in a row in which every call of one source failed; see the module docstring.
    `source` names it ("the judge at URL", "reward function mod:f"), `instead` what the run would have
    trained on, `fix` what to do."""

    def __init__(self, source: str, instead: str, fix: str, batches: int = FAILED_BATCHES):
        self.source, self.instead, self.fix, self.batches = source, instead, fix, batches
        self.failed_in_a_row = 0

    def record(self, calls: int, failures: int, last_failure: str = "") -> None:
        """One batch's calls and failed calls; raises `RewardFailing` once the bound is reached."""
        if calls == 0:
            return
        self.failed_in_a_row = self.failed_in_a_row + 1 if failures == calls else 0
        if self.failed_in_a_row >= self.batches:
            raise RewardFailing(
                f"{self.source} failed every call of {self.failed_in_a_row} batches in a row (last: {last_failure}); "
                f"the run stopped rather than {self.instead}; {self.fix}, then resume")
