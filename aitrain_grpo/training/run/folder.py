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
- `--overwrite` replaces only a run of the same environment: an export, a tiny model, or another
  environment's run is refused, naming what is there; an allowed overwrite says what it removes.

Left out: the lock that keeps two live runs out of one folder (run/lock.py), and the folder rules every
command shares (outputs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.outputs import describe_kind, folder_kind
from aitrain_grpo.training.run.checkpoints import checkpoint_step, complete_checkpoints

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
