"""The `aitrain` command line: `grpo` (train) and `tiny-model` (build the local demo model).

Every option of `aitrain grpo` is a `RunConfig` field; the flags are generated from those fields so
the names, defaults and help texts live in one place (config.py). A flag given on the command line
overrides the same option in `--config`. Problems a user can fix (bad options, an environment that
does not load) print one line, `error: ...`, and exit with code 2; `--debug` shows the traceback.

Left out: the library logic itself; each command is a thin call into the modules.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Optional

import typer
from rich.console import Console

from .config import ConfigError, RunConfig

app = typer.Typer(
    help="Train language-model agents with GRPO in environments you write.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

EXIT_USAGE = 2


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is meant for the user as it stands."""
    from .chat import TemplateError
    from .loading import EnvLoadError

    return (ConfigError, EnvLoadError, TemplateError)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    err.print(f"error: {' '.join(str(message).split())}", markup=False)
    raise typer.Exit(code)


# ------------------------------------------------------------------------------ aitrain grpo

_FLAG_TYPES = {"rl_env_config": str, "epochs": float, "lr": float}
_BOOL_FLAGS = {"peft": "--peft/--no-peft", "use_vllm": "--use-vllm/--no-use-vllm", "overwrite": "--overwrite", "debug": "--debug"}


def _flag_type(name: str, default: Any) -> type:
    if name in _FLAG_TYPES:
        return _FLAG_TYPES[name]
    hints = {"rl_max_turns": int, "max_steps": int, "save_steps": int}
    if name in hints:
        return hints[name]
    return type(default) if default is not None else str


def _grpo_parameters() -> list[inspect.Parameter]:
    params = []
    for f in RunConfig.__dataclass_fields__.values():
        help_text = RunConfig.help_for(f.name)
        if f.name in _BOOL_FLAGS:
            option = typer.Option(None, *_BOOL_FLAGS[f.name].split(" "), help=help_text, show_default=False)
            annotation = Optional[bool]
        else:
            option = typer.Option(None, f"--{f.name.replace('_', '-')}", help=help_text, show_default=False)
            annotation = Optional[_flag_type(f.name, f.default)]
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    config_option = typer.Option(None, "--config", help="YAML or JSON file of these options; flags override it.")
    params.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=config_option, annotation=Optional[str]))
    return params


def build_run_config(config_file: str | None, flags: dict[str, Any]) -> RunConfig:
    """Options from `--config`, then the flags that were given, into a validated RunConfig."""
    options = RunConfig.from_file(config_file) if config_file else {}
    options.update({k: v for k, v in flags.items() if v is not None})
    return RunConfig(**options).validate()


def grpo(**kwargs) -> None:
    """Train a model with GRPO in your environment (multi-turn episodes, tools, LoRA)."""
    debug = bool(kwargs.get("debug"))
    try:
        config = build_run_config(kwargs.pop("config", None), kwargs)
        if config.model == "tiny":
            out.print(
                "Using the built-in tiny model (a few hundred thousand parameters, built locally); "
                "pass --model Qwen/Qwen2.5-0.5B-Instruct (or a local path) to train a real one.",
                markup=False,
            )
        from .training import check_output_dir, train
        from .loading import load_environment

        check_output_dir(config)
        env = load_environment(config.rl_env_module, config.rl_env_class, config.rl_env_config)
        summary = train(config, env=env)
    except user_errors() as exc:
        if debug:
            raise
        fail(str(exc))
    out.print(f"done: {summary['global_step']} steps in {summary['runtime_seconds']:.0f}s; model saved to {config.resolved_output_dir()}")


grpo.__signature__ = inspect.Signature(_grpo_parameters())
app.command("grpo")(grpo)


# ------------------------------------------------------------------------------ aitrain tiny-model


@app.command("tiny-model")
def tiny_model(
    output_dir: str = typer.Argument(..., help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, help="Seed of the build (same seed, same weights)."),
) -> None:
    """Build the tiny local model (Llama architecture, byte-level BPE, ChatML template with tools)."""
    from .tiny import build_tiny_model

    path = build_tiny_model(output_dir, seed=seed)
    out.print(f"tiny model written to {path}; train it with: aitrain grpo --model {path} --rl-env-module envs.hotel --rl-env-class HotelEnv")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
