"""`aitrain sft`: warm a model up on an environment's oracle before GRPO: the command's options, checked
into a `RunConfig`, and what it prints. The work is sft/oracle.py's `warm_start`: play the oracle on the
first `--episodes` rows, keep those scoring at least `--min-score` (demos.jsonl), fine-tune on them
(sft/trainer.py: TRL's `SFTTrainer`, loss on the assistant turns only, LoRA by default). The output
folder is a training run like `grpo`'s, so `aitrain grpo --model DIR` trains on top of it (a new adapter
on the merged SFT model, models.load_causal_lm) and `aitrain eval --model DIR` measures it.

Its options are `grpo`'s (`RunConfig` fields, same flags and help); two defaults differ and say so
in `--help`: `--lr` (a LoRA learning a new format) and `--epochs` (few demonstrations). The context
strategy and budget options are there so that, where a strategy rewrites the history, the oracle plays
under the ones the grpo run will have (its demonstrations then show the model the same contexts).

Left out: playing, choosing and training (sft/oracle.py, sft/trainer.py), demonstrations from anything
but `solve` (a file of your own conversations, a stronger model), and resuming an interrupted run.
"""

from __future__ import annotations

import inspect
from typing import Any

from aitrain_grpo.commands.options import FIELDS, as_in_grpo, check_positive, command_option, field_option, flag_name, with_default
from aitrain_grpo.config import CONTEXT_OPTIONS, RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.models.loading import check_model_option
from aitrain_grpo.sft.oracle import warm_start

# A LoRA adapter learns a new format from a few dozen demonstrations at about this rate (PEFT's and
# TRL's SFT examples use 1e-4 to 2e-4); grpo's 1e-5 suits small steps away from a policy that already
# works and would leave a cold adapter close to where it started.
SFT_LR = 2e-4
# Demonstrations are few (tens to hundreds); one pass over them is too little to learn a format.
SFT_EPOCHS = 3.0

PLAYED_OPTIONS = ("rl_max_new_tokens", "rl_max_completion_length", *CONTEXT_OPTIONS)

SFT_PARAMETERS = [
    as_in_grpo("rl_env_module"),
    as_in_grpo("rl_env_class"),
    as_in_grpo("rl_env_config"),
    as_in_grpo("rl_env"),
    as_in_grpo("rl_env_weights"),
    as_in_grpo("model"),
    field_option("output_dir", None, "Where the model, demos.jsonl and logs go (default: outputs/<env class>-sft)."),
    command_option("episodes", 64, "Oracle episodes to play: the first N rows of the dataset (cycled when fewer).", int),
    command_option("min_score", 1.0, "Keep only demonstrations that scored at least this.", float),
    field_option("lr", SFT_LR, with_default("Learning rate (higher than grpo's 1e-05: a LoRA adapter learning a new "
                                            "format from a few demonstrations).", SFT_LR)),
    as_in_grpo("max_steps"),
    field_option("epochs", SFT_EPOCHS, with_default("Passes over the demonstrations when --max-steps is not set.",
                                                    SFT_EPOCHS)),
    field_option("batch_size", 8, with_default("Demonstrations per device per optimizer step.", 8)),
    *(as_in_grpo(name) for name in ("lr_scheduler", "warmup_steps", "weight_decay", "max_grad_norm", "optim",
                                    "adam_beta1", "adam_beta2", "adam_epsilon", "activation_checkpointing")),
    as_in_grpo("gradient_accumulation_steps"),
    as_in_grpo("seed"),
    as_in_grpo("peft"),
    as_in_grpo("lora_r"),
    as_in_grpo("lora_alpha"),
    as_in_grpo("lora_dropout"),
    as_in_grpo("target_modules"),
    *(as_in_grpo(name) for name in ("use_rslora", "use_dora", "lora_modules_to_save")),
    as_in_grpo("rl_max_turns", help_text="Cap on oracle turns per episode (default: the environment's max_turns)."),
    as_in_grpo("rl_env_timeout"),
    as_in_grpo("chat_template_kwargs"),
    # The oracle plays under grpo's budgets and context strategy where one rewrites the history (sft/oracle.py):
    # give sft the options the grpo run will have, so the demonstrations show the contexts it will see.
    *(as_in_grpo(name) for name in PLAYED_OPTIONS),
    as_in_grpo("logging_steps"),
    as_in_grpo("report_to"),
    as_in_grpo("overwrite"),
    as_in_grpo("debug"),
]
_COMMAND_ONLY = ("episodes", "min_score", "debug")


def sft_run_config(options: dict[str, Any]) -> RunConfig:
    """The run's `RunConfig` (what run_config.json records), checked as `grpo` checks its own, less the
    rules of GRPO's groups, sampling and loss (RunConfig.validate(grpo=False))."""
    fields = {k: v for k, v in options.items() if k not in _COMMAND_ONLY and v is not None}
    config = RunConfig(**fields)
    if config.output_dir is None and (config.rl_env_class or config.rl_env):  # "" is refused, not the default
        config.output_dir = f"{config.resolved_output_dir()}-sft"
    config = config.validate(grpo=False)
    check_model_option(config.model)
    return config


def played_flags(config: RunConfig) -> str:
    """The budget and context flags given that differ from grpo's defaults: the grpo run should play under
    the ones the demonstrations were played under (a context strategy's sequences)."""
    given = [(name, getattr(config, name)) for name in PLAYED_OPTIONS if getattr(config, name) != FIELDS[name].default]
    return "".join(f" {flag_name(name)} {value}" for name, value in given)


def run_sft(options: dict[str, Any], console) -> dict[str, Any]:
    """What `aitrain sft` does (see the module doc); bad options and environments raise `UserError`."""
    episodes, min_score = options["episodes"], options["min_score"]
    check_positive(episodes=episodes)
    if not 0.0 <= min_score <= 1.0:
        raise ConfigError(f"--min-score must be in [0, 1] (scores are), got {min_score:g}")
    summary = warm_start(sft_run_config(options), episodes, min_score, show=lambda line: console.print(line, markup=False))
    config, output_dir = summary.pop("config"), summary["output_dir"]
    losses = summary["losses"]
    trend = f", loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else ""
    console.print(f"done: {summary['global_step']} steps on {summary['demonstrations']} demonstrations in "
                  f"{summary['runtime_seconds']:.0f}s{trend}; model saved to {output_dir}", markup=False)
    console.print(f"next: aitrain grpo --model {output_dir} {config.env_flags()}{played_flags(config)} "
                  f"--output-dir {output_dir}-grpo", markup=False)
    console.print(f"      aitrain eval --model {output_dir}", markup=False)
    return summary


SFT_SIGNATURE = inspect.Signature(SFT_PARAMETERS)
