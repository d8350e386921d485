"""Held-back evaluation during training, as a trainer callback: `--eval-every N` plays `--eval-episodes`
held-back tasks (held_back_play.py: `aitrain eval`'s own `evaluate`) before step 1 and at the end of every
N-th optimizer step, and logs what it measured into the run's metrics.

- When: `on_train_begin` of a fresh run (step 0: the weights before training), then at the end of each
  step that is a multiple of N, after its optimizer step. A resumed run does not evaluate before its first
  step: its checkpoint's step was evaluated, if it was a multiple of N, by the run it resumes.
- With what: the run's engine (rollout/parts.py `evaluation_backend`). Hugging Face generate plays the
  trainer's model itself. A vLLM engine (colocated, or a server pool synced through a folder) holds the
  weights of the step's start until a sync: the evaluation syncs it first through the run's own weight
  sync, which then leaves the next rollout nothing to sync (it syncs only weights it has not synced). So
  a vLLM run's evaluation plays what `aitrain eval --use-vllm` plays on the saved weights. Where the engine
  cannot play the current weights between steps (--rl-async-steps, whose server weights belong to the
  steps played ahead; a colocated engine over a tensor-parallel group), it plays Hugging Face generate on
  the callback's `model` (the current weights; slower). The printed line names the engine that played.
  A server pool counts the evaluation's requests and tokens in the next step's `vllm/*` numbers; only the
  colocated engine is tested against `aitrain eval --use-vllm` (tests/test_held_back_vllm.py), a server
  plays through the same sync and backend the rollout uses.
- Its cost: a step's evaluation is that step's `eval` phase (training/step/phases.py): the step timing
  callback (runlog/step_timing.py) runs it inside the step's clock (`close_steps_with`), so `time/eval_s`,
  the sync included, is one of the phases `time/step_s` adds up (0 at steps without one), in every
  engine. The evaluation before step 1 is outside any step: its own wall time is its record's `time/eval_s`.
- What: `eval/mean_score`, `eval/success`, `eval/pass@k` (k = --eval-num-generations), `eval/turns`,
  `eval/tool_errors`, `eval/truncated`, `eval/errors` (counts, as `aitrain eval`'s table shows them; the
  line names the most common environment error, and when every episode of the evaluation before step 1
  raised, the run stops there in one line: an evaluation environment that cannot play would give
  `--save-best` nothing but zeros); from the second
  evaluation on `eval/success_gain` with `eval/success_gain_low` and `_high` (success minus the first
  evaluation's on the same tasks, with a 95 % interval paired by task: evaluation/paired.py; the printed
  line says it and whether it is a tie) and `eval/score_gain` (the same for the mean score, which moves
  where success is rare); and, every step,
  `time/elapsed_s` (wall seconds since the run began, a resumed run going on from its checkpoint's;
  report.html draws held-back success against it). A step's numbers go into the run's metrics sink and
  that step is logged (`control.should_log`), so they reach its metrics.jsonl record, trackers, the health
  checks and the report; step 0's, before any step is logged, is a metrics.jsonl record of its own
  (`{"step": 0, "eval/...": ...}`), which trackers and the live health checks do not see. One line is
  printed per evaluation.
- `--save-best METRIC`: after each evaluation, best_checkpoint.py keeps the weights if they are the best;
  `--eval-patience N` stops the run once the best is N evaluations old (HF's early stopping), as a finished
  run whose run_summary.json says why (`stopped_early`).

Several processes: each evaluates its share of the tasks and all get the whole numbers (held_back_play.py);
the main process writes and prints.

Left out: playing and scoring (held_back_play.py, evaluate.py), keeping the best weights
(best_checkpoint.py), the held-back health warning (runlog/health.py), the report's chart (runlog/report.py).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.backends.choice import build_backend
from aitrain_grpo.engine.stats import SUCCESS
from aitrain_grpo.evaluation.best_checkpoint import BestCheckpoint
from aitrain_grpo.evaluation.evaluate import check_not_all_failed
from aitrain_grpo.evaluation.held_back_play import HeldBackTasks
from aitrain_grpo.evaluation.paired import PairedDifference, paired_difference
from aitrain_grpo.option_rules import eval_metrics
from aitrain_grpo.runlog.records import METRICS_FILE, append_jsonl, read_jsonl

if TYPE_CHECKING:
    from aitrain_grpo.runlog.step_timing import StepTiming
    from aitrain_grpo.training.run.context import RunContext

ELAPSED = "time/elapsed_s"
GAIN = "eval/success_gain"  # held-back success minus the first evaluation's, paired by task; _low/_high: its 95 % interval
SCORE_GAIN = "eval/score_gain"  # the same for the mean score
HF_GENERATE = "Hugging Face generate"


def held_back_callbacks(run: "RunContext") -> list[TrainerCallback]:
    """The run's held-back evaluation (none without --eval-every): a callback for the evaluation before
    step 1, and the end of every step registered with the run's step timing, whose `eval` phase it is."""
    if not run.config.eval_every:
        return []
    evaluation = HeldBackEvaluation(run.config, run.rollout, run.plan.output_dir, timing=run.timing)
    run.timing.close_steps_with(evaluation.at_step_end)
    return [evaluation]


def stopped_early(trainer) -> dict[str, str]:
    """`{"stopped_early": why}` for run_summary.json when --eval-patience ended the run, else nothing."""
    reasons = [cb.stopped_early for cb in trainer.callback_handler.callbacks
               if isinstance(cb, HeldBackEvaluation) and cb.stopped_early]
    return {"stopped_early": reasons[0]} if reasons else {}


def elapsed_before(metrics_path: Path, step: int) -> float:
    """A resumed run's wall time so far: `time/elapsed_s` of its last record at or before `step`."""
    if step <= 0:
        return 0.0
    values = [r[ELAPSED] for r in read_jsonl(metrics_path)
              if isinstance(r.get("step"), int) and r["step"] <= step and isinstance(r.get(ELAPSED), (int, float))]
    return float(values[-1]) if values else 0.0


HELD_BACK_FIX = ("fix the environment the evaluation plays (--eval-env-config, or --eval-env-module/--eval-env-class; "
                 "`aitrain env check` with them names where it raised)")


def eval_line(step: int, metrics: dict[str, float], samples: int, tasks: int, seconds: float,
              engine: str = HF_GENERATE) -> str:
    names = list(eval_metrics(samples))
    score, success, pass_k, turns, tool_errors, truncated, errors = (metrics[name] for name in names)
    return (f"held-back eval at step {step}: success {success:.1%}, mean score {score:.3f}, pass@{samples} "
            f"{pass_k:.1%}, turns {turns:.2f}, tool errors {int(tool_errors)}, truncated {int(truncated)}, "
            f"environment errors {int(errors)} ({tasks} tasks x {samples}, {engine}, {seconds:.1f} s)")


class HeldBackEvaluation(TrainerCallback):
    """See the module docstring. `rollout` is the run's `TrainingRollout` (training/rollout/training_rollout.py): its
    parts' engine plays (`parts.evaluation_backend()`), and its metrics sink (`rollout.metrics`) takes the
    numbers. `at_step_end` is what the step timing runs at each step's end (`held_back_callbacks`), and
    `timing` that step timing (runlog/step_timing.py; None: a caller that only calls `evaluate`). The
    first evaluation's per-task scores are kept with each checkpoint (`run_state_key`), so a resumed run
    still says its gain since the start."""

    run_state_key = "held_back"

    def __init__(self, config: RunConfig, rollout, output_dir: str | Path, *, timing: "StepTiming | None" = None):
        self.every = config.eval_every
        self.timing = timing
        self.rollout = rollout
        self.sink = rollout.metrics
        self.output_dir = Path(output_dir)
        self.tasks = HeldBackTasks(config)
        self.best = None
        if config.save_best:
            self.best = BestCheckpoint(self.output_dir, config.save_best,
                                       eval_metrics(config.eval_num_generations)[config.save_best])
        self.started = time.time()
        self.start: list[tuple[int, float]] | None = None  # (task, score) of each episode of step 0's evaluation
        self.patience = config.eval_patience  # evaluations without a better --save-best value before the run stops
        self.stopped_early: str | None = None  # why the run stopped for it

    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = [(int(task), float(score)) for task, score in state.get("start") or []] or None

    # --------------------------------------------------------------------------------- events

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.started = time.time() - elapsed_before(self.output_dir / METRICS_FILE, state.global_step)
        if state.global_step > 0:  # resumed
            if self.best is not None:
                self.best.resume(state.global_step)
            return
        metrics = self.evaluate(0, state, model, processing_class)
        if state.is_world_process_zero:
            append_jsonl(self.output_dir / METRICS_FILE, [{"step": 0, **metrics, ELAPSED: self.elapsed()}])

    def at_step_end(self, args, state, control, model=None, processing_class=None, **kwargs) -> None:
        """At the end of a step, inside its clock: at a multiple of N, evaluate as the step's `eval` phase."""
        step = state.global_step
        if step % self.every == 0:
            with self.timing.phase("eval"):
                metrics = self.evaluate(step, state, model, processing_class)
            self.timing.mark("eval")  # the evaluation's own peak memory
            metrics.pop("time/eval_s", None)  # the step clock's `eval` phase says it, the sync included
            self.sink.update(metrics)
            control.should_log = True  # this step's record holds them
            if self.out_of_patience(step, state):
                control.should_training_stop = True
        self.sink.update({ELAPSED: self.elapsed()})

    # ------------------------------------------------------------------------------ evaluation

    def elapsed(self) -> float:
        return time.time() - self.started

    def evaluate(self, step: int, state, model, tokenizer) -> dict[str, float]:
        """Play the held-back tasks with the current weights; their metrics and `time/eval_s`."""
        from accelerate import PartialState  # the process's rank and the run's size

        started = time.perf_counter()
        process = PartialState()
        backend, engine = self.backend(model, tokenizer)
        result = self.tasks.play(backend, tokenizer, model, rank=process.process_index, world=process.num_processes)
        # Every episode failing before step 1 stops the run (nothing trained yet); later, it is said.
        errors_note = check_not_all_failed(result, "held-back episodes", HELD_BACK_FIX, fatal=step == 0)
        metrics = self.tasks.metrics(result)
        metrics["time/eval_s"] = seconds = time.perf_counter() - started
        gains = self.gains(step, list(zip(result.tasks, result.scores)))
        for name, gain in gains.items():
            metrics.update({name: gain.mean, **({f"{name}_low": gain.low, f"{name}_high": gain.high}
                                                if gain.low is not None else {})})
        main = state.is_world_process_zero
        if main:
            if self.tasks.note:
                print(self.tasks.note, flush=True)
                self.tasks.note = None
            line = eval_line(step, metrics, self.tasks.samples, len(self.tasks.rows or []), seconds, engine)
            if gains:
                success, score = gains[GAIN], gains[SCORE_GAIN]
                said = {1: "up", 0: "no change shown", -1: "down"}
                line += (f"; since step 0: success {success.shown(scale=100, unit=' pts')} ({said[success.direction]}), "
                         f"mean score {score.shown()} ({said[score.direction]})")
            print(line, flush=True)
            if errors_note:
                print(errors_note, flush=True)
        if self.best is not None and self.best.offer(step, metrics, model, tokenizer, write=main) and main:
            print(f"{self.best.describe()}: kept in {self.best.folder}", flush=True)
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    def out_of_patience(self, step: int, state) -> bool:
        """--eval-patience: whether the best value is `patience` evaluations old (counted in steps, so that a
        resumed run, whose best comes back from best/best.json, counts on; not at the last step, which ends
        the run anyway); says why once, on the main process."""
        if not self.patience or self.best is None or self.best.step is None:
            return False
        if step - self.best.step < self.patience * self.every or step >= state.max_steps:
            return False
        self.stopped_early = (f"stopped early at step {step}: {self.best.metric} has not improved for {self.patience} "
                              f"evaluation{'s' if self.patience > 1 else ''} (--eval-patience); {self.best.describe()}, "
                              f"kept in {self.best.folder}")
        if state.is_world_process_zero:
            print(self.stopped_early, flush=True)
        return True

    def gains(self, step: int, played: list[tuple[int, float]]) -> dict[str, PairedDifference]:
        """Held-back success and mean score now against the first evaluation's, paired by task
        (evaluation/paired.py), from the second evaluation on; the first's scores are kept as the start."""
        if step == 0 or self.start is None:
            self.start = played if step == 0 else self.start
            return {}
        success = paired_difference("held-back success", played, self.start, value=lambda s: float(s >= SUCCESS))
        score = paired_difference("held-back mean score", played, self.start)
        return {GAIN: success, SCORE_GAIN: score} if success and score else {}

    def backend(self, model, tokenizer) -> tuple[Any, str]:
        """(backend, the engine's name for the printed line): the run's engine playing the current weights,
        synced first where it has a weight sync, else Hugging Face generate on `model` (module docstring)."""
        parts = self.rollout.parts
        backend = parts.evaluation_backend() if parts is not None else None
        if backend is not None:
            return backend, HF_GENERATE if parts.weight_sync is None else "vLLM"
        return build_backend("hf", model=model, tokenizer=tokenizer), HF_GENERATE
