"""`train(config)`: RunConfig -> GRPOConfig + GRPOTrainer with the rollout engine as `rollout_func`.

TRL owns the algorithm (group-normalised advantages, the clipped loss over `env_mask == 1` tokens, KL,
the optimizer); this module only wires our pieces into it:
- the environment's dataset becomes `train_dataset`;
- `rollout_func` plays the episodes of each batch with the `RolloutEngine`;
- `episode_score` (the reward function) hands TRL the scores the engine computed.

TRL passes `rollout_func` only the prompts, but episodes need their whole dataset row (the columns
`score_episode` reads), so `EpisodeGRPOTrainer` keeps the batch's rows where the rollout can find them.

Left out: the console display and files written during training (callbacks.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.env.base import Environment
from aitrain_grpo.training.generation import check_server as check_vllm_server
from aitrain_grpo.training.generation import grpo_kwargs as generation_grpo_kwargs
from aitrain_grpo.training.generation import plan_generation, reserve_server_gpus, sampling_warning

TRAINING_OUTPUT_FILES = ("run_config.json", "metrics.jsonl")


def episode_score(prompts=None, completions=None, episode_score=None, **kwargs) -> list[float]:
    """Reward function: the environment's score of each episode, computed during the rollout."""
    if episode_score is None:
        raise RuntimeError("episode_score is missing from the rollout output; is rollout_func set?")
    return [float(s) for s in episode_score]


def _trainer_class():
    from trl import GRPOTrainer

    from aitrain_grpo.training.checkpoints import AtomicCheckpoints

    class EpisodeGRPOTrainer(AtomicCheckpoints, GRPOTrainer):
        """GRPOTrainer that remembers the dataset rows of the batch being rolled out (checkpointing:
        see checkpoints.py)."""

        rollout_rows: list[dict[str, Any]] = []
        rollout_observers: list = []  # called with each rollout's episode summaries (all processes')

        def _generate_and_score_completions(self, inputs):
            self.rollout_rows = [dict(row) for row in inputs]
            return super()._generate_and_score_completions(inputs)

    return EpisodeGRPOTrainer


def grpo_config(config: RunConfig, output_dir: Path):
    """Translate RunConfig into TRL's GRPOConfig, with CPU-friendly settings where there is no CUDA."""
    from trl import GRPOConfig

    on_cpu = not torch.cuda.is_available()
    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir),
        learning_rate=config.lr,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_generations=config.rl_num_generations,
        max_completion_length=config.rl_max_completion_length,
        temperature=config.rl_temperature if config.rl_temperature > 0 else 1.0,
        top_k=config.rl_top_k,
        top_p=config.rl_top_p,
        beta=config.rl_kl_coef,
        epsilon=config.rl_clip_range,
        entropy_coef=config.rl_entropy_coef,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps or -1,
        seed=config.seed,
        logging_steps=config.logging_steps,
        save_strategy="steps" if config.save_steps else "no",
        save_steps=config.save_steps or 500,
        save_total_limit=config.save_total_limit,
        report_to=[] if config.report_to == "none" else [config.report_to],
        remove_unused_columns=False,  # episodes need every column of their row
        disable_tqdm=True,
        log_completions=False,
    )
    kwargs.update(generation_grpo_kwargs(config, plan_generation(config)))
    if config.rl_loss_type:
        kwargs["loss_type"] = config.rl_loss_type
    if on_cpu:
        # TRL's defaults assume a GPU; on a CPU they are slower (checkpointing) or unsupported (bf16).
        checkpointing = "activation_checkpointing" if "activation_checkpointing" in GRPOConfig.__dataclass_fields__ else "gradient_checkpointing"
        kwargs.update(use_cpu=True, bf16=False, **{checkpointing: False})
    return GRPOConfig(**kwargs)


def make_rollout_func(env: Environment, config: RunConfig):
    """The `rollout_func` TRL calls each generation step: play the batch's episodes, log `env/*`."""
    from aitrain_grpo.engine.backends.base import SamplingParams
    from aitrain_grpo.models import stop_token_ids
    from aitrain_grpo.training.generation import make_backend, plan_generation
    from aitrain_grpo.engine.rollout import RolloutEngine, batch_metrics

    holder: dict[str, Any] = {}

    def rollout(prompts: list, trainer) -> dict[str, Any]:
        engine = holder.get("engine")
        mode = "train" if trainer.model.training else "eval"
        if engine is None:
            stop_ids = stop_token_ids(trainer.model, trainer.processing_class)
            backend, holder["weight_sync"] = make_backend(trainer, config, plan_generation(config), stop_ids)
            engine = holder["engine"] = RolloutEngine(
                env,
                trainer.processing_class,
                backend,
                max_new_tokens=config.rl_max_new_tokens,
                max_turns=config.rl_max_turns,
                max_completion_length=config.rl_max_completion_length,
                sampling=SamplingParams(config.rl_temperature, config.rl_top_k, config.rl_top_p),
                env_timeout=config.rl_env_timeout,
            )
        rows = trainer.rollout_rows
        if len(rows) != len(prompts):
            raise RuntimeError(f"rollout got {len(prompts)} prompts but {len(rows)} dataset rows")
        weight_sync = holder.get("weight_sync")
        if weight_sync is not None:
            seconds = weight_sync.maybe_sync(trainer)
            if seconds is not None:
                trainer._metrics[mode]["vllm/sync_seconds"].append(seconds)
        batch = engine.run(rows)
        summaries = batch.summaries()
        if trainer.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            summaries = gather_object(summaries)
        for key, value in batch_metrics(summaries).items():
            trainer._metrics[mode][key].append(value)
        for observe in trainer.rollout_observers:
            observe(summaries)
        trainer.last_rollout = batch
        return batch.for_trl()

    rollout.holder = holder
    return rollout


def _peft_config(config: RunConfig):
    if not config.peft:
        return None
    from peft import LoraConfig

    targets: Any = config.target_modules
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    return LoraConfig(
        r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
        target_modules=targets, task_type="CAUSAL_LM",
    )


def check_output_dir(config: RunConfig) -> Path:
    """Refuse to overwrite a finished run, or one with checkpoints, unless asked to (checkpoints.py)."""
    from aitrain_grpo.training.checkpoints import check_output_dir_for_run

    check_output_dir_for_run(config)
    return config.resolved_output_dir()


def build_trainer(config: RunConfig, env: Environment | None = None, *, callbacks: list | None = None):
    """Everything `train` does before `trainer.train()`: validate, load the environment, model and
    dataset, write `run_config.json`, and construct the trainer. Returns the trainer; its
    `rollout_func.holder["engine"]` is the rollout engine once the first batch has been played."""
    from datasets import Dataset

    from aitrain_grpo.runlog.files import bind_trainer, training_callbacks
    from aitrain_grpo.training.checkpoints import prepare_output_dir, resume_checkpoint
    from aitrain_grpo.env.dataset import build_rows
    from aitrain_grpo.env.loading import load_environment
    from aitrain_grpo.runlog.redaction import redact
    from aitrain_grpo.training.stopping import stop_callbacks

    config.validate()
    reserve_server_gpus(config)  # before anything starts CUDA
    plan = plan_generation(config)
    check_vllm_server(config, plan)
    warning = sampling_warning(config, plan)
    if warning:
        print(warning, file=sys.stderr)
    output_dir = check_output_dir(config)
    if env is None:
        env = load_environment(config.rl_env_module, config.rl_env_class, config.rl_env_config)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    from aitrain_grpo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(config.model)
    dataset = Dataset.from_list(build_rows(env, tokenizer))
    prepare_output_dir(output_dir, resume_checkpoint(config))
    (output_dir / "run_config.json").write_text(json.dumps(redact(config.to_dict()), indent=2, default=str) + "\n")
    callbacks = [*stop_callbacks(config.rl_max_error_rate), *(callbacks or [])]

    trainer = _trainer_class()(
        model=model,
        args=grpo_config(config, output_dir),
        train_dataset=dataset,
        processing_class=tokenizer,
        reward_funcs=[episode_score],
        rollout_func=make_rollout_func(env, config),
        peft_config=_peft_config(config),
        callbacks=[*training_callbacks(config, output_dir), *(callbacks or [])],
    )
    bind_trainer(trainer)
    _drop_default_printer(trainer)
    return trainer


def train(config: RunConfig, env: Environment | None = None, *, callbacks: list | None = None) -> dict[str, Any]:
    """Train the model in the environment as `config` says. Returns the run summary (also written to
    `run_summary.json`). `env` skips loading the environment from `config` (Python API use). A run
    that stops early (a signal, too many failed episodes, a dead generation backend) saves a checkpoint
    and raises `stopping.TrainingStopped`."""
    from aitrain_grpo.training.checkpoints import resume_checkpoint
    from aitrain_grpo.training.stopping import clean_stops

    trainer = build_trainer(config, env, callbacks=callbacks)
    output_dir = config.resolved_output_dir()
    started = time.time()
    try:
        with clean_stops(trainer):  # early stops (signals, error rate, backend) raise TrainingStopped
            trainer.train(resume_from_checkpoint=resume_checkpoint(config))
            weight_sync = trainer.rollout_func.holder.get("weight_sync")
            if weight_sync is not None:
                weight_sync.maybe_sync(trainer)  # leave the server serving the final weights
    finally:
        engine = trainer.rollout_func.holder.get("engine")
        if engine is not None:
            engine.close()
    trainer.save_model(str(output_dir))
    summary: dict[str, Any] = {
        "completed": True,
        "global_step": trainer.state.global_step,
        "runtime_seconds": round(time.time() - started, 2),
        "model": config.model,
        "adapter": bool(config.peft),
    }
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(str(output_dir))
        (output_dir / "run_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _drop_default_printer(trainer) -> None:
    """transformers prints every log dict; our TrainingProgress prints a compact line instead."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
