"""`--rl-env KIND:NAME`: one way to name an environment from any ecosystem on the command line.

A spec is expanded into what the rest of the package already knows, a module, a class and keyword
arguments, before anything else reads the options. So run_config.json, resume checks, `eval` on a
training run and `sft` see an ordinary environment, and the adapter's own class does the mapping:

    textarena:GuessTheNumber-v0      -> aitrain_grpo.env.adapters.textarena.TextArenaEnv(game="GuessTheNumber-v0", ...)
    reasoning_gym:basic_arithmetic   -> aitrain_grpo.env.adapters.reasoning_gym.ReasoningGymEnv(task=..., ...)
    trl:my_module:MyEnv              -> aitrain_grpo.env.adapters.trl_factory.TRLFactoryEnv(env_class="my_module:MyEnv", ...)
    skyrl:my_module:MyEnv            -> aitrain_grpo.env.adapters.skyrl.SkyRLEnv(env_class="my_module:MyEnv", ...)
    dataset:data/tasks.jsonl         -> aitrain_grpo.env.adapters.dataset.DatasetEnv(rows="data/tasks.jsonl", ...)
    openenv:http://127.0.0.1:8000    -> aitrain_grpo.env.adapters.openenv.OpenEnvEnv(url="http://127.0.0.1:8000", ...)
    verifiers:my_module:make_env     -> aitrain_grpo.env.adapters.verifiers.VerifiersEnv(env="my_module:make_env", ...)
                                        (or verifiers:ENV_ID, an installed verifiers environment)
    my_module:MyEnv                  -> my_module.MyEnv(...)  (the same as --rl-env-module/--rl-env-class)
    --rl-env A --rl-env B            -> aitrain_grpo.env.adapters.mixture.MixtureEnv(envs=[A, B], weights=...)

The rest of the keyword arguments come from `--rl-env-config` as usual; giving the spec's own key there
as well is refused (two values for one argument). Each adapter imports its package only when built,
and a missing package is a one-line error with its install command (the adapter's).

Several specs make a mixture: `--rl-env-config` is then a JSON array with one object (or null) per
environment, in order, and `--rl-env-weights 0.7,0.3` their shares of the dataset.

Left out: discovering kinds from entry points.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aitrain_grpo.errors import ConfigError, EnvLoadError, parsed_json

MIXTURE = ("aitrain_grpo.env.adapters.mixture", "MixtureEnv")


@dataclass(frozen=True)
class EnvKind:
    module: str
    class_name: str
    key: str  # the constructor argument the spec's NAME goes to
    example: str
    needs_class: bool = False  # NAME is `module:Class`, a user's class the adapter wraps


KINDS = {
    "textarena": EnvKind("aitrain_grpo.env.adapters.textarena", "TextArenaEnv", "game", "textarena:GuessTheNumber-v0"),
    "reasoning_gym": EnvKind("aitrain_grpo.env.adapters.reasoning_gym", "ReasoningGymEnv", "task",
                             "reasoning_gym:basic_arithmetic"),
    "trl": EnvKind("aitrain_grpo.env.adapters.trl_factory", "TRLFactoryEnv", "env_class", "trl:my_envs:SearchEnv", True),
    "skyrl": EnvKind("aitrain_grpo.env.adapters.skyrl", "SkyRLEnv", "env_class", "skyrl:my_envs:MathEnv", True),
    "dataset": EnvKind("aitrain_grpo.env.adapters.dataset", "DatasetEnv", "rows", "dataset:data/tasks.jsonl"),
    "openenv": EnvKind("aitrain_grpo.env.adapters.openenv", "OpenEnvEnv", "url", "openenv:http://127.0.0.1:8000"),
    "verifiers": EnvKind("aitrain_grpo.env.adapters.verifiers", "VerifiersEnv", "env", "verifiers:my_envs:make_env"),
}


def _config_object(env_config: Any) -> dict[str, Any]:
    if env_config is None or env_config == "":
        return {}
    if isinstance(env_config, dict):
        return dict(env_config)
    value = parsed_json(env_config, "--rl-env-config", "give a JSON object, e.g. '{\"size\": 200}'",
                        EnvLoadError) if isinstance(env_config, str) else env_config
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


def env_specs(spec: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """`--rl-env`'s value as a list of specs: one string, several (a mixture), or none."""
    if not spec:
        return []
    return [spec] if isinstance(spec, str) else [str(s) for s in spec]


def spec_label(spec: str | list[str] | None) -> str:
    """A short name for what `spec` names (output folders, a mixture's metrics): `Wordle-v0`, `HotelEnv`,
    `openenv` for a URL, `mixture` for several."""
    specs = env_specs(spec)
    if len(specs) != 1:
        return "mixture" if specs else ""
    head, _, rest = specs[0].partition(":")
    return head if "//" in rest else specs[0].rsplit(":", 1)[-1]


def mixture_weights(weights: Any, count: int) -> list[float] | None:
    """`--rl-env-weights 0.7,0.3` (or a list) as numbers, one per environment of the mixture."""
    if weights is None or weights == "":
        return None
    items = weights.split(",") if isinstance(weights, str) else list(weights)
    try:
        values = [float(w) for w in items]
    except (TypeError, ValueError):
        values = []
    if len(values) != count or any(not v >= 0 for v in values) or not sum(values) > 0:
        raise ConfigError(f"--rl-env-weights {weights!r} must be {count} non-negative numbers, one per --rl-env, "
                          f"not all zero; e.g. {','.join(['1'] * count)}")
    return values


def _mixture_configs(env_config: Any, count: int, option: str = "--rl-env-config") -> list[Any]:
    if env_config is None or env_config == "":
        return [None] * count
    value = env_config
    if isinstance(env_config, str):
        value = parsed_json(env_config, option, "with --rl-env repeated give a JSON array, one object (or "
                            "null) per environment", EnvLoadError)
    if not isinstance(value, list) or len(value) != count or not all(v is None or isinstance(v, dict) for v in value):
        raise EnvLoadError(f"with --rl-env given {count} times, {option} must be a JSON array of {count} objects "
                           f"(or nulls), one per environment in order, e.g. '[{{\"size\": 100}}, null]'")
    return value


def check_environment_named(spec: Any, module: str | None, class_name: str | None, weights: Any = None) -> None:
    """Exactly one way of naming the environment: --rl-env (once, or repeated for a mixture), or
    --rl-env-module with --rl-env-class. A malformed spec is refused here, before anything loads."""
    specs = env_specs(spec)
    if specs and (module or class_name):
        raise ConfigError("give the environment once: --rl-env, or --rl-env-module and --rl-env-class, not both")
    if weights not in (None, "") and len(specs) < 2:
        raise ConfigError("--rl-env-weights weighs the environments of a mixture; give --rl-env two or more times")
    for one in specs:
        expand_env_spec(one)
    if specs:
        mixture_weights(weights, len(specs))
        return
    if not module:
        raise ConfigError("no environment given; pass --rl-env-module (e.g. envs.hotel) and --rl-env-class, "
                          "or --rl-env (e.g. reasoning_gym:basic_arithmetic)")
    if not class_name:
        raise ConfigError("no environment class given; pass --rl-env-class (e.g. HotelEnv)")


def environment_of(spec: Any, module: str | None, class_name: str | None, env_config: Any,
                   weights: Any = None, option: str = "--rl-env-config") -> tuple[str, str, Any]:
    """(module, class name, keyword arguments) of the environment named by --rl-env (a mixture when
    repeated) or by --rl-env-module/--rl-env-class, checked first; every command names one so. `option`
    is the flag `env_config` came from (--eval-env-config for a held-back evaluation), named in errors."""
    check_environment_named(spec, module, class_name, weights)
    specs = env_specs(spec)
    if len(specs) > 1:
        configs = _mixture_configs(env_config, len(specs), option)
        members = [{"spec": one, "config": config} for one, config in zip(specs, configs)]
        return (*MIXTURE, json.dumps({"envs": members, "weights": mixture_weights(weights, len(specs))}))
    return expand_env_spec(specs[0], env_config) if specs else (module, class_name, env_config)
