"""Trainer callbacks that write a run's files, and `training_callbacks`, the set `build_trainer` registers.

Files in the output directory, written by the main process only (under several processes, the episode
files hold the main process's share of each batch):
- `metrics.jsonl`: one JSON object per logged training step: `step`, TRL's `reward` and `reward_std`,
  loss, KL, entropy, grad_norm, and every `env/*` value the rollout logged.
- `scores.jsonl`: every episode score of every step (`{"step", "scores"}`), for the score distribution.
- `episodes.jsonl`: at step 1 and every `--log-episodes-every` steps, a sample of whole episodes (the
  best and worst of the batch and random others): messages, score, turns, error, step.
- `report.html`: regenerated whenever episodes are sampled and at the end of training (report.py).

A resumed run starts these files again from its checkpoint's step: records of later steps, which the
resumed run is about to redo, are dropped when training begins.

Left out: the console (progress.py), health warnings (health.py) and the page itself (report.py).
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
from pathlib import Path
from typing import Any

from rich.console import Console
from transformers import TrainerCallback

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError

# The packages transformers' integrations import for each --report-to value (any one of them will do),
# and the install command to suggest.
TRACKER_PACKAGES = {
    "tensorboard": (("tensorboard", "tensorboardX"), "pip install tensorboard"),
    "wandb": (("wandb",), "pip install wandb"),
    "trackio": (("trackio",), "pip install trackio"),
}


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("a") as f:
        for record in records:
            f.write(json.dumps(record, default=str) + "\n")


def drop_records_after(path: Path, step: int) -> None:
    """Keep only the records of steps up to `step` (all of them go for a fresh run, step 0)."""
    if not path.exists():
        return
    if step <= 0:
        path.unlink()
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by the crash being resumed from
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


class MetricsFileCallback(TrainerCallback):
    """Appends each training log (not the end-of-run summary) to `<output_dir>/metrics.jsonl`."""

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / "metrics.jsonl"

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            drop_records_after(self.path, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        _append(self.path, [{"step": state.global_step, **{k: _clean(v) for k, v in logs.items()}}])


def sample_indices(scores: list[float], count: int, rng: random.Random) -> list[int]:
    """Which episodes of a batch to keep: the best, the worst, then random others; in batch order."""
    if count >= len(scores):
        return list(range(len(scores)))
    by_score = sorted(range(len(scores)), key=lambda i: scores[i])
    picked = [by_score[-1], by_score[0]][:count]
    rest = [i for i in range(len(scores)) if i not in picked]
    picked += rng.sample(rest, count - len(picked))
    return sorted(picked)


class EpisodeLogCallback(TrainerCallback):
    """Writes each step's scores to `scores.jsonl` and, every `every` steps, sampled whole episodes to
    `episodes.jsonl`. Reads the step's episodes from `trainer.last_rollout` (set by the rollout
    function), so it needs the trainer: `bind_trainer` hands it over once the trainer exists."""

    def __init__(self, output_dir: str | Path, every: int, count: int, group_size: int, seed: int = 0):
        self.episodes_path = Path(output_dir) / "episodes.jsonl"
        self.scores_path = Path(output_dir) / "scores.jsonl"
        self.every, self.count, self.group_size = every, count, max(group_size, 1)
        self.rng = random.Random(seed)
        self.trainer = None
        self._last_batch = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            for path in (self.episodes_path, self.scores_path):
                drop_records_after(path, state.global_step)

    def wants_episodes(self, step: int) -> bool:
        return bool(self.every and self.count) and (step == 1 or step % self.every == 0)

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or self.trainer is None:
            return
        batch = getattr(self.trainer, "last_rollout", None)
        if batch is None or batch is self._last_batch:  # no new rollout this step
            return
        self._last_batch = batch
        from aitrain_grpo.runlog.report import episode_record

        step = state.global_step
        scores = batch.scores
        _append(self.scores_path, [{"step": step, "scores": [round(s, 4) for s in scores]}])
        if self.wants_episodes(step):
            _append(self.episodes_path, [
                episode_record(batch.episodes[i], step=step, index=i, group=i // self.group_size)
                for i in sample_indices(scores, self.count, self.rng)
            ])


class ReportCallback(TrainerCallback):
    """Regenerates `report.html` when episodes were sampled (after the step's metrics are written) and
    at the end of training. A report that fails to render is a warning, never a failed run."""

    def __init__(self, output_dir: str | Path, every: int, console: Console):
        self.output_dir = Path(output_dir)
        self.every = every
        self.console = console
        self.failed = False

    def _write(self) -> None:
        from aitrain_grpo.runlog.report import write_report

        try:
            write_report(self.output_dir)
        except Exception as exc:  # the run matters more than its report
            if not self.failed:
                self.console.print(f"warning: could not write report.html: {type(exc).__name__}: {exc}", markup=False)
            self.failed = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        step = state.global_step
        if state.is_world_process_zero and logs and "reward" in logs and self.every and (step == 1 or step % self.every == 0):
            self._write()

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._write()


def check_tracker_installed(report_to: str) -> None:
    """A one-line error instead of transformers' traceback when `--report-to X` lacks its package."""
    if report_to not in TRACKER_PACKAGES:
        return
    packages, install = TRACKER_PACKAGES[report_to]
    if not any(importlib.util.find_spec(p) is not None for p in packages):
        raise ConfigError(f"--report-to {report_to} needs the {' or '.join(packages)} package, which is not installed; "
                          f"run `{install}` or pass --report-to none")


def training_callbacks(config: RunConfig, output_dir: str | Path) -> list[TrainerCallback]:
    """The callbacks of a training run, in the order they must run: files first, then the console
    (progress and health share one console so warnings print above the progress bar), then the report."""
    from aitrain_grpo.runlog.health import HealthCallback
    from aitrain_grpo.runlog.progress import TrainingProgress

    check_tracker_installed(config.report_to)
    console = Console(highlight=False, soft_wrap=True)
    return [
        MetricsFileCallback(output_dir),
        EpisodeLogCallback(output_dir, config.log_episodes_every, config.log_episodes_count,
                           config.rl_num_generations, seed=config.seed),
        TrainingProgress(console),
        HealthCallback(console),
        ReportCallback(output_dir, config.log_episodes_every, console),
    ]


def bind_trainer(trainer) -> None:
    """Give the callbacks that read the trainer's rollouts their trainer (callbacks are created first)."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, EpisodeLogCallback):
            callback.trainer = trainer
