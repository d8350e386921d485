"""Step timing and memory peaks as a trainer callback: transformers' step events start, advance and
stop the step's phase clock and its memory peaks, and the step's numbers go into the run's metrics
sink (step_metrics.py) when the step ends.

What each phase holds, and the clock itself, are training's (training/step/phases.py: `PhaseClock`);
this callback only knows the events transformers gives every trainer:
- `on_step_begin`: peaks start afresh; the clock starts in `score` (TRL's batch preparation, until the
  trainer's first `compute_loss` moves it on);
- `on_pre_optimizer_step`: every micro-batch's forward and backward are done: the loss peak is marked,
  the clock moves to `optimizer_step`;
- `on_step_end`: the optimizer peak is marked; the work registered to close each step runs inside the
  clock (`close_steps_with`: the held-back evaluation, evaluation/held_back.py, which at a step it
  evaluates charges its time to the `eval` phase and marks its peak); then `time/<phase>_s`, `time/step_s`
  and `memory/*` (runlog/memory.py) go into the sink.
The rollout, which runs inside `score`, times itself with `phase("rollout")` and marks its own peak
(`mark("rollout")`); the trainer's forward hooks and `compute_loss` advance `clock` directly.
A step that plays no rollout (the later updates on one batch under `--rl-num-iterations`) counts 0
generation and environment seconds, so that a log averaging several steps shows them per step as it shows
`time/rollout_s`.

Why the evaluation is registered here rather than timed by its own callback's `on_step_end`: transformers
calls each callback's `on_step_end` in turn, and this one, first so that the step's edges are measured
before the others do their work, has stopped the clock by the time a later one runs. Registered, the
evaluation is inside the step's clock whatever the callbacks' order, and its cost is a phase that
`time/step_s` adds up, in every engine (a vLLM run's evaluation includes its weight sync).

Left out: time outside a step (logging, checkpoints, the evaluation before step 1, which its callback times
itself) and anything written to a file (the sink's values reach metrics.jsonl through the trainer's log).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Protocol

from transformers import TrainerCallback

from aitrain_grpo.runlog.memory import StepPeaks
from aitrain_grpo.runlog.step_metrics import StepMetrics


class Clock(Protocol):
    """What the callback needs of a phase clock (training/step/phases.py's `PhaseClock`)."""

    def start(self, base: str = "score") -> None: ...

    def base(self, phase: str) -> None: ...

    def phase(self, name: str | None) -> ContextManager[None]: ...

    def stop(self) -> dict[str, float]: ...


class StepTiming(TrainerCallback):
    """The step's phase clock and memory peaks, written into `sink` at each step's end; see the module
    docstring. The trainer places it first among the run's callbacks, so a step's edges are measured
    before the other callbacks do their work there."""

    def __init__(self, sink: StepMetrics, clock: Clock) -> None:
        self.sink = sink
        self.clock = clock
        self.peaks = StepPeaks()
        self.closing: list[Callable[..., Any]] = []

    def close_steps_with(self, work: Callable[..., Any]) -> None:
        """At each step's end, after the optimizer step and before the clock stops, call `work(args, state,
        control, **kwargs)` (the arguments of `on_step_end`). Its time is charged to the phase in force
        (`optimizer_step`) unless it enters its own (`phase`), as it does only at the steps where it works,
        so that the phase is 0 at the others; it marks its own peak (`mark`)."""
        self.closing.append(work)

    def phase(self, name: str) -> ContextManager[None]:
        """Charge the time inside the block to the nested phase `name` (the rollout, the evaluation)."""
        return self.clock.phase(name)

    def mark(self, phase: str) -> None:
        """`phase` is over: its peak resident memory is the peak since the previous mark."""
        self.peaks.mark(phase)

    def on_step_begin(self, args, state, control, **kwargs):
        self.peaks.start()  # this step's own peaks (runlog/memory.py)
        self.clock.start("score")  # TRL's batch preparation, until the first compute_loss (trainer.py)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.peaks.mark("loss")  # every micro-batch's forward and backward are done
        self.clock.base("optimizer_step")

    def on_step_end(self, args, state, control, **kwargs: Any):
        self.peaks.mark("optimizer")
        for work in self.closing:
            work(args, state, control, **kwargs)
        phases = self.clock.stop()
        if phases.get("time/rollout_s") == 0.0:  # no rollout: a later update on a batch (--rl-num-iterations)
            phases.update({"time/generate_s": 0.0, "time/env_s": 0.0})  # averaged per step as rollout_s is
        self.sink.update({**phases, **self.peaks.metrics()})
        return control
