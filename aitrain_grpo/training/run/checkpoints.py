"""Checkpoints that are never half-written, and resuming a run from one.

HF Trainer's checkpointing already saves what a step needs to be repeated exactly: the model (or the
LoRA adapter), optimizer, scheduler, RNG states and `trainer_state.json` (global step, log history),
every `--save-steps`. On resume it fast-forwards the data loader past the batches already trained.
What this module adds:

- Write, then rename. transformers (5.17 here) writes straight into `checkpoint-N`, so a run killed during a
  save leaves a folder that looks like a checkpoint but is not. Here `checkpoint-N` is written as
  `.partial-checkpoint-N/checkpoint-N` and renamed into place once every file is there (a rename within
  one filesystem is atomic): a folder named `checkpoint-N` is always complete.
- `aitrain_state.json` in each checkpoint: the run's own counters (the error-rate window, episode
  totals), the difficulty curriculum's groups (`--rl-curriculum pools`, rollout/curriculum.py) and the settings
  that define what a step is, checked again on resume.
- The sampler position. TRL's `RepeatSampler` draws every epoch's order from one generator, so a run
  resumed in epoch k would replay epoch 0's order. `ResumableRepeatSampler` derives epoch k's order
  from the seed and k alone (the same order an uninterrupted run gets); HF Trainer's restored position
  (epoch, batches to skip) then yields the same prompts as the uninterrupted run.
- The moving reference. Under `--rl-ref-sync-steps` (TR-DPO, TRL's `SyncRefModelCallback`) the KL's
  reference model is no longer the start, and HF Trainer saves no reference: each checkpoint holds it
  as `reference_model.safetensors`, loaded back on resume, so a resumed run measures its KL against the
  reference the stopped one had (not the start's).
- `--resume-from-checkpoint auto|PATH` and `--save-total-limit` counted over complete checkpoints only.
  (What a run may do to its output folder is folder.py's; the per-step log files are cut back to the
  checkpoint's step by the callbacks that write them.)

Left out: durability against power loss (nothing is fsync'd; the case handled is a killed process),
and merging checkpoints of runs with different batch shapes (refused with a message instead).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from transformers.integrations import is_deepspeed_zero3_enabled

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.outputs import publish
from aitrain_grpo.training.trl.access import RepeatSampler, save_checkpoint

RUN_STATE_FILE = "aitrain_state.json"
PARTIAL_PREFIX = ".partial-"
# Files that mark a run as finished; removed when a run starts or resumes.
RUN_RESULTS = ["run_summary.json"]
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
# Options that change what one step consumes; a checkpoint only continues a run with the same ones.
STEP_SHAPE = ("batch_size", "rl_num_generations", "gradient_accumulation_steps", "seed")
# Options that change what the checkpoint's weights are: the model, the environment it learned, and the
# adapter's shape. A resume with another value would train one run's weights on another's task.
RUN_MEANING = ("model", "rl_env", "rl_env_module", "rl_env_class", "rl_env_config", "peft", "lora_r", "lora_alpha",
               "target_modules", "use_rslora", "use_dora", "lora_modules_to_save")
# The optimizer whose state the checkpoint holds: another cannot load it (SGD read AdamW's state and failed
# with a KeyError), and torch restores a state's constants with it, so a changed beta or weight decay would
# be replaced by the checkpoint's without a word.
OPTIMIZER_STATE = ("optim", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay")
# Options that change what the run trains on from one step to the next: the sequences its episodes become
# (the context strategy) and which prompts a batch gets (the curriculum, whose groups a checkpoint holds, and
# the dataset order, which the sampler position a checkpoint holds counts in).
# A resume under another value would change the run midway without saying so; so would another reference
# schedule (--rl-ref-sync-steps, whose reference the checkpoint holds).
RUN_COURSE = ("rl_context", "rl_curriculum", "shuffle_dataset", "rl_ref_sync_steps", "rl_ref_mixup_alpha")
# The moving reference's weights in a checkpoint (--rl-ref-sync-steps).
REFERENCE_FILE = "reference_model.safetensors"


# --------------------------------------------------------------------------------- finding checkpoints


def checkpoint_step(path: Path) -> int | None:
    match = _CHECKPOINT_NAME.match(path.name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    """A checkpoint folder this module finished writing (HF's state file and ours are both there)."""
    return (path / "trainer_state.json").is_file() and (path / RUN_STATE_FILE).is_file()


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete `checkpoint-N` folders of a run, oldest first."""
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None and is_complete(p)]
    return sorted(found, key=checkpoint_step)


def resume_checkpoint(config: RunConfig) -> Path | None:
    """The checkpoint `--resume-from-checkpoint` points at, or None for a fresh start. `auto` takes the
    newest complete checkpoint in the output directory (none there: a fresh start). A PATH must be a
    complete checkpoint; anything else is a `ConfigError`."""
    value = config.resume_from_checkpoint
    if not value:
        return None
    output_dir = config.resolved_output_dir()
    if value == "auto":
        found = complete_checkpoints(output_dir)
        path = found[-1] if found else None
    else:
        path = Path(value).expanduser()
        if not path.is_dir():
            raise ConfigError(
                f"--resume-from-checkpoint {value} {'is a file' if path.exists() else 'does not exist'}; pass auto (the "
                f"newest checkpoint in "
                f"--output-dir) or a checkpoint-N folder of an earlier run"
            )
        if not is_complete(path):
            inside = complete_checkpoints(path)
            if inside:
                raise ConfigError(
                    f"--resume-from-checkpoint {value} is a run folder, not a checkpoint; pass {inside[-1]} "
                    f"(its newest), or auto with --output-dir {value}"
                )
            from aitrain_grpo.evaluation.best_checkpoint import BEST_RECORD

            if (path / BEST_RECORD).is_file():  # best/: a model kept for its evaluation, no optimizer or step state
                raise ConfigError(
                    f"--resume-from-checkpoint {value} is the best model --save-best kept (weights only, no optimizer "
                    f"or step state); train on from it with --model {value} in a new --output-dir, or resume "
                    f"from a checkpoint-N folder")
            raise ConfigError(
                f"--resume-from-checkpoint {value} is not a complete checkpoint (no trainer_state.json and "
                f"{RUN_STATE_FILE}; it may have been cut off while saving); pick another checkpoint-N folder or auto"
            )
    if path is not None:
        _check_parts(path)
        _check_same_run(path, config)
        _check_same_best(Path(config.output_dir) if config.output_dir else path.parent, config.save_best)
    return path


# What a checkpoint holds besides the two state files `is_complete` looks for: the weights (an adapter, a
# full model, sharded or not) and the optimizer's state (one file, or DeepSpeed's and FSDP's folders).
_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "model.safetensors.index.json",
            "pytorch_model.bin", "pytorch_model.bin.index.json")
_SHARDED = ("global_step*", "pytorch_model_fsdp*", "optimizer_0*")


def _check_parts(path: Path) -> None:
    """Refuse a checkpoint missing its weights (transformers then raised "Can't find a valid checkpoint" as a
    traceback) or its optimizer state (the run went on with Adam's moments restarted, without a word)."""
    sharded = any(next(path.glob(pattern), None) for pattern in _SHARDED)
    missing = [what for what, there in (("its weights", sharded or any((path / n).is_file() for n in _WEIGHTS)),
                                        ("its optimizer state (optimizer.pt)", sharded or (path / "optimizer.pt").is_file()))
               if not there]
    if missing:
        raise ConfigError(f"checkpoint {path} lacks {' and '.join(missing)}, so it cannot be resumed as it was saved; "
                          f"pass an earlier checkpoint-N, or start a new run in another --output-dir")


def _check_same_best(output_dir: Path, metric: str | None) -> None:
    """Refuse a resume whose --save-best names another metric than the one `best/` holds the best of: the
    first evaluation would replace those weights with the best of the new metric, without a word."""
    from aitrain_grpo.evaluation.best_checkpoint import BEST_DIR, BEST_RECORD

    try:
        kept = json.loads((output_dir / BEST_DIR / BEST_RECORD).read_text())
    except (OSError, ValueError):
        return
    if metric is None or not isinstance(kept, dict) or kept.get("metric") in (None, metric):
        return
    value = kept.get("value")
    shown = f"{value:.4g}" if isinstance(value, (int, float)) else value
    raise ConfigError(f"{output_dir / BEST_DIR} holds the best {kept['metric']} ({shown} at step {kept.get('step')}), "
                      f"and this run keeps --save-best {metric}; resume with --save-best {kept['metric']}, or move "
                      f"{output_dir / BEST_DIR} away first to keep the best {metric} instead")


def _comparable(name: str, value: Any) -> Any:
    """A config value as run_config.json records it, for comparison (JSON text read as data)."""
    if name == "rl_env_config" and isinstance(value, str) and value.strip().startswith("{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value or None if name == "rl_env_config" else value


def _check_same_run(path: Path, config: RunConfig) -> None:
    """Refuse to continue checkpoint `path` with options that change what it means: the step shape it
    recorded, the model, environment and adapter of the run that wrote it (its run_config.json), its
    context strategy and curriculum, and the optimizer whose state it holds."""
    saved = dict(read_run_state(path).get("settings", {}))
    try:
        run_config = json.loads((path.parent / "run_config.json").read_text())
    except (OSError, ValueError):
        run_config = {}
    checked = (*RUN_MEANING, *RUN_COURSE, *OPTIMIZER_STATE)
    saved.update({name: run_config[name] for name in checked if name in run_config})
    for name in (*STEP_SHAPE, *checked):
        if name in saved and _comparable(name, saved[name]) != _comparable(name, getattr(config, name)):
            flag = "--" + name.replace("_", "-")
            trained = f"with {flag} {_shown(saved[name])}" if saved[name] is not None else f"without {flag}"
            raise ConfigError(
                f"checkpoint {path} was trained {trained}, this run has {flag} {_shown(getattr(config, name))}; "
                f"resume {trained}, or start a new run in another --output-dir"
            )


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read_run_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / RUN_STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------------------- the trainer


class ResumableRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler (the attributes read here are pinned in trl/access.py) whose epoch-e order is
    the (e+1)-th draw of a generator seeded afresh: the order TRL gives an uninterrupted run,
    reproducible from the epoch number alone. HF Trainer calls `set_epoch` before each epoch,
    including the first one after a resume."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed)
            for _ in range(self.epoch):  # the draws of the epochs before this one
                torch.randperm(self.num_samples, generator=self.generator)
        return super().__iter__()


def resumable_sampler(sampler):
    """TRL's `RepeatSampler` re-classed as `ResumableRepeatSampler` (re-classed rather than rebuilt, so it
    keeps whatever arguments TRL gave it); any other sampler as it is."""
    if type(sampler) is RepeatSampler:
        sampler.__class__ = ResumableRepeatSampler
    return sampler


@contextlib.contextmanager
def plain_cpu_device(args):
    """While loading a checkpoint's optimizer: `args.device` as plain `cpu`. Several CPU processes
    (accelerate's MULTI_CPU) each get `cpu:<rank>`, which HF Trainer passes to `torch.load` as
    `map_location` when the world is larger than one, and torch restores no storage to `cpu:0`
    ("don't know how to restore data location"): a resumed multi-process CPU run died there. `cpu`
    and `cpu:N` are the same memory, so nothing else changes. The device is transformers' cached
    `_setup_devices` (TrainingArguments.device reads it); it is put back afterwards."""
    device = args.__dict__.get("_setup_devices")
    if not isinstance(device, torch.device) or device.type != "cpu" or device.index is None:
        yield
        return
    args.__dict__["_setup_devices"] = torch.device("cpu")
    try:
        yield
    finally:
        args.__dict__["_setup_devices"] = device


def save_checkpoint_atomically(trainer, run, save) -> None:
    """Write the checkpoint of `trainer`'s step into a staging folder (`save(staging)`: the trainer's own
    save, transformers' `_save_checkpoint` writing there: trl/hooks.py), add the run's own state (`run`: the
    RunContext), and rename it into place whole: a killed run never leaves a checkpoint a resume could
    half-read."""
    run_dir = Path(trainer.args.output_dir)
    name = f"checkpoint-{trainer.state.global_step}"
    staging = run_dir / f"{PARTIAL_PREFIX}{name}"
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    save(staging)  # every rank writes its part (RNG state, shards)
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        written = staging / name
        state = {
            "global_step": trainer.state.global_step,
            # The run's own options (not TRL's per-device batch, which is the micro-batch).
            "settings": {key: getattr(run.config, key) for key in STEP_SHAPE},
            "parts": {key: cb.state_dict() for key, cb in trainer.stateful_callbacks().items()},
        }
        if run.curriculum is not None:  # --rl-curriculum pools (rollout/curriculum.py)
            state["curriculum"] = run.curriculum.state_dict()
        reference = moving_reference(trainer)
        if reference is not None:
            save_model(reference, str(written / REFERENCE_FILE))  # shared (tied) tensors stored once
        (written / RUN_STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        # The same step may be saved twice (a stop right after a scheduled save): publish replaces it.
        publish(written, run_dir / name)
        shutil.rmtree(staging, ignore_errors=True)
        trainer.keep_newest_checkpoints(run_dir)
    trainer.accelerator.wait_for_everyone()


def moving_reference(trainer):
    """The reference model `--rl-ref-sync-steps` moves (TRL's `sync_ref_model`), unwrapped; None where the
    reference stays the start, or is the adapter switched off; None too under ZeRO-3 and FSDP, whose sharded
    reference would need gathering to save (left out: there a resumed run's reference restarts from the start)."""
    if not getattr(trainer.args, "sync_ref_model", False) or getattr(trainer, "ref_model", None) is None:
        return None
    if is_deepspeed_zero3_enabled() or getattr(trainer, "is_fsdp_enabled", False):
        return None
    return trainer.accelerator.unwrap_model(trainer.ref_model)


def restore_reference(trainer, checkpoint: Path) -> None:
    """Load the moving reference a checkpoint holds into `trainer`'s reference model (every process reads it)."""
    reference = moving_reference(trainer)
    if reference is None:
        return
    if (checkpoint / REFERENCE_FILE).is_file():
        load_model(reference, str(checkpoint / REFERENCE_FILE))
    elif trainer.accelerator.is_main_process:
        print(f"note: {checkpoint} holds no reference model ({REFERENCE_FILE}), so the KL's reference restarts "
              f"from the start model instead of where --rl-ref-sync-steps had moved it", flush=True)


class AtomicCheckpoints:
    """Mixin for the GRPOTrainer subclass: the run's own counters saved and restored with each
    checkpoint (callbacks with a `run_state_key` attribute and `state_dict()` / `load_state_dict()`),
    checkpoint rotation, and a checkpoint saved outside the training loop. The private overrides that
    write checkpoints atomically and resume the sampler in place are in trl/hooks.py."""

    def stateful_callbacks(self) -> dict[str, Any]:
        return {cb.run_state_key: cb for cb in self.callback_handler.callbacks if hasattr(cb, "run_state_key")}

    def keep_newest_checkpoints(self, run_dir: Path) -> None:
        # Not HF's rotation: it counts any folder named checkpoint-N, so a broken one with a high
        # step number would survive and push out good ones.
        limit = self.args.save_total_limit
        if not limit or limit < 1:
            return
        for old in complete_checkpoints(run_dir)[:-limit]:
            shutil.rmtree(old, ignore_errors=True)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint:
            state = read_run_state(Path(resume_from_checkpoint))
            parts = state.get("parts", {})
            for key, cb in self.stateful_callbacks().items():
                if key in parts:
                    cb.load_state_dict(parts[key])
            # The curriculum's groups: loaded by curriculum.curriculum_of when it makes the curriculum.
            self.run.resumed_curriculum = state.get("curriculum")
            if self.run.curriculum is not None and self.run.resumed_curriculum is not None:
                self.run.curriculum.load_state_dict(self.run.resumed_curriculum)
            restore_reference(self, Path(resume_from_checkpoint))
            if self.accelerator.is_main_process:
                print(f"resuming from {resume_from_checkpoint} (step {state.get('global_step', '?')})", flush=True)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def save_checkpoint_now(self) -> Path | None:
        """Save a checkpoint of the last finished step outside the training loop (after a fault that
        ended `train()`); returns it, or None when no step has finished."""
        step = self.state.global_step
        if step < 1:
            return None
        path = Path(self.args.output_dir) / f"checkpoint-{step}"
        if not is_complete(path):
            save_checkpoint(self)
        return path
