"""A judge that keeps failing stops the run (`FailureBound`, `JudgeFailing`), instead of training on
`--rl-judge-fallback` to its end.

Why: a failed judge call (an HTTP error, a timeout, a reply with no readable score) scores its episodes
the fallback, which is right for a call that fails now and then; but a judge that fails every call (a
server gone, a model that never writes the JSON) left the run training on that one constant, after a
single warning, and exiting 0.

What counts: each batch the judge scores (`Judge.score`, rewards/judge.py) reports its calls and how many
failed; cache hits are not calls, and a batch without calls changes nothing. FAILED_BATCHES batches in a
row in which every call failed raise `JudgeFailing`, one line naming the judge, the last failure and the
fix; run/stopping.py's `clean_stops` turns it into a stop with a checkpoint of the last finished step
and exit 1. A batch with one call that scored starts the count again.

Left out: a bound on the share of failed calls (a judge that fails half its calls still gives a signal),
retries, and several processes: each process judges its own episodes, so one process stops while the
others wait for it in the step's collectives, up to `--ddp-timeout`.
"""

from __future__ import annotations

FAILED_BATCHES = 3  # batches in a row whose every judge call failed, before the run stops


class JudgeFailing(BaseException):
    """Every judge call of FAILED_BATCHES batches in a row failed; the message is one line for the user. Not
    an `Exception`, as run/signals.py's `StepAbandoned` is not: the reward wrapper (rewards/functions.py),
    which turns a function's exception into an abstention, must let it end the step."""


class FailureBound:
    """Counts the batches in a row in which every judge call failed; see the module docstring."""

    def __init__(self, name: str = "", fallback: float = 0.0, batches: int = FAILED_BATCHES):
        self.name, self.fallback, self.batches = name, fallback, batches
        self.failed_in_a_row = 0

    def record(self, calls: int, failures: int, last_failure: str = "") -> None:
        """One batch's judge calls and failed calls; raises `JudgeFailing` once the bound is reached."""
        if calls == 0:
            return
        self.failed_in_a_row = self.failed_in_a_row + 1 if failures == calls else 0
        if self.failed_in_a_row >= self.batches:
            raise JudgeFailing(
                f"the judge{self.name} failed every call of {self.failed_in_a_row} batches in a row (last: "
                f"{last_failure}); the run stopped rather than train on --rl-judge-fallback {self.fallback:g}; "
                f"fix the judge (is it up? does its model write the JSON scores?), then resume")
