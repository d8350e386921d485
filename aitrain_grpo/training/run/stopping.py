"""Stopping a run early and cleanly: too many failing episodes, a dead generation backend, a signal.

A fault inside one episode never stops training (engine/runner.py gives it score 0 and an error). A run
stops early only when:

- the share of failed episodes over the last `window` (4) steps is above `--rl-max-error-rate`
  (0.5; 1.0 never stops). `ErrorRateStop` counts the errors of each step's episodes (gathered across
  processes, so every process decides the same; the training rollout hands it each batch's
  `EpisodeSummary`s) and, from the step where the window is full, asks HF
  Trainer to save a checkpoint and stop; the message names the three most common errors. The first
  10 distinct errors are also printed as they appear, so a user sees them long before any bound is hit;
- the generation backend raises `GenerationBackendError`: for vLLM servers, no server came back within
  `--vllm-server-timeout` (a lost server is replaced or waited for by the server pool,
  engine/backends/server_pool.py), or one refused a request: a checkpoint of the last finished step is
  saved and the message names the server;
- SIGINT/SIGTERM arrive (run/signals.py): the step in progress is dropped (`StepAbandoned`) and the last
  finished one saved, or, inside a span that must finish (the optimizer step, a save), that step is saved;
- the judge (`--rl-judge-rubric`) or a `--rl-reward-funcs` function failed every call of 3 batches in a row
  (`RewardFailing`, training/rewards/failing.py): a checkpoint of the last finished step is saved, exit 1;
- the next step would end past `--max-time` (run/time_limit.py): its last step is saved, exit 0.

`clean_stops(trainer)` wraps `trainer.train()` and turns each of these into `TrainingStopped`, which
carries the exit code and the lines the CLI prints (what happened, where the checkpoint is, how to go on).
It finds the two stopping callbacks among the trainer's callbacks (`callback_handler`, transformers' API).

Left out: retrying failed episodes, and waiting for servers (the server pool's job; it raises
`GenerationBackendError` once its wait is over).
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, TypeVar

from transformers import TrainerCallback

from aitrain_grpo.engine.backends.base import GenerationBackendError
from aitrain_grpo.engine.stats import EpisodeSummary
from aitrain_grpo.errors import one_line
from aitrain_grpo.training.rewards.failing import RewardFailing
from aitrain_grpo.training.run.signals import SignalStop, StepAbandoned, abandon_step
from aitrain_grpo.training.run.time_limit import TimeLimit

EXIT_FAULT = 1
ANNOUNCED_ERRORS = 10  # distinct episode errors printed as they first appear
_MAX_SHOWN = 160  # characters of one error in a message


class TrainingStopped(Exception):
    """Training stopped before its end. `lines` are for the user; `exit_code` for the shell."""

    def __init__(self, reason: str, exit_code: int, checkpoint: Path | None, *, is_error: bool = True,
                 hurried: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code
        self.checkpoint = checkpoint
        self.is_error = is_error
        self.hurried = hurried  # a signal's sender kills the job soon: exit without the interpreter's teardown

    def lines(self, argv: list[str] | None = None) -> list[str]:
        """What to print: the reason on one line, then where the checkpoint is and how to resume
        (a command built from `argv`, the arguments after `aitrain`)."""
        first = f"error: {self.reason}" if self.is_error else self.reason
        if self.checkpoint is None:
            return [first + "; no step had finished, so there is no checkpoint to resume from"]
        lines = [first, f"checkpoint saved: {self.checkpoint}"]
        if argv is not None:
            lines.append(f"resume with: {resume_command(argv)}")
        return lines


def resume_command(argv: list[str]) -> str:
    """`aitrain ARGS` with `--resume-from-checkpoint auto` in place of any earlier resume or overwrite."""
    kept: list[str] = []
    skip_next = False
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        if arg == "--resume-from-checkpoint":
            skip_next = True
            continue
        if arg.startswith("--resume-from-checkpoint=") or arg == "--overwrite":
            continue
        kept.append(arg)
    return shlex.join(["aitrain", *kept, "--resume-from-checkpoint", "auto"])


@dataclass
class StepErrors:
    """The episodes of one finished step (all processes'), and how many failed with which message."""

    step: int = 0
    episodes: int = 0
    errors: int = 0
    messages: dict[str, int] = field(default_factory=dict)


class ErrorRateStop(TrainerCallback):
    """Stops the run when too many episodes fail; see the module docstring."""

    run_state_key = "error_rate"

    def __init__(self, max_rate: float = 0.5, window: int = 4, stream=None):
        self.max_rate = max_rate
        self.window_size = window
        self.stream = stream or sys.stderr
        self.announce = True
        self.window: deque[StepErrors] = deque(maxlen=window)  # one entry per finished step
        self._pending = StepErrors()
        self.seen: list[str] = []  # distinct messages already printed
        self.episodes_total = 0
        self.errors_total = 0
        self.triggered: str | None = None

    def observe(self, summaries: list[EpisodeSummary]) -> None:
        """Record one rollout's episode summaries (all processes' episodes)."""
        pending = self._pending
        pending.episodes += len(summaries)
        for summary in summaries:
            if not summary.error:
                continue
            message = one_line(summary.error, _MAX_SHOWN)
            pending.errors += 1
            pending.messages[message] = pending.messages.get(message, 0) + 1
            if message not in self.seen and len(self.seen) < ANNOUNCED_ERRORS:
                self.seen.append(message)
                if self.announce:
                    more = " (further new errors are not printed)" if len(self.seen) == ANNOUNCED_ERRORS else ""
                    print(f"environment error (episode scored 0): {message}{more}", file=self.stream, flush=True)

    def on_train_begin(self, args, state, control, **kwargs):
        self.announce = state.is_world_process_zero

    def on_step_end(self, args, state, control, **kwargs):
        finished, self._pending = self._pending, StepErrors()
        if finished.episodes == 0:  # a micro-step without a rollout (generation batches reused)
            return control
        finished.step = state.global_step
        self.window.append(finished)
        self.episodes_total += finished.episodes
        self.errors_total += finished.errors
        if len(self.window) < self.window_size and state.global_step < state.max_steps:
            return control  # a short run is judged on all its steps at its last one
        total = sum(entry.episodes for entry in self.window)
        failed = sum(entry.errors for entry in self.window)
        if total and failed / total > self.max_rate:
            counts: Counter[str] = Counter()
            for entry in self.window:
                counts.update(entry.messages)
            common = "; ".join(f"({n}x) {message}" for message, n in counts.most_common(3))
            first, last = self.window[0].step, self.window[-1].step
            self.triggered = (
                f"{failed} of {total} episodes failed in steps {first}-{last} ({failed / total:.0%}), above "
                f"--rl-max-error-rate {self.max_rate:g}; most common: {common}; fix the environment, or raise "
                f"--rl-max-error-rate (1 never stops)"
            )
            control.should_save = True
            control.should_training_stop = True
        return control

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": [asdict(entry) for entry in self.window],
            "seen": self.seen,
            "episodes_total": self.episodes_total,
            "errors_total": self.errors_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Checkpoints from before StepErrors stored each entry as a list [step, episodes, errors, {message: count}].
        self.window = deque((StepErrors(*entry) if isinstance(entry, (list, tuple)) else StepErrors(**entry)
                             for entry in state.get("window", [])), maxlen=self.window_size)
        self.seen = list(state.get("seen", []))
        self.episodes_total = int(state.get("episodes_total", 0))
        self.errors_total = int(state.get("errors_total", 0))


Callback = TypeVar("Callback", bound=TrainerCallback)


def _find(trainer, kind: type[Callback]) -> Callback | None:
    return next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, kind)), None)


def _checkpoint_of_last_step(trainer) -> Path | None:
    path = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
    return path if path.is_dir() else None


@contextlib.contextmanager
def clean_stops(trainer) -> Iterator[None]:
    """Wrap `trainer.train()`: raise `TrainingStopped` when it ended early for one of the reasons above."""
    signals = _find(trainer, SignalStop)
    errors = _find(trainer, ErrorRateStop)
    limit = _find(trainer, TimeLimit)
    if signals is not None:
        signals.install()
    try:
        yield
    except StepAbandoned as exc:
        checkpoint = abandon_step(trainer, signals)
        replayed = ", which a resume plays again" if checkpoint is not None else ""
        raise TrainingStopped(
            f"stopped by {signal.Signals(exc.signum).name} during step {trainer.state.global_step + 1}{replayed}",
            signals.exit_code,
            checkpoint,
            is_error=False,
            hurried=True,
        ) from None
    except GenerationBackendError as exc:
        checkpoint = trainer.save_checkpoint_now()
        raise TrainingStopped(
            f"generation backend failed at step {trainer.state.global_step + 1}: {one_line(exc, _MAX_SHOWN)}; "
            f"check that the server is up, then resume",
            EXIT_FAULT,
            checkpoint,
        ) from exc
    except RewardFailing as exc:
        raise TrainingStopped(str(exc), EXIT_FAULT, trainer.save_checkpoint_now()) from exc
    finally:
        if signals is not None:
            signals.uninstall()
    finished = trainer.state.max_steps > 0 and trainer.state.global_step >= trainer.state.max_steps
    if signals is not None and signals.received is not None and not finished:
        name = signal.Signals(signals.received).name
        raise TrainingStopped(
            f"stopped by {name} after step {trainer.state.global_step}",
            signals.exit_code,
            _checkpoint_of_last_step(trainer),
            is_error=False,
            hurried=True,
        )
    if errors is not None and errors.triggered:
        raise TrainingStopped(errors.triggered, EXIT_FAULT, _checkpoint_of_last_step(trainer))
    if limit is not None and limit.reached:  # --max-time: a planned stop, exit 0
        raise TrainingStopped(limit.reached, 0, _checkpoint_of_last_step(trainer), is_error=False)
