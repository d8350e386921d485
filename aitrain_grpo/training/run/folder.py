"""What a training run may do to the folder it writes into, decided before anything loads or is written.

run/checkpoints.py already refuses to start afresh over an earlier run without `--overwrite`, and to resume
with options that change what a checkpoint means. This module adds the cases where either flag, taken at
its word, would destroy or rewrite work the user did not mean to touch:

- a resume with nothing left to do: `--resume-from-checkpoint auto --max-steps 1` on a run whose newest
  checkpoint is step 2 used to print `step 3/1`, exit 0 and rewrite the finished run's config, summary and
  report. It is refused, naming the checkpoint's step and the flag that would make it train on;
- `--resume-from-checkpoint auto` that finds no checkpoint starts fresh (HF Trainer raises instead, but only
  for its own `True`; `auto` here is the flag a restart script passes every time, so its first start must
  work), and says so in one note rather than silently;
- a resume that moves the run's last step under a decaying learning-rate schedule says that the rate jumps
  (HF Trainer lays the schedule out again over the new length);
- `--overwrite` replaces only a run of the same environment: an export, a tiny model, or another
  environment's run is refused, naming what is there; an allowed overwrite says what it removes.

Left out: the lock that keeps two live runs out of one folder (run/lock.py), and the folder rules every
command shares (outputs.py).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.outputs import check_can_be_created, describe_kind, folder_kind, has_entries, is_ours, special_folder
from aitrain_grpo.runlog.redaction import redact
from aitrain_grpo.training.run.checkpoints import (PARTIAL_PREFIX, RUN_RESULTS, checkpoint_step, complete_checkpoints,
                                                   resume_checkpoint)

# What fixes which environment a run learned; an --overwrite over a run with other values would discard
# another task's work.
ENVIRONMENT_FIELDS = ("rl_env", "rl_env_module", "rl_env_class")


def check_resume_has_steps_left(config: RunConfig, resume: Path | None) -> None:
    """Refuse a resume whose checkpoint already reached `--max-steps` (or, without it, the last step of the
    same `--epochs` its run planned: HF Trainer's `max_steps` in trainer_state.json): the trainer would
    train nothing, yet rewrite run_config.json, run_summary.json and the report of the finished run."""
    step = checkpoint_step(resume) if resume is not None else None
    if step is None:
        return
    resumed = f"--resume-from-checkpoint {config.resume_from_checkpoint} resumes {resume}, already at step {step}"
    if config.max_steps:
        if step >= config.max_steps:
            raise ConfigError(f"{resumed}, and --max-steps {config.max_steps} leaves nothing to train (the run's files "
                              f"would be rewritten); pass --max-steps above {step} to train on, or a new --output-dir "
                              f"for a new run")
        return
    planned = _read_json(resume / "trainer_state.json").get("max_steps")
    recorded = _recorded_config(resume.parent)
    same_length = recorded.get("max_steps") is None and recorded.get("epochs") == config.epochs
    if same_length and isinstance(planned, int) and 0 < planned <= step:
        raise ConfigError(f"{resumed}, the last of its --epochs {config.epochs:g}, so nothing is left to train (the "
                          f"run's files would be rewritten); pass --epochs above {config.epochs:g} or --max-steps above "
                          f"{step} to train on, or a new --output-dir for a new run")


def resume_note(config: RunConfig, resume: Path | None) -> str | None:
    """The note for `--resume-from-checkpoint auto` that found no checkpoint (a fresh start), else None."""
    if config.resume_from_checkpoint != "auto" or resume is not None:
        return None
    return (f"note: --resume-from-checkpoint auto found no checkpoint in {config.resolved_output_dir()}, so this "
            f"run starts fresh there")


def schedule_note(config: RunConfig, resume: Path | None) -> str | None:
    """A note for a resume that moves the run's last step (`--max-steps` other than its checkpoint's run
    planned) under a schedule that decays: HF Trainer lays the schedule out anew over the new length and
    keeps only its step count, so the learning rate jumps at the resume. None otherwise (a constant
    schedule, the same length, or a length given by `--epochs`, which is known only once the data is)."""
    if resume is None or config.lr_scheduler in ("constant", "constant_with_warmup") or not config.max_steps:
        return None
    planned = _read_json(resume / "trainer_state.json").get("max_steps")
    if not isinstance(planned, int) or planned <= 0 or planned == config.max_steps:
        return None
    return (f"note: {resume.name} comes from a run planned for {planned} steps and this one has {config.max_steps}: "
            f"--lr-scheduler {config.lr_scheduler} is laid out anew over {config.max_steps} steps, so the learning "
            f"rate jumps at step {checkpoint_step(resume)}; --lr-scheduler constant_with_warmup extends a run evenly")


def _read_json(path: Path) -> dict:
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def _recorded_config(folder: Path) -> dict:
    return _read_json(folder / "run_config.json")


def _environment_named(values: dict) -> str:
    if values.get("rl_env"):
        return f"--rl-env {values['rl_env']}"
    return f"{values.get('rl_env_module') or '?'}.{values.get('rl_env_class') or '?'}"


def check_overwrite_target(config: RunConfig, resume: Path | None) -> str | None:
    """With `--overwrite` (and no resume), refuse a folder that is not a run of this environment; return a
    note naming what the fresh start removes, or None when there is nothing to remove."""
    output_dir = config.resolved_output_dir()
    if not config.overwrite or resume is not None or not output_dir.is_dir():
        return None
    kind = folder_kind(output_dir)
    if kind in ("export", "tiny"):
        raise ConfigError(f"--output-dir {output_dir} holds {describe_kind(kind)}, not a training run, so --overwrite "
                          f"does not replace it; pass a new --output-dir")
    recorded = _recorded_config(output_dir)
    mine = {name: getattr(config, name) for name in ENVIRONMENT_FIELDS}
    theirs = {name: recorded.get(name) for name in ENVIRONMENT_FIELDS}
    if any(theirs.values()) and any(mine.values()) and theirs != mine:
        raise ConfigError(f"--output-dir {output_dir} holds a run of {_environment_named(theirs)}, not "
                          f"{_environment_named(mine)}, so --overwrite does not replace it; pass a new --output-dir")
    removed = [p.name for p in complete_checkpoints(output_dir)]
    if (output_dir / "run_summary.json").is_file():
        removed.append("run_summary.json")
    if not removed and not recorded:
        return None
    what = ", ".join(removed) if removed else "no checkpoints"
    return (f"note: --overwrite replaces the earlier run in {output_dir}: removes {what}; its logs start "
            f"again from step 1")


def check_output_dir_for_run(config: RunConfig) -> Path | None:
    """Refuse to clobber earlier work: a finished run, or an unfinished one with checkpoints, is only
    written over with `--overwrite` or continued with `--resume-from-checkpoint`. Returns the checkpoint
    to resume from (None: a fresh start)."""
    output_dir = config.resolved_output_dir()
    _check_can_be_created(output_dir)
    _check_is_a_run_folder(output_dir)
    resume = resume_checkpoint(config)
    if resume is not None or config.overwrite:
        return resume
    if (output_dir / "run_summary.json").exists():
        raise ConfigError(
            f"output directory {output_dir} already holds a finished run; pass --overwrite or choose "
            f"another --output-dir"
        )
    found = complete_checkpoints(output_dir)
    if found:
        raise ConfigError(
            f"output directory {output_dir} holds checkpoints of an unfinished run (newest: {found[-1].name}); "
            f"pass --resume-from-checkpoint auto to continue it, --overwrite to start over, or choose another --output-dir"
        )
    return None


def holds_run(folder: Path) -> bool:
    """Whether `folder` holds a run of ours: finished, with checkpoints, or started (run_config.json)."""
    return folder.is_dir() and (is_ours(folder) or bool(complete_checkpoints(folder)))


def with_fresh_default_output_dir(config: RunConfig) -> tuple[RunConfig, str | None]:
    """A run given no --output-dir whose default folder (outputs/<class>) holds an earlier run, and that
    neither resumes nor overwrites it, goes to the next free numbered folder (outputs/hotelenv-2, -3, ...)
    instead of failing, as many trainers do. Returns the config to run (a copy; the caller's is left
    alone) and a note saying where the run goes, or (config, None) when nothing changes."""
    if config.output_dir or config.resume_from_checkpoint or config.overwrite:
        return config, None
    base = config.resolved_output_dir()
    if not holds_run(base):
        return config, None
    number = 2
    while (candidate := base.with_name(f"{base.name}-{number}")).exists() and (
            not candidate.is_dir() or has_entries(candidate)):
        number += 1
    note = (f"note: {base} holds an earlier run, so this run writes to {candidate} (pass --output-dir to choose "
            f"the folder, or --overwrite to replace {base})")
    return dataclasses.replace(config, output_dir=str(candidate)), note


def _check_is_a_run_folder(output_dir: Path) -> None:
    """A run writes files with common names (README.md, config.json, ...) into its folder, so it goes
    only into a new or empty folder, or one of its own runs (outputs.py): never into the current
    or home folder, nor a folder of the user's files, whatever --overwrite says."""
    special = special_folder(output_dir)
    if special:
        raise ConfigError(f"--output-dir {output_dir} is {special}; pass a folder of its own, e.g. outputs/my-run")
    if output_dir.is_dir() and has_entries(output_dir) and not is_ours(output_dir) \
            and not complete_checkpoints(output_dir):
        raise ConfigError(f"--output-dir {output_dir} holds files this tool did not write (no run_config.json of its own), "
                          f"and a run writes model files into it; pass a new or empty folder")


def _check_can_be_created(output_dir: Path) -> None:
    """A one-line error, before anything loads, for an --output-dir that is a file or cannot be made."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"--output-dir {output_dir} is a file, not a folder; pass a folder path (it is created if missing)")
    check_can_be_created(output_dir, "--output-dir")


def write_run_config(output_dir: Path, config: RunConfig) -> None:
    """`run_config.json`: the run's options (secrets redacted), what eval and resume read and what marks the
    folder as this tool's (outputs.is_ours). Written before anything else a run puts there, so a run that
    fails after its first file (sft's demos.jsonl) leaves a folder the next run may use again."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "run_config.json").write_text(json.dumps(redact(config.to_dict()), indent=2, default=str) + "\n")


def drop_training_logs(output_dir: Path) -> None:
    """Before `sft` trains in a folder an earlier `grpo` run used (--overwrite): that run's per-step logs,
    report and best/ describe another training, and sft writes none of them to replace them. (A fresh `grpo`
    cuts its own logs back as it starts, runlog/files.py, and replaces best/ at its first evaluation.)"""
    from aitrain_grpo.evaluation.best_checkpoint import BEST_DIR
    from aitrain_grpo.runlog.records import STEP_LOGS
    from aitrain_grpo.runlog.report import REPORT_FILE

    for name in (*STEP_LOGS, REPORT_FILE):
        (output_dir / name).unlink(missing_ok=True)
    shutil.rmtree(output_dir / BEST_DIR, ignore_errors=True)


def prepare_output_dir(output_dir: Path, resume: Path | None) -> None:
    """Before training: drop saves that were cut off and the marks of a finished run; a fresh start
    also removes an earlier run's checkpoints (the caller has made sure the user allowed it). The
    per-step logs are cut back to the resumed step by the callbacks that write them (runlog/files.py)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for partial in output_dir.glob(f"{PARTIAL_PREFIX}checkpoint-*"):
        shutil.rmtree(partial, ignore_errors=True)  # never resumable
    for name in RUN_RESULTS:
        (output_dir / name).unlink(missing_ok=True)
    if resume is None:
        for old in output_dir.iterdir():
            if old.is_dir() and checkpoint_step(old) is not None:
                shutil.rmtree(old, ignore_errors=True)  # several processes may clear the same folder
