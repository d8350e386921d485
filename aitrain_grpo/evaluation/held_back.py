"""Held-back evaluation during training, as a trainer callback: `--eval-every N` plays `--eval-episodes`
held-back tasks (held_back_play.py: `aitrain eval`'s own `evaluate`) before step 1 and at the end of every
N-th optimizer step, and logs what it measured into the run's metrics.

- When: `on_train_begin` of a fresh run (step 0: the weights before training), then `on_step_end` of each
  step that is a multiple of N. A resumed run does not evaluate before its first step: its checkpoint's
  step was evaluated, if it was a multiple of N, by the run it resumes.
- With what: the run's engine's backend where it plays the trainer's current weights (hf: TRL's model,
  opened as a training rollout opens it). A vLLM generator holds the weights of the step's start until the
  next rollout syncs it, which needs the trainer, which a callback is not given: there the evaluation
  plays Hugging Face generate on the callback's `model` (the current weights; slower than vLLM).
- What: `eval/mean_score`, `eval/success`, `eval/pass@k` (k = --eval-num-generations), `eval/turns`,
  `eval/tool_errors`, `eval/truncated` (counts, as `aitrain eval`'s table shows them), `time/eval_s` (the
  evaluation's wall time, outside the step's phases) and, every step, `time/elapsed_s` (wall seconds since
  the run began, a resumed run going on from its checkpoint's; report.html draws held-back success against
  it). A step's numbers go into the run's metrics sink and that step is logged (`control.should_log`), so
  they reach its metrics.jsonl record, trackers, the health checks and the report; step 0's, before any
  step is logged, is a metrics.jsonl record of its own (`{"step": 0, "eval/...": ...}`), which trackers and
  the live health checks do not see. One line is printed per evaluation.
- `--save-best METRIC`: after each evaluation, best_checkpoint.py keeps the weights if they are the best.

Several processes: each evaluates its share of the tasks and all get the whole numbers (held_back_play.py);
the main process writes and prints.

Left out: playing and scoring (held_back_play.py, evaluate.py), keeping the best weights
(best_checkpoint.py), the held-back health warning (runlog/health.py), the report's chart (runlog/report.py).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.backends.choice import build_backend
from aitrain_grpo.evaluation.best_checkpoint import BestCheckpoint
from aitrain_grpo.evaluation.held_back_play import HeldBackTasks
from aitrain_grpo.option_rules import eval_metrics
from aitrain_grpo.runlog.records import append_jsonl, read_jsonl

ELAPSED = "time/elapsed_s"


def held_back_callbacks(config: RunConfig, rollout, output_dir: str | Path) -> list[TrainerCallback]:
    """The run's held-back evaluation (none without --eval-every)."""
    return [HeldBackEvaluation(config, rollout, output_dir)] if config.eval_every else []


def elapsed_before(metrics_path: Path, step: int) -> float:
    """A resumed run's wall time so far: `time/elapsed_s` of its last record at or before `step`."""
    if step <= 0:
        return 0.0
    values = [r[ELAPSED] for r in read_jsonl(metrics_path)
              if isinstance(r.get("step"), int) and r["step"] <= step and isinstance(r.get(ELAPSED), (int, float))]
    return float(values[-1]) if values else 0.0


def eval_line(step: int, metrics: dict[str, float], samples: int, tasks: int, seconds: float) -> str:
    names = list(eval_metrics(samples))
    score, success, pass_k, turns, tool_errors, truncated = (metrics[name] for name in names)
    return (f"held-back eval at step {step}: success {success:.1%}, mean score {score:.3f}, pass@{samples} "
            f"{pass_k:.1%}, turns {turns:.2f}, tool errors {int(tool_errors)}, truncated {int(truncated)} "
            f"({tasks} tasks x {samples}, {seconds:.1f} s)")


class HeldBackEvaluation(TrainerCallback):
    """See the module docstring. `rollout` is the run's `TrainingRollout` (training/rollout/training_rollout.py): its
    engine plays, and its metrics sink (`rollout.metrics`) takes the numbers."""

    def __init__(self, config: RunConfig, rollout, output_dir: str | Path):
        self.every = config.eval_every
        self.rollout = rollout
        self.sink = rollout.metrics
        self.output_dir = Path(output_dir)
        self.tasks = HeldBackTasks(config)
        self.best = None
        if config.save_best:
            self.best = BestCheckpoint(self.output_dir, config.save_best,
                                       eval_metrics(config.eval_num_generations)[config.save_best])
        self.started = time.time()

    # --------------------------------------------------------------------------------- events

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.started = time.time() - elapsed_before(self.output_dir / "metrics.jsonl", state.global_step)
        if state.global_step > 0:  # resumed
            if self.best is not None:
                self.best.resume(state.global_step)
            return
        metrics = self.evaluate(0, state, model, processing_class)
        if state.is_world_process_zero:
            append_jsonl(self.output_dir / "metrics.jsonl", [{"step": 0, **metrics, ELAPSED: self.elapsed()}])

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        step = state.global_step
        if step % self.every == 0:
            self.sink.update(self.evaluate(step, state, model, processing_class))
            control.should_log = True  # this step's record holds them
        self.sink.update({ELAPSED: self.elapsed()})
        return control

    # ------------------------------------------------------------------------------ evaluation

    def elapsed(self) -> float:
        return time.time() - self.started

    def evaluate(self, step: int, state, model, tokenizer) -> dict[str, float]:
        """Play the held-back tasks with the current weights; their metrics and `time/eval_s`."""
        from accelerate import PartialState  # the process's rank and the run's size

        started = time.perf_counter()
        process = PartialState()
        result = self.tasks.play(self.backend(model, tokenizer), tokenizer, model,
                                 rank=process.process_index, world=process.num_processes)
        metrics = self.tasks.metrics(result)
        metrics["time/eval_s"] = seconds = time.perf_counter() - started
        main = state.is_world_process_zero
        if main:
            if self.tasks.note:
                print(self.tasks.note, flush=True)
                self.tasks.note = None
            print(eval_line(step, metrics, self.tasks.samples, len(self.tasks.rows or []), seconds), flush=True)
        if self.best is not None and self.best.offer(step, metrics, model, tokenizer, write=main) and main:
            print(f"{self.best.describe()}: kept in {self.best.folder}", flush=True)
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    def backend(self, model, tokenizer) -> Any:
        """The run's engine's backend where it plays the current weights (no weight sync: hf), else
        Hugging Face generate on `model` (module docstring)."""
        parts = self.rollout.parts
        if parts is not None and parts.weight_sync is None:
            return parts.engine.backend
        return build_backend("hf", model=model, tokenizer=tokenizer)
