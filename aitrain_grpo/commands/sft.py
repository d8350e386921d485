"""`aitrain sft`: warm a model up on an environment's oracle before GRPO.

Many agent tasks give RL no signal from a cold model: every episode scores 0 (`env check` warns about
it), and GRPO learns only from score differences. An environment with `solve(episode) -> str` can teach
the format first. This command plays the oracle on the first `--episodes` rows of the dataset through
the same `EpisodeRunner` as `env check` (engine/runner.py), keeps the episodes that scored at least
`--min-score`, writes them to `demos.jsonl` (one whole conversation a line, tool messages included,
with its score, row and the tool schemas; an agent environment's are its requests', each answered by
`solve`, engine/demos.py), and fine-tunes the model on them (sft/trainer.py: TRL's
`SFTTrainer`, loss on the assistant turns only, LoRA by default). The output folder is a training run
like `grpo`'s (adapter, tokenizer, run_config.json, run_summary.json), so `aitrain grpo --model DIR`
trains on top of it (a new adapter on the merged SFT model, models.load_causal_lm) and `aitrain eval
--model DIR` measures it.

Its options are `grpo`'s (`RunConfig` fields, same flags and help); two defaults differ and say so
in `--help`: `--lr` (a LoRA learning a new format) and `--epochs` (few demonstrations).

Left out: the training itself (sft/trainer.py), demonstrations from anything but `solve` (a file of
your own conversations, a stronger model), and resuming an interrupted run.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from aitrain_grpo.commands.options import as_in_grpo, check_positive, command_option, field_option, with_default
from aitrain_grpo.config import RunConfig
from aitrain_grpo.models.loading import check_model_option
from aitrain_grpo.engine.demos import Demonstration, demonstration, has_turns
from aitrain_grpo.engine.runner import oracle_policy, play
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.errors import ConfigError, UserError
from aitrain_grpo.models.loading import load_tokenizer, resolve_source
from aitrain_grpo.runlog.records import write_jsonl

# A LoRA adapter learns a new format from a few dozen demonstrations at about this rate (PEFT's and
# TRL's SFT examples use 1e-4 to 2e-4); grpo's 1e-5 suits small steps away from a policy that already
# works and would leave a cold adapter close to where it started.
SFT_LR = 2e-4
# Demonstrations are few (tens to hundreds); one pass over them is too little to learn a format.
SFT_EPOCHS = 3.0
DEMOS_FILE = "demos.jsonl"

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
    as_in_grpo("gradient_accumulation_steps"),
    as_in_grpo("seed"),
    as_in_grpo("peft"),
    as_in_grpo("lora_r"),
    as_in_grpo("lora_alpha"),
    as_in_grpo("lora_dropout"),
    as_in_grpo("target_modules"),
    as_in_grpo("rl_max_turns", help_text="Cap on oracle turns per episode (default: the environment's max_turns)."),
    as_in_grpo("rl_env_timeout"),
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
    if not config.output_dir and (config.rl_env_class or config.rl_env):
        config.output_dir = f"{config.resolved_output_dir()}-sft"
    config = config.validate(grpo=False)
    check_model_option(config.model)
    return config


def play_demonstrations(env, rows: list[dict[str, Any]], episodes: int, *, max_turns: int | None,
                        timeout: float) -> tuple[list[Demonstration], list[str]]:
    """The oracle's episodes on the first `episodes` rows (cycled), as `Demonstration`s, and the errors
    of those that failed (an exception in solve, step or score_episode: scored 0)."""
    indices = [i % len(rows) for i in range(episodes)]
    played = play(env, [dict(rows[i]) for i in indices], oracle_policy(env), max_turns=max_turns, timeout=timeout,
                  policy_name="solve")
    demos = [demonstration(env, ep, rows[i], i) for i, ep in zip(indices, played)]
    return demos, [ep.error for ep in played if ep.error]


def keep_good(played: list[Demonstration], errors: list[str], min_score: float, env_name: str) -> list[Demonstration]:
    """The demonstrations scoring at least `min_score`; none is a one-line error naming the cause."""
    kept = [demo for demo in played if demo.score >= min_score and has_turns(demo)]
    if kept:
        return kept
    if any(demo.score >= min_score for demo in played):
        raise UserError(f"the oracle episodes of {env_name} that scored at least {min_score:g} have no reply to learn "
                        f"from: the agent sent no request; make rollout ask the model (client.chat.completions)")
    if errors:
        raise UserError(f"all {len(played)} oracle episodes failed or scored below {min_score:g} ({len(errors)} "
                        f"failed; the first: {errors[0]}); fix solve, check it with `aitrain env check`")
    best = max(demo.score for demo in played)
    raise UserError(f"none of the {len(played)} oracle episodes of {env_name} scored at least --min-score "
                    f"{min_score:g} (best: {best:g}); fix solve or score_episode (`aitrain env check` shows "
                    f"both), or lower --min-score")


def run_sft(options: dict[str, Any], console) -> dict[str, Any]:
    """What `aitrain sft` does (see the module doc); bad options and environments raise `UserError`."""
    episodes, min_score = options["episodes"], options["min_score"]
    check_positive(episodes=episodes)
    if not 0.0 <= min_score <= 1.0:
        raise ConfigError(f"--min-score must be in [0, 1] (scores are), got {min_score:g}")
    config = sft_run_config(options)
    from aitrain_grpo.training.checkpoints import check_output_dir_for_run, with_fresh_default_output_dir  # torch

    config, note = with_fresh_default_output_dir(config)
    if note:
        console.print(note, markup=False)
    check_output_dir_for_run(config)
    env = load_environment(*config.environment())
    env_name = type(env).__name__
    if not callable(getattr(env, "solve", None)):
        raise ConfigError(f"{env_name} has no solve(episode) -> str, so there is no oracle to learn from; add "
                          f"one that returns an expert's next message (see HotelEnv.solve in envs/hotel.py)")
    tokenizer = load_tokenizer(resolve_source(config.model))
    rows = build_rows(env, tokenizer)
    played, errors = play_demonstrations(env, rows, episodes, max_turns=config.rl_max_turns, timeout=config.rl_env_timeout)
    demos = keep_good(played, errors, min_score, env_name)
    output_dir = Path(config.resolved_output_dir())
    output_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(output_dir / DEMOS_FILE, [demo.record() for demo in demos])
    mean = sum(demo.score for demo in played) / len(played)
    console.print(f"oracle: {len(played)} episodes of {env_name} (mean score {mean:.3f}); kept {len(demos)} scoring "
                  f">= {min_score:g}, written to {output_dir / DEMOS_FILE}", markup=False)
    from aitrain_grpo.sft.trainer import train_sft  # TRL imports vLLM, which prints: only now

    summary = train_sft(config, demos, output_dir, show=lambda line: console.print(line, markup=False))
    losses = summary["losses"]
    trend = f", loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else ""
    console.print(f"done: {summary['global_step']} steps on {len(demos)} demonstrations in "
                  f"{summary['runtime_seconds']:.0f}s{trend}; model saved to {output_dir}", markup=False)
    console.print(f"next: aitrain grpo --model {output_dir} {config.env_flags()} --output-dir {output_dir}-grpo", markup=False)
    console.print(f"      aitrain eval --model {output_dir}", markup=False)
    return summary


SFT_SIGNATURE = inspect.Signature(SFT_PARAMETERS)
