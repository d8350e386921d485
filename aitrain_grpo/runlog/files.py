"""Trainer callbacks that write a run's files, and `training_callbacks`, the set `build_trainer` registers.

Files in the output directory, written by the main process only (under several processes, the episode
files hold the main process's share of each batch):
- `metrics.jsonl`: one JSON object per logged training step: `step`, TRL's `reward` and `reward_std`,
  loss, KL, entropy, grad_norm, and every `env/*` value the rollout logged.
- `scores.jsonl`: every episode score of every step (`{"step", "scores"}`), for the score distribution.
- `episodes.jsonl`: at step 1 and every `--log-episodes-every` steps, a sample of whole episodes (the
  best and worst of the batch and random others) in `records.episode_record`'s format: messages, score,
  turns, why the episode stopped, error, step; in an `--rl-async-steps` run also `weight_version` (the
  optimizer steps the weights it was sampled with had taken) and `staleness` (steps behind the trainer).
- `report.html`: regenerated whenever episodes are sampled and at the end of training (report.py).

A resumed run starts these files again from its checkpoint's step: records of later steps, which the
resumed run is about to redo, are dropped when training begins.

Left out: the console (progress.py), health warnings (health.py), the page itself (report.py) and the
record formats (records.py).
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Protocol

from rich.console import Console
from transformers import TrainerCallback

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.rollout import RolloutBatch
from aitrain_grpo.errors import ConfigError, describe_exception
from aitrain_grpo.runlog.health import HealthCallback
from aitrain_grpo.runlog.progress import TrainingProgress
from aitrain_grpo.runlog.records import EPISODES_FILE, METRICS_FILE, SCORES_FILE, append_jsonl, drop_records_after, episode_record
from aitrain_grpo.runlog.report import write_report

# The packages transformers' integrations import for each --report-to value (any one of them will do),
# and the install command to suggest.
TRACKER_PACKAGES = {
    "tensorboard": (("tensorboard", "tensorboardX"), "pip install tensorboard"),
    "wandb": (("wandb",), "pip install wandb"),
    "trackio": (("trackio",), "pip install trackio"),
}


class MetricsFileCallback(TrainerCallback):
    """Appends each training log (not the end-of-run summary) to `<output_dir>/metrics.jsonl`."""

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / METRICS_FILE

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            drop_records_after(self.path, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        append_jsonl(self.path, [{"step": state.global_step, **logs}])


def sample_indices(scores: list[float], count: int, rng: random.Random) -> list[int]:
    """Which episodes of a batch to keep: the best, the worst, then random others; in batch order."""
    if count >= len(scores):
        return list(range(len(scores)))
    by_score = sorted(range(len(scores)), key=lambda i: scores[i])
    picked = [by_score[-1], by_score[0]][:count]
    rest = [i for i in range(len(scores)) if i not in picked]
    picked += rng.sample(rest, count - len(picked))
    return sorted(picked)


class RolloutSource(Protocol):
    """What the episode log reads: the training rollout (training/rollout/training_rollout.py), which keeps the batch it
    played last (this process's episodes)."""

    @property
    def last_batch(self) -> RolloutBatch | None: ...

    # Per episode of last_batch, the optimizer steps its sampling weights had taken (async runs; else None).
    last_weight_versions: list[int] | None


def weight_fields(version: int, step: int) -> dict[str, int]:
    """An async run's episode: the weights it was sampled with (optimizer steps they had taken) and how
    many steps behind the weights that step `step` (1-based) trained from they were."""
    return {"weight_version": version, "staleness": step - 1 - version}


class EpisodeLogCallback(TrainerCallback):
    """Writes each step's scores to `scores.jsonl` and, every `every` steps, sampled whole episodes to
    `episodes.jsonl`, reading the step's episodes from the rollout it is given."""

    def __init__(self, output_dir: str | Path, rollout: RolloutSource, every: int, count: int, group_size: int,
                 seed: int = 0):
        self.episodes_path = Path(output_dir) / EPISODES_FILE
        self.scores_path = Path(output_dir) / SCORES_FILE
        self.rollout = rollout
        self.every, self.count, self.group_size = every, count, max(group_size, 1)
        self.rng = random.Random(seed)
        self._last_batch: RolloutBatch | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            for path in (self.episodes_path, self.scores_path):
                drop_records_after(path, state.global_step)

    def wants_episodes(self, step: int) -> bool:
        return bool(self.every and self.count) and (step == 1 or step % self.every == 0)

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        batch = self.rollout.last_batch
        if batch is None or batch is self._last_batch:  # no new rollout this step
            return
        self._last_batch = batch
        step = state.global_step
        scores = batch.scores
        append_jsonl(self.scores_path, [{"step": step, "scores": [round(s, 4) for s in scores]}])
        if self.wants_episodes(step):
            versions = getattr(self.rollout, "last_weight_versions", None)
            append_jsonl(self.episodes_path, [
                episode_record(batch.episodes[i], step=step, index=i, group=i // self.group_size,
                               **({} if versions is None else weight_fields(versions[i], step)))
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

    def write(self) -> None:
        """Render the page now (also called once more after run_summary.json exists, for the runtime)."""
        try:
            write_report(self.output_dir)
        except Exception as exc:  # the run matters more than its report
            if not self.failed:
                self.console.print(f"warning: could not write report.html: {describe_exception(exc)}", markup=False)
            self.failed = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        step = state.global_step
        if state.is_world_process_zero and logs and "reward" in logs and self.every and (step == 1 or step % self.every == 0):
            self.write()

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.write()


def check_tracker_installed(report_to: str) -> None:
    """A one-line error instead of transformers' traceback when `--report-to X` lacks its package."""
    if report_to not in TRACKER_PACKAGES:
        return
    packages, install = TRACKER_PACKAGES[report_to]
    if not any(importlib.util.find_spec(p) is not None for p in packages):
        raise ConfigError(f"--report-to {report_to} needs the {' or '.join(packages)} package, which is not installed; "
                          f"run `{install}` or pass --report-to none")


def training_callbacks(config: RunConfig, output_dir: str | Path, rollout: RolloutSource) -> list[TrainerCallback]:
    """The callbacks of a training run, in the order they must run: files first, then the console
    (progress and health share one console so warnings print above the progress bar), then the report."""
    check_tracker_installed(config.report_to)
    console = Console(highlight=False, soft_wrap=True, emoji=False)
    return [
        MetricsFileCallback(output_dir),
        EpisodeLogCallback(output_dir, rollout, config.log_episodes_every, config.log_episodes_count,
                           config.rl_num_generations, seed=config.seed),
        TrainingProgress(console),
        HealthCallback(console),
        ReportCallback(output_dir, config.log_episodes_every, console),
    ]
