"""A training run's options against its environment and its model's config, checked after the environment
loads and before the model's weights do: a refusal costs no model load and writes nothing (a refused run
leaves no lock, nor the folder its lock made: training/run/lock.py's `release_all`, called by the CLI).

`check_run` (called by `aitrain grpo`, commands/cli.py, and by `build_trainer` for a Python caller's run):
- the context strategy in force (`--rl-context`, else the environment's) must be one the environment can
  play: `compact` needs its `compact()` (engine/context.py's `resolve_strategies`, the rule the engine
  applies when it is built, after the model loads and run_config.json is written);
- `--rl-async-steps` with an environment that scores with the policy (`needs_policy`) is refused
  (`check_async_scoring`);
- `--rl-context-window` must fit the model's context and hold every prompt with room for one reply
  (training/preflight/prompt_length.py), measured with the model's config and tokenizer, not its weights
  (`check_window`: the dataset is built once more for it, only when the option is given);
- with `--eval-every`, the held-back environment must load (`check_held_back_environment`);
- options that do nothing under the strategy and curriculum in force are returned as notes
  (option_effects.py), for the caller to print.

Left out: the other commands that take these options (`eval`, `env check`, `sft`).
"""

from __future__ import annotations

from typing import Any

from aitrain_grpo.engine.context import resolve_strategies
from aitrain_grpo.env.base import needs_policy
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.option_effects import unused_option_notes
from aitrain_grpo.option_rules import template_kwargs


def check_async_scoring(env: Any, async_steps: int) -> None:
    """Refuse `--rl-async-steps` for an environment whose score_episode uses the live policy, which would be
    training in another thread while episodes played ahead are scored."""
    if needs_policy(env) and async_steps:
        raise ConfigError(f"{type(env).__name__} scores with the policy model (needs_policy), which "
                          f"--rl-async-steps trains while episodes are scored; use --rl-async-steps 0")


def model_config_of(weights: str) -> Any:
    """The model's config (no weights); None where it cannot be read here (an adapter's base that is itself
    an adapter: the tokenizer's limit still applies, and loading the model names any real problem)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(weights)
    except (OSError, ValueError, KeyError):
        return None


def check_prompts_fit(env: Any, tokenizer: Any, model_config: Any, *, reply_tokens: int, window: int | None,
                      model_name: str, template_kwargs: dict | None = None) -> None:
    """Refuse a `window` past the model's context, and a dataset whose prompt plus one reply of
    `reply_tokens` fits neither the model's context nor the window: what `aitrain grpo` refuses, which
    `aitrain env check` refuses too (evaluation/envcheck.py)."""
    from aitrain_grpo.training.preflight.prompt_length import check_context_window, check_prompt_lengths

    if window is not None:
        check_context_window(window, model_config, tokenizer, model_name=model_name)
    check_prompt_lengths(build_rows(env, tokenizer), tokenizer, model_config, reply_tokens=reply_tokens,
                         model_name=model_name, window=window, env=env, template_kwargs=template_kwargs)


def check_window(config: Any, env: Any) -> None:
    """Refuse `--rl-context-window` past the model's context, or too small for a prompt plus one reply."""
    from aitrain_grpo.models.loading import load_tokenizer, resolve_source

    source = resolve_source(config.model)
    check_prompts_fit(env, load_tokenizer(source), model_config_of(source.weights), reply_tokens=config.rl_max_new_tokens,
                      window=config.rl_context_window, model_name=config.model,
                      template_kwargs=template_kwargs(config.chat_template_kwargs))


def check_held_back_environment(config: Any) -> None:
    """With `--eval-every`, the held-back environment must load (`--eval-env-config`, `--eval-env-module`/
    `--eval-env-class`: evaluation/held_back_play.py): its one-line error now, not after the model loads."""
    if not getattr(config, "eval_every", None):
        return
    from aitrain_grpo.evaluation.held_back_play import load_held_back_environment

    load_held_back_environment(config)


def check_run(config: Any, env: Any) -> list[str]:
    """Refuse what the environment and the model's config rule out (see the module docstring); return
    the `note:` lines of options that do nothing in this run."""
    check_held_back_environment(config)
    strategies = resolve_strategies(env, config.rl_context)
    check_async_scoring(env, config.rl_async_steps)
    if config.rl_context_window is not None:
        check_window(config, env)
    return unused_option_notes(config, strategies.values())
