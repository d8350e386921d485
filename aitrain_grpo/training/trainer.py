"""`train(config)`: RunConfig -> GRPOConfig + `EpisodeGRPOTrainer`, TRL's `GRPOTrainer` whose step is ours.

TRL owns the loss (its loss types, clipping, KL, the entropy bonus) and, with transformers, the optimizer,
gradient accumulation, accelerate and the checkpoint format. The step up to the loss is this package's
(step/flow.py: rollout, rewards, advantages, typed sequence records, TRL's tensors, reference forward).
This module wires the run together:
- the run's `RunPlan` (run/plan.py) is decided once; a Python caller's options are checked against the
  environment first (preflight/run_checks.py), as `aitrain grpo` checks them;
- the environment's dataset becomes `train_dataset`;
- the run's `RunContext` (run/context.py) holds what its parts share: the config and plan, the metrics
  sink (runlog/step_metrics.py, which the rollout, weight sync, the step, the step timing callback and
  held-back evaluation write into and `log` drains), the step timing, the `TrainingRollout`
  (rollout/training_rollout.py), the shared-prefix state and the curriculum; it is handed to the trainer
  and to whoever needs a piece, never parked on TRL's trainer;
- what the rollout plays with (engine, weight sync, async rollout: rollout/parts.py) is built in the
  trainer's `__init__`, once TRL's has made the model it needs, and attached to it;
- `episode_score` (the first reward function) hands the step the scores the rollout computed; the rewards
  of `--rl-reward-funcs` follow it, then the judge's (`--rl-judge-rubric`, rewards/judge.py) and the
  reward model's (`--rl-reward-model`, rewards/reward_model.py), weighted by `--rl-reward-weights`
  (rewards/functions.py).

`EpisodeGRPOTrainer` is TRL's trainer plus what only a subclass can do: the private overrides where TRL's
loop hands over to the step (trl/hooks.py), the metrics sink merged into each log record (`log`), the
loss phase marked where it begins (`compute_loss`), TRL's reference passes over each chunk's own length
(trl/scoring_passes.py), checkpoints written atomically (run/checkpoints.py), and TRL's fused head on
completion positions only while it trains (`train`, trl/lm_head.py).

Left out: the console display and the files written during training (runlog/), stopping early
(run/stopping.py), and the rollout itself (rollout/training_rollout.py, engine/).
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from typing import Any

import torch
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOConfig, GRPOTrainer

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.chat import template_kwargs_note
from aitrain_grpo.env.base import Environment
from aitrain_grpo.errors import ConfigError, UserError
from aitrain_grpo.evaluation.held_back import held_back_callbacks, stopped_early
from aitrain_grpo.env.arrow_rows import arrow_dataset
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import as_environment, load_environment
from aitrain_grpo.models.loading import load_model_and_tokenizer
from aitrain_grpo.option_rules import template_kwargs
from aitrain_grpo.runlog.files import ReportCallback, training_callbacks
from aitrain_grpo.runlog.step_metrics import StepMetrics
from aitrain_grpo.runlog.step_timing import StepTiming
from aitrain_grpo.training.preflight import small_dataset as small_dataset
from aitrain_grpo.training.run.checkpoints import AtomicCheckpoints
from aitrain_grpo.training.run.folder import prepare_output_dir, write_run_config
from aitrain_grpo.training.run.collectives import bound_collectives, collective_failures, start_process_group
from aitrain_grpo.training.trl.hf_args import check_target_modules, lora_config, save_run, trainer_args
from aitrain_grpo.training.rewards.judge import judge_rewards
from aitrain_grpo.training.rewards.judge_setup import build_judge
from aitrain_grpo.training.rewards.reward_model import RewardModel, reward_model_rewards
from aitrain_grpo.training.rollout.generation import check_server as check_vllm_server
from aitrain_grpo.training.rollout.generation import grpo_kwargs as generation_grpo_kwargs
from aitrain_grpo.training.rollout.generation import sampling_warning
from aitrain_grpo.training.preflight.memory_check import available_bytes, memory_warning
from aitrain_grpo.training.step.micro_batches import BatchShape
from aitrain_grpo.training.run.plan import RunPlan, plan_run
from aitrain_grpo.training.preflight.prompt_length import check_prompt_lengths
from aitrain_grpo.training.python_api import as_python_arguments, with_environment_origin
from aitrain_grpo.training.preflight.run_checks import check_run
from aitrain_grpo.training.run.lock import release as release_lock
from aitrain_grpo.training.rewards.functions import check_required_arguments, episode_rewards, load_reward_funcs
from aitrain_grpo.training.rollout.training_rollout import TrainingRollout
from aitrain_grpo.training.rollout.parts import build_rollout_parts
from aitrain_grpo.training.trl.scoring_passes import trim_scoring_passes
from aitrain_grpo.training.run.signals import SignalStop
from aitrain_grpo.training.run.context import RunContext
from aitrain_grpo.training.step.shared_prefix import SharedPrefix
from aitrain_grpo.training.step.phases import PhaseClock
from aitrain_grpo.training.run.stopping import ErrorRateStop, clean_stops
from aitrain_grpo.training.run.time_limit import TimeLimit
from aitrain_grpo.training.trl.hooks import TRLHooks, trl_functions_replaced


# Saving an adapter, PEFT looks for its base's config.json to see whether the vocabulary changed. An
# adapter trained on a merged sft output names that output (an adapter folder, no config.json) as its base,
# and PEFT warns on every save. Our LoRA never targets the embeddings, so the vocabulary never changes: only
# that one message is silenced (peft 0.21, utils/save_and_load.py).
warnings.filterwarnings("ignore", message="Could not find a config file in .* will assume that the vocabulary "
                                          "was not modified", category=UserWarning)
# transformers 5.23 warns (FutureWarning) on every use of `is_gradient_checkpointing` and
# `gradient_checkpointing_enable/_disable`, which peft, HF Trainer and TRL still make; the command line silences it (commands/quiet.py), and so does a run started from
# Python (`aitrain_grpo.train`, README's "From Python"), which imports this module: that one message only.
warnings.filterwarnings("ignore", message="`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated",
                        category=FutureWarning)


def episode_score(prompts=None, completions=None, episode_score=None, **kwargs) -> list[float]:
    """Reward function: the environment's score of each episode, computed during the rollout."""
    if episode_score is None:
        raise RuntimeError("episode_score is missing from the step's reward arguments (step/flow.py)")
    return [float(s) for s in episode_score]


class EpisodeGRPOTrainer(TRLHooks, AtomicCheckpoints, GRPOTrainer):
    """GRPOTrainer whose step is ours (step/flow.py); its private overrides are in trl/hooks.py. `run` is
    the run's `RunContext` (run/context.py): config, plan, metrics sink, step timing, rollout, shared-prefix
    state, curriculum. `drop_masked_rows`: leave rows whose loss mask is all zero out of the loss
    (--rl-zero-std-groups drop/refill, rollout/groups.py). `external_weight_sync`: this package, not TRL, moves
    the weights into vLLM (rollout/generation.py)."""

    def __init__(self, *, run: RunContext, drop_masked_rows: bool = False, external_weight_sync: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        self.run = run
        self.drop_masked_rows = drop_masked_rows
        if external_weight_sync:  # once TRL has built whatever it builds (trl/hooks.py)
            self.use_importance_sampling()
        trim_scoring_passes((self.model, self.ref_model))  # reference passes over each chunk's own length
        # Engine, weight sync, async rollout: built now that TRL has made the model (and vLLM) they use.
        self.rollout_parts = build_rollout_parts(self, run.rollout.env, run.config, run.plan.generation, run.metrics)
        run.rollout.attach(self.rollout_parts)

    @property
    def rollout(self) -> TrainingRollout:
        return self.run.rollout

    @property
    def plan(self) -> RunPlan:
        return self.run.plan

    def train(self, *args, **kwargs):
        with trl_functions_replaced():  # TRL's fused LM head on completion positions only (trl/lm_head.py)
            return super().train(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.run.timing.clock.base("loss_forward_backward")  # the step's scoring is over (step/flow.py)
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training:
            logs.update(self.run.metrics.drain())
        super().log(logs, start_time)


def grpo_config(config: RunConfig, plan: RunPlan) -> GRPOConfig:
    """Translate RunConfig into TRL's GRPOConfig, with CPU-friendly settings where there is no CUDA."""
    kwargs: dict[str, Any] = dict(
        **trainer_args(config, plan.output_dir, GRPOConfig, plan.batch),
        num_generations=config.rl_num_generations,
        max_completion_length=config.rl_max_completion_length,
        temperature=config.rl_temperature if config.rl_temperature > 0 else 1.0,
        top_k=config.rl_top_k,
        top_p=config.rl_top_p,
        min_p=config.rl_min_p or None,
        repetition_penalty=config.rl_repetition_penalty,
        beta=config.rl_kl_coef,
        use_bias_correction_kl=config.rl_kl_bias_correction,
        sync_ref_model=bool(config.rl_ref_sync_steps),  # TRL's SyncRefModelCallback moves it after a step
        ref_model_sync_steps=config.rl_ref_sync_steps or 512,  # TRL's default, unused when off
        ref_model_mixup_alpha=config.rl_ref_mixup_alpha,
        epsilon=config.rl_clip_range,
        num_iterations=config.rl_num_iterations,
        epsilon_high=config.rl_clip_range_high,
        importance_sampling_level=config.rl_importance_sampling,
        scale_rewards=config.rl_scale_rewards,
        multi_objective_aggregation=config.rl_reward_aggregation,
        delta=config.rl_delta,
        off_policy_mask_threshold=config.rl_off_policy_mask,
        vllm_importance_sampling_mode=config.rl_importance_correction,
        vllm_importance_sampling_clip_max=config.rl_importance_cap,
        vllm_importance_sampling_clip_min=config.rl_importance_floor,
        entropy_coef=config.rl_entropy_coef,
        use_adaptive_entropy=config.rl_entropy_target is not None,
        entropy_target=config.rl_entropy_target if config.rl_entropy_target is not None else 0.2,  # TRL's default
        top_entropy_quantile=config.rl_top_entropy_quantile,
        save_strategy="steps" if config.save_steps else "no",
        save_steps=config.save_steps or 500,
        save_total_limit=config.save_total_limit,
        remove_unused_columns=False,  # episodes need every column of their row
        shuffle_dataset=config.shuffle_dataset,
        log_completions=False,
    )
    kwargs.update(generation_grpo_kwargs(config, plan.generation))
    # One log a generation batch: its rollout's metrics with its updates' averaged (runlog/ writes a step's
    # record when it holds the rollout's reward), so --logging-steps rounds up to a multiple of the updates.
    kwargs["logging_steps"] = math.ceil(config.logging_steps / config.rl_num_iterations) * config.rl_num_iterations
    if config.rl_loss_type:
        kwargs["loss_type"] = config.rl_loss_type
    weights = config.reward_weight_list
    if weights is not None:
        kwargs["reward_weights"] = weights  # the environment's score first, as reward_funcs are ordered
    return GRPOConfig(**kwargs)


def check_context_length(model, config: RunConfig) -> None:
    """An episode's budget must fit the model's context (its position embeddings), prompt included; a
    longer one would fail or silently degrade mid-run, so it is refused before training."""
    context = getattr(model.config, "max_position_embeddings", None)
    if isinstance(context, int) and config.rl_max_completion_length >= context:
        raise ConfigError(
            f"--rl-max-completion-length {config.rl_max_completion_length} does not fit {config.model}'s context of "
            f"{context} tokens (its max_position_embeddings), which also holds the prompt; lower it, e.g. "
            f"--rl-max-completion-length {context // 2}"
        )


def warn_if_a_step_may_not_fit(model, config: RunConfig, batch: BatchShape) -> None:
    """On a CPU, say before training when the worst-case step exceeds the free memory (preflight/memory_check.py)."""
    if torch.cuda.is_available() or os.environ.get("RANK", "0") != "0":
        return
    warning = memory_warning(
        parameters=sum(p.numel() for p in model.parameters()), vocab=int(model.config.vocab_size),
        batch_size=config.batch_size,
        micro_batch=batch.episodes_per_pass,
        tokens_per_episode=config.rl_max_completion_length, available=available_bytes(),
    )
    if warning:
        print(warning, file=sys.stderr, flush=True)


def build_trainer(config: RunConfig, env: Environment | None = None, *, callbacks: list | None = None,
                  plan: RunPlan | None = None) -> EpisodeGRPOTrainer:
    """Everything `train` does before `trainer.train()`: plan the run (unless `plan` is given), load
    the environment, model and dataset, write `run_config.json`, and construct the trainer. Its
    `rollout` is the `TrainingRollout` (its `last_batch` the latest episodes played), `rollout_parts`
    what it plays with (built already; `rollout_parts.close()` ends it), `step_metrics` the run's
    metrics sink and `plan` the `RunPlan`. Without `plan` (a Python caller; `aitrain grpo` plans and checks
    first) the run's options are checked against the environment before anything is planned or written
    (preflight/run_checks.py), and their notes printed."""
    if plan is None and env is not None:
        config = with_environment_origin(config, env)
    if env is None:
        env = load_environment(*config.environment())
    else:
        env = as_environment(env)  # an instance handed in from Python, wrapped as load_environment would
    if plan is None:
        notes = check_run(config, env)
        for note in notes if os.environ.get("RANK", "0") == "0" else ():
            print(note, file=sys.stderr)
    plan = plan or plan_run(config)
    config = plan.config  # with the output folder the run really writes to
    check_vllm_server(config, plan.generation)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    extra_rewards = load_reward_funcs(config.reward_specs)  # before the model: a bad one fails fast
    judge = build_judge(config)  # --rl-judge-rubric: checked, one more reward, weighted last (rewards/judge_setup.py)
    reward_model = RewardModel(config.rl_reward_model) if config.rl_reward_model else None  # checked, then loaded

    model, tokenizer = load_model_and_tokenizer(config.model)
    note = template_kwargs_note(tokenizer, template_kwargs(config.chat_template_kwargs))
    if note and os.environ.get("RANK", "0") == "0":
        print(note, file=sys.stderr)
    check_target_modules(model, config)
    check_context_length(model, config)
    warn_if_a_step_may_not_fit(model, config, plan.batch)
    rows = build_rows(env, tokenizer)
    check_prompt_lengths(rows, tokenizer, model, reply_tokens=config.rl_max_new_tokens, model_name=config.model,
                         window=config.rl_context_window, env=env, template_kwargs=template_kwargs(config.chat_template_kwargs))
    dataset = arrow_dataset(small_dataset.fill_one_step(rows, config), f"{type(env).__name__}.build_dataset")
    check_required_arguments(extra_rewards, dataset.column_names)
    prepare_output_dir(plan.output_dir, plan.resume)
    write_run_config(plan.output_dir, config)

    error_stop = ErrorRateStop(config.rl_max_error_rate)
    step_metrics = StepMetrics()  # the run's metrics sink: the trainer's log drains it
    step_timing = StepTiming(step_metrics, PhaseClock())  # the step's phases and memory peaks
    rollout = TrainingRollout(env, config, metrics=step_metrics, timing=step_timing, observers=[error_stop.observe])
    run = RunContext(config=config, plan=plan, metrics=step_metrics, timing=step_timing, rollout=rollout,
                     shared_prefix=SharedPrefix(config.shared_prefix_loss))
    # Every refusal has had its say: a refused run prints its error alone.
    for line in (plan.engine.line() if plan.engine else None, sampling_warning(config, plan.generation)):
        if line and os.environ.get("RANK", "0") == "0":
            print(line, file=sys.stderr)
    start_process_group(config.ddp_timeout)  # meet the other processes under the bound (run/collectives.py)
    trainer = EpisodeGRPOTrainer(
        run=run,
        drop_masked_rows=config.rl_zero_std_groups != "keep",
        external_weight_sync=plan.generation.external_weight_sync,
        model=model,
        args=grpo_config(config, plan),
        train_dataset=dataset,
        processing_class=tokenizer,
        reward_funcs=[episode_score, *episode_rewards(extra_rewards, rollout), *judge_rewards(judge, rollout),
                      *reward_model_rewards(reward_model, rollout)],
        peft_config=lora_config(config),
        callbacks=[step_timing, *training_callbacks(config, plan.output_dir, rollout), SignalStop(finish_step=config.rl_async_steps > 0), error_stop,
                   *held_back_callbacks(run), *([TimeLimit(config.max_time)] if config.max_time else []),
                   *(callbacks or [])],
    )
    # transformers prints every log dict; our TrainingProgress prints a compact line instead.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    bound_collectives(config.ddp_timeout)  # the process group exists now; no training collective has run
    return trainer


def train(config: RunConfig, env: Environment | None = None, *, callbacks: list | None = None,
          plan: RunPlan | None = None) -> dict[str, Any]:
    """Train the model in the environment as `config` says. Returns the run summary (also written to
    `run_summary.json`). `env` skips loading the environment from `config` (Python API use); `plan`
    is the run's plan when the caller has made it already (`plan_run(config)`). A run that stops early
    (a signal, too many failed episodes, a dead generation backend) saves a checkpoint and raises
    `stopping.TrainingStopped`; another process gone or stalled past `--ddp-timeout` raises its
    `collectives.CollectiveFailed`, saving nothing."""
    trainer = build_trainer(config, env, callbacks=callbacks, plan=plan)
    started = time.time()
    with collective_failures(trainer, config.ddp_timeout):  # another process gone: one line (run/collectives.py)
        try:
            with clean_stops(trainer):  # early stops (signals, error rate, backend) raise TrainingStopped
                trainer.train(resume_from_checkpoint=trainer.plan.resume)
                if trainer.plan.generation.backend == "vllm_server":
                    trainer.rollout_parts.sync_weights(trainer)  # leave the server serving the final weights
        finally:
            trainer.rollout_parts.close()
        summary = save_run(trainer, config, trainer.plan.output_dir, started, **stopped_early(trainer))
    if trainer.accelerator.is_main_process:  # the page again, now with run_summary.json's runtime
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, ReportCallback):
                callback.write()
    release_lock(trainer.plan.output_dir)  # the folder is free for the next run, in this process or another
    return summary


def train_from_python(config: RunConfig, env: Environment | None = None, **kwargs: Any) -> dict[str, Any]:
    """`aitrain_grpo.train`: `train` for Python callers, whose mistakes are named as `RunConfig` keyword
    arguments (`overwrite=True`, `batch_size=`) rather than command-line flags."""
    try:
        if not isinstance(config, RunConfig):
            raise ConfigError(f"train takes a RunConfig, not a {type(config).__name__}: train(RunConfig(**options))")
        return train(config, env, **kwargs)
    except UserError as exc:
        exc.args = (as_python_arguments(str(exc)),)
        raise
