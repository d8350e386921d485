"""Where a training step's wall time goes, phase by phase, so that each phase can be set against the
same work done bare (benchmarks/step_limit.py) and a slow phase is named in metrics.jsonl.

A step is, in order (TRL 1.16's GRPOTrainer on a generation step):
- `rollout`: the rollout function plays the batch's episodes (rollout/training_rollout.py; with --rl-async-steps,
  the wait for episodes played ahead);
- `score`: the step's batch made around the rollout and the reference forward (step/flow.py): rewards,
  group advantages, sequence records, TRL's tensors, metrics, and the split into micro-batches;
- `ref_logprobs`: the scoring forwards (step/flow.py `scoring_passes`): the reference model's
  log-probabilities for the KL term (`--rl-kl-coef` > 0) and, where a batch trains over several
  optimizer steps, the old policy's;
- `loss_forward_backward`: every micro-batch's loss forward and backward (and the gradient clipping
  that follows the last one: milliseconds for a LoRA adapter);
- `optimizer_step`: the optimizer step, the learning-rate schedule and zeroing the gradients;
- `eval`: the held-back evaluation (`--eval-every`, evaluation/held_back.py) at a step it falls on,
  after the optimizer step and before the step ends (0 at every other step).
Each gets `time/<phase>_s` in the step's metrics; they add up to `time/step_s` (from transformers'
`on_step_begin` to `on_step_end`). A step that reuses an earlier batch (TRL's num_iterations > 1)
has no rollout, score or reference time.

`PhaseClock` charges the time since the last change to the phase in force: a base phase set by the
step's events (`score` from `on_step_begin` and the optimizer from `on_pre_optimizer_step`, both in the
step timing callback, runlog/step_timing.py, which also writes the metrics; the loss from the trainer's
first `compute_loss`), and nested phases entered around a call by the code that makes it (`phase`: the
rollout, the scoring forwards, both in step/flow.py; the held-back evaluation, which the step timing
callback's `on_step_end` runs before it stops the clock). Nesting is what lets `score` hold `rollout` and
`ref_logprobs` without counting them twice.

Left out: time outside a step (logging, checkpoints, the evaluation before step 1), and any split inside
the loss pass (forward against backward would need a hook inside autograd; the bare profile measures them
together).
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

PHASES = ("rollout", "score", "ref_logprobs", "loss_forward_backward", "optimizer_step", "eval")


class PhaseClock:
    """Seconds per phase of the step under way: `start()` at the step's beginning, `base(phase)` when
    the step moves on, `phase(name)` around a nested part, `stop()` at the end for the metrics. Outside
    a step (`start` not called, or after `stop`) every call does nothing. `clock` is the time source:
    wall time; a profile on a shared machine may count the process's CPU time instead."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self._running = False
        self._stack: list[str] = []
        self._since = 0.0
        self.seconds: dict[str, float] = {}

    @property
    def current(self) -> str | None:
        """The phase time is charged to now (None outside a step)."""
        return self._stack[-1] if self._running else None

    def start(self, base: str = "score") -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._stack = [base]
        self._since = self.clock()
        self._running = True

    def _charge(self) -> None:
        now = self.clock()
        self.seconds[self._stack[-1]] = self.seconds.get(self._stack[-1], 0.0) + now - self._since
        self._since = now

    def base(self, phase: str) -> None:
        """The step's outer phase from now on (nested phases under way keep the clock until they end)."""
        if self._running:
            self._charge()
            self._stack[0] = phase

    @contextlib.contextmanager
    def phase(self, name: str | None) -> Iterator[None]:
        """Charge the time inside the block to `name` (None: leave the phase in force)."""
        if not self._running or name is None:
            yield
            return
        self.enter(name)
        try:
            yield
        finally:
            self.leave(name)

    def enter(self, name: str) -> None:
        if self._running:
            self._charge()
            self._stack.append(name)

    def leave(self, name: str) -> None:
        """End the nested phase `name` if it is the one in force (a step restarted meanwhile: nothing)."""
        if self._running and len(self._stack) > 1 and self._stack[-1] == name:
            self._charge()
            self._stack.pop()

    def stop(self) -> dict[str, float]:
        """`time/<phase>_s` for every phase and `time/step_s`, their sum; the clock stops."""
        if not self._running:
            return {}
        self._charge()
        self._running = False
        metrics = {f"time/{phase}_s": seconds for phase, seconds in self.seconds.items()}
        metrics["time/step_s"] = sum(self.seconds.values())
        return metrics
