"""The oracle warm start: fine-tune a model on an environment's demonstrations with TRL's `SFTTrainer`.

Many agent tasks give GRPO nothing to learn from a cold model: every episode scores 0, and GRPO learns
only from score differences within a group. An environment with `solve` can show the format first.
`aitrain sft` (sft/oracle.py) plays the oracle; this module turns the demonstrations it kept into
training sequences and runs `SFTTrainer` on them (LoRA by default), saving an output folder that
`grpo --model` and `eval --model` take like any training run (adapter, tokenizer, run_config.json).

Token for token what GRPO shows: a demonstration becomes token ids the way the rollout engine builds an
episode (engine/demos.py), the loss mask being the engine's `env_mask`. SFTTrainer gets a pre-tokenized
dataset (`input_ids` + `assistant_masks`) and builds its labels from the mask: TRL's own
`assistant_only_loss` needs `{% generation %}` markers in the chat template, which the tiny model's
and SmolLM2's templates lack.

Left out: playing the oracle and choosing demonstrations (sft/oracle.py), packing, resuming an
interrupted run, evaluation splits, and demonstrations from anything other than `solve`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import datasets
from datasets import Dataset
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import SFTConfig, SFTTrainer

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.chat import ChatRenderer, template_kwargs_note
from aitrain_grpo.engine.demos import Demonstration
from aitrain_grpo.models.loading import load_model_and_tokenizer
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.option_rules import template_kwargs
from aitrain_grpo.training.preflight.prompt_length import model_context
from aitrain_grpo.training.run.folder import drop_training_logs, prepare_output_dir, write_run_config
from aitrain_grpo.training.run.collectives import start_process_group
from aitrain_grpo.training.trl.hf_args import check_target_modules, lora_config, save_run, trainer_args
from aitrain_grpo.training.step.micro_batches import BatchShape

def demo_dataset(tokenizer, demos: list[Demonstration], template_kwargs: dict | None = None) -> Dataset:
    """The pre-tokenized dataset SFTTrainer trains on (labels come from `assistant_masks`): a row per
    sequence of each demonstration (one, unless a context strategy cut it), rendered with the tools its
    episode offered (they differ by row in a mixture, and by request in an agent environment)."""
    renderers: dict[str, ChatRenderer] = {}
    tokens = []
    for demo in demos:
        key = json.dumps(demo.tools, sort_keys=True, default=str)
        if key not in renderers:
            renderers[key] = ChatRenderer(tokenizer, tools=demo.tools, template_kwargs=template_kwargs)
        tokens.extend(demo.tokens(renderers[key]))  # a strategy's episode: one row per sequence
    return Dataset.from_dict({"input_ids": [t.input_ids for t in tokens],
                              "assistant_masks": [t.assistant_masks for t in tokens]})


def check_demo_lengths(lengths: list[int], context: int | None, model_name: str) -> None:
    """Refuse demonstrations longer than the model's context: trained whole (`max_length=None`) they run past
    its positions (transformers warned once, then training went on, or crawled for minutes on a 200k-token
    tool result), and cut they would lose their last turns."""
    if context is None:
        return
    over = [n for n in lengths if n > context]
    if over:
        raise ConfigError(f"{len(over)} of {len(lengths)} demonstration sequences are longer than {model_name}'s "
                          f"context of {context} tokens (the longest: {max(over)}); make the oracle's episodes "
                          f"shorter (fewer turns with --rl-max-turns, shorter tool results) or use a model with a "
                          f"longer context")


def sft_config(config: RunConfig, output_dir: Path) -> SFTConfig:
    """RunConfig -> TRL's SFTConfig, with the CPU settings `grpo` uses where there is no CUDA."""
    return SFTConfig(
        **trainer_args(config, output_dir, SFTConfig, BatchShape.of(config, whole_step=False)),
        save_strategy="no",
        max_length=None,  # a demonstration is whole or useless; truncating would cut its last turns
        packing=False,
    )


class LossLines(TrainerCallback):
    """Hands each logged training loss to `show` as one line, and keeps them for the run summary."""

    def __init__(self, show: Callable[[str], None]):
        self.show = show
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
            self.show(f"step {state.global_step}/{state.max_steps}  loss {logs['loss']:.4f}")


def train_sft(config: RunConfig, demos: list[Demonstration], output_dir: Path,
              show: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tune `config.model` on `demos` and save it to `output_dir` (adapter or full model, tokenizer,
    run_config.json, run_summary.json). Returns the run summary."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    datasets.disable_progress_bars()  # a bar per dataset pass over a few dozen rows is noise
    model, tokenizer = load_model_and_tokenizer(config.model)
    check_target_modules(model, config)
    note = template_kwargs_note(tokenizer, template_kwargs(config.chat_template_kwargs))
    if note:
        show(note)
    dataset = demo_dataset(tokenizer, demos, template_kwargs(config.chat_template_kwargs))
    check_demo_lengths([len(ids) for ids in dataset["input_ids"]], model_context(model, tokenizer), config.model)
    prepare_output_dir(output_dir, None)
    drop_training_logs(output_dir)  # an earlier grpo run's, under --overwrite
    write_run_config(output_dir, config)
    losses = LossLines(show)
    start_process_group(config.ddp_timeout)  # meet the other processes under the bound (training/run/collectives.py)
    trainer = SFTTrainer(model=model, args=sft_config(config, output_dir), train_dataset=dataset,
                         processing_class=tokenizer, peft_config=lora_config(config), callbacks=[losses])
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    started = time.time()
    trainer.train()
    return save_run(trainer, config, output_dir, started, demonstrations=len(demos), losses=losses.losses)
