"""`RunPlan`: what a training run decides once, before loading anything, and passes down.

A run's generation backend (and how a vLLM server gets new weights), the shape of its batches, the
checkpoint it resumes from and its output directory are each worked out once here; the trainer, the
rollout and `train` read the plan instead of asking the config again. `plan_run` also hides the GPUs of a local vLLM server from
training first, since that must happen before CUDA is first asked about (and choosing the backend asks).

Left out: checking that a vLLM server answers (generation.check_server, run once by `build_trainer`)
and preparing the output directory (checkpoints.prepare_output_dir); what resume and --overwrite may do
to the folder (run/folder.py) and the folder's lock (run/lock.py) are called from here.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.models.loading import check_model_option
from aitrain_grpo.runlog.files import check_tracker_installed
from aitrain_grpo.training.rollout.async_steps import check_async_supported
from aitrain_grpo.training.rollout.engine_choice import EngineChoice, choose_engine
from aitrain_grpo.training.run.folder import (check_output_dir_for_run, check_overwrite_target, check_resume_has_steps_left,
                                              resume_note, schedule_note, with_fresh_default_output_dir)
from aitrain_grpo.training.rollout.generation import (GenerationPlan, colocate_rendezvous_port, plan_generation,
                                                      reserve_server_gpus)
from aitrain_grpo.training.step.micro_batches import BatchShape
from aitrain_grpo.training.run.lock import claim_output_dir


@dataclass(frozen=True)
class RunPlan:
    generation: GenerationPlan
    resume: Path | None  # the checkpoint to resume from; None for a fresh start
    output_dir: Path
    config: RunConfig  # the options the run uses: the caller's, with the output folder it really writes to
    batch: BatchShape  # episodes a forward/backward pass, passes a step
    engine: EngineChoice | None = None  # the engine chosen by default (None: the run named one)


def plan_run(config: RunConfig) -> RunPlan:
    """Validate `config` and decide the run's plan; a bad option or an output directory that would be
    clobbered is a `ConfigError`. A default output folder that holds an earlier run, or that a live run
    holds, is replaced by the next numbered one (said on stderr). The last step locks the output folder
    for this run (run/lock.py), once every refusal has had its say."""
    config = config.validate()
    batch = BatchShape.of(config)  # a micro-batch that does not divide the batch is refused here, not after loading
    check_model_option(config.model)
    check_tracker_installed(config.report_to)  # before run_config.json or anything else is written
    movable = not (config.output_dir or config.resume_from_checkpoint or config.overwrite)
    config, note = with_fresh_default_output_dir(config)
    config, engine = choose_engine(config)  # a server URL is chosen before CUDA is asked about
    reserve_server_gpus(config)  # before anything starts CUDA
    check_distributed_engine()
    generation = plan_generation(config)
    colocate_rendezvous_port(generation)  # before TRL's engine picks 29500 (rollout/generation.py)
    check_async_supported(config, generation.sync)
    resume = check_output_dir_for_run(config)
    check_resume_has_steps_left(config, resume)
    notes = [note, resume_note(config, resume), schedule_note(config, resume), check_overwrite_target(config, resume)]
    config, moved = claim_output_dir(config, movable=movable)
    if os.environ.get("RANK", "0") == "0":
        for line in (*notes, moved):
            if line:
                print(line, file=sys.stderr, flush=True)
    return RunPlan(generation=generation, resume=resume, output_dir=config.resolved_output_dir(), config=config,
                   batch=batch, engine=engine)


def check_distributed_engine() -> None:
    """Refuse `accelerate launch` with FSDP where there is no CUDA. accelerate 1.15 attaches its FSDP
    plugin only to GPU-type devices (accelerate/state.py, `AcceleratorState.__init__`); on a CPU the state
    is MULTI_CPU and the run would train as plain DDP, sharding nothing, without a word. torch's own
    FSDP2 works on a CPU with gloo: accelerate is what stops it (docs/operations.md)."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not torch.cuda.is_available():
        raise ConfigError(
            "FSDP needs CUDA: on a CPU-only machine accelerate would train plain DDP and shard nothing; launch "
            "with examples/accelerate/cpu2.yaml (DDP over gloo), or DeepSpeed ZeRO (pip install deepspeed; "
            "examples/accelerate/zero3.yaml --num_processes 2 --mixed_precision no)"
        )
