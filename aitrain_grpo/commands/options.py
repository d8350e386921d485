"""Command-line options made from `RunConfig` fields, and the option checks `eval` and `env check` share.

Every flag that names a run option (`--rl-max-new-tokens`, `--rl-top-k`, `--model`, ...) takes its name,
type and help from the `RunConfig` field (config.py), so `grpo`, `eval` and `env check` cannot drift
apart. `grpo` takes every field (flags override `--config`); `env check` takes some with the same
defaults; `eval` takes the sampling and budget options with the training run's values (from
`run_config.json`) coming before the field defaults. An option whose meaning differs in a command
(`eval --rl-num-generations` is k of pass@k) says so in its own help and default.

Left out: the commands themselves (cli.py) and checks that involve a whole run (`RunConfig.validate`).
"""

from __future__ import annotations

import inspect
from dataclasses import Field, fields
from typing import Any, Optional

import typer

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError

FIELDS: dict[str, Field] = {f.name: f for f in fields(RunConfig)}
_FLAG_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def flag_type(name: str) -> type:
    """The flag's Python type, read from the field's annotation (`int | None` -> int, `Any` -> str)."""
    kinds = [k.strip() for k in str(FIELDS[name].type).split("|")]
    return next((_FLAG_TYPES[k] for k in kinds if k in _FLAG_TYPES), str)


def with_default(help_text: str, default: Any) -> str:
    """`help_text (default: X)`; None, booleans and empty strings are not shown."""
    hidden = default is None or isinstance(default, bool) or default == ""
    return help_text if hidden else f"{help_text} (default: {default})"


def field_option(name: str, default: Any, help_text: str, *, required: bool = False) -> inspect.Parameter:
    """A keyword parameter for typer: flag name and type from the `RunConfig` field `name`."""
    kind = flag_type(name)
    if kind is bool:
        # Every switch has its --no- form: a default of True (--no-shuffle-dataset), or a True from --config,
        # can then be switched off on the command line.
        decls = [f"{flag_name(name)}/--no-{flag_name(name)[2:]}"]
    else:
        decls = [flag_name(name)]
    repeated = "list[str]" in str(FIELDS[name].type)  # the flag may be repeated (--rl-env A --rl-env B)
    option = typer.Option(... if required else default, *decls, help=help_text, show_default=False,
                          metavar="<str>" if repeated else None)
    annotation = Optional[kind] if default is None and not required else kind
    if repeated:
        annotation = Optional[list[str]]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def as_in_grpo(name: str, *, help_text: str | None = None, required: bool = False) -> inspect.Parameter:
    """The option with `grpo`'s default and help (or `help_text`, with that default shown)."""
    default = FIELDS[name].default
    return field_option(name, default, with_default(help_text, default) if help_text else RunConfig.help_for(name),
                        required=required)


def from_training_run(name: str) -> inspect.Parameter:
    """An option of `eval`: not given, it is the training run's value, else `grpo`'s default."""
    default = FIELDS[name].default
    help_text = FIELDS[name].metadata["help"]
    fallback = ", if any" if default in (None, "") else f", else {default}"
    return field_option(name, None, f"{help_text} Default: the training run's{fallback}.")


def grpo_parameters() -> list[inspect.Parameter]:
    """Every `RunConfig` field as a flag that is None unless given (so it overrides `--config` only
    then), plus `--config`."""
    params = [field_option(f.name, None, RunConfig.help_for(f.name)) for f in fields(RunConfig)]
    config_option = typer.Option(None, "--config", help="YAML or JSON file of these options; flags override it.")
    params.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=config_option,
                                    annotation=Optional[str]))
    return params


def command_option(name: str, default: Any, help_text: str, kind: type) -> inspect.Parameter:
    """An option of one command only (not a run option): `--episodes`, `--baseline`, ..."""
    option = typer.Option(default, flag_name(name), help=with_default(help_text, default), show_default=False)
    annotation = Optional[kind] if default is None else kind
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def check_positive(**counts: Any) -> None:
    """Each count (`episodes=16`, `batch_size=32`) must be a positive integer; named by its flag."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag_name(name)} must be a positive integer, got {value!r}")
