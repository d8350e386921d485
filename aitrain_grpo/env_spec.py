"""`--rl-env KIND:NAME`: one way to name an environment from any ecosystem on the command line.

A spec is expanded into what the rest of the package already knows, a module, a class and keyword
arguments, before anything else reads the options. So run_config.json, resume checks, `eval` on a
training run and `sft` see an ordinary environment, and the adapter's own class does the mapping:

    textarena:Wordle-v0              -> aitrain_grpo.env.adapters.textarena.TextArenaEnv(game="Wordle-v0", ...)
    reasoning_gym:basic_arithmetic   -> aitrain_grpo.env.adapters.reasoning_gym.ReasoningGymEnv(task=..., ...)
    trl:my_module:MyEnv              -> aitrain_grpo.env.adapters.trl_factory.TRLFactoryEnv(env_class="my_module:MyEnv", ...)
    skyrl:my_module:MyEnv            -> aitrain_grpo.env.adapters.skyrl.SkyRLEnv(env_class="my_module:MyEnv", ...)
    my_module:MyEnv                  -> my_module.MyEnv(...)  (the same as --rl-env-module/--rl-env-class)

The rest of the keyword arguments come from `--rl-env-config` as usual; giving the spec's own key there
as well is refused (two values for one argument). Each adapter imports its package only when built,
and a missing package is a one-line error with its install command (the adapter's).

Left out: OpenEnv URLs, mixtures of several environments, and discovering kinds from entry points.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aitrain_grpo.errors import EnvLoadError


@dataclass(frozen=True)
class EnvKind:
    module: str
    class_name: str
    key: str  # the constructor argument the spec's NAME goes to
    example: str
    needs_class: bool = False  # NAME is `module:Class`, a user's class the adapter wraps


KINDS = {
    "textarena": EnvKind("aitrain_grpo.env.adapters.textarena", "TextArenaEnv", "game", "textarena:Wordle-v0"),
    "reasoning_gym": EnvKind("aitrain_grpo.env.adapters.reasoning_gym", "ReasoningGymEnv", "task",
                             "reasoning_gym:basic_arithmetic"),
    "trl": EnvKind("aitrain_grpo.env.adapters.trl_factory", "TRLFactoryEnv", "env_class", "trl:my_envs:SearchEnv", True),
    "skyrl": EnvKind("aitrain_grpo.env.adapters.skyrl", "SkyRLEnv", "env_class", "skyrl:my_envs:MathEnv", True),
}


def _config_object(env_config: Any) -> dict[str, Any]:
    if env_config is None or env_config == "":
        return {}
    if isinstance(env_config, dict):
        return dict(env_config)
    try:
        value = json.loads(env_config)
    except (TypeError, json.JSONDecodeError) as exc:
        raise EnvLoadError(f"--rl-env-config is not valid JSON ({exc}); give a JSON object, e.g. '{{\"size\": 200}}'") from None
    if not isinstance(value, dict):
        raise EnvLoadError(f"--rl-env-config must be a JSON object of keyword arguments, got {type(value).__name__}")
    return value


def expand_env_spec(spec: str, env_config: Any = None) -> tuple[str, str, Any]:
    """(module, class name, keyword arguments) for `--rl-env SPEC` with `--rl-env-config ENV_CONFIG`.
    The arguments stay as given (a JSON string, `@file.json`, a dict) unless the spec adds its key,
    when they become a JSON object string. Raises `EnvLoadError` (one line) for a malformed spec."""
    text = (spec or "").strip()
    kinds = ", ".join(f"{k.example}" for k in KINDS.values())
    head, sep, rest = text.partition(":")
    if not sep or not head or not rest:
        raise EnvLoadError(f"--rl-env {spec!r} is not KIND:NAME or module:Class; e.g. {kinds}, or envs.hotel:HotelEnv")
    kind = KINDS.get(head)
    if kind is None:
        if ":" in rest:
            raise EnvLoadError(f"--rl-env {spec!r}: unknown kind {head!r}; the kinds are {', '.join(KINDS)}")
        return head, rest, env_config  # module:Class, our own interface (or AITraining's)
    if kind.needs_class and rest.count(":") != 1:
        raise EnvLoadError(f"--rl-env {spec!r}: {head} takes module:Class after '{head}:', e.g. {kind.example}")
    if isinstance(env_config, str) and env_config.strip().startswith("@"):
        raise EnvLoadError(f"--rl-env {head}:... cannot add its {kind.key!r} to an @file --rl-env-config; "
                           "put the JSON object on the command line")
    arguments = _config_object(env_config)
    if kind.key in arguments:
        raise EnvLoadError(f"--rl-env {spec!r} sets {kind.key!r}, and --rl-env-config sets it too; keep one")
    arguments[kind.key] = rest
    return kind.module, kind.class_name, json.dumps(arguments)
