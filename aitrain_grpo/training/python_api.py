"""`aitrain_grpo.train` for Python callers (`train_from_python`, training/trainer.py): their mistakes named as
`RunConfig` keyword arguments, and an environment handed in as an instance recorded as where it came from.

Each one-line error's flags are rewritten as keywords (`as_python_arguments`:
`--batch-size 8` becomes `batch_size=8`, `--overwrite` `overwrite=True`; the word after a flag becomes
its value only where it can be one, so "--lr must be a number" reads "lr must be a number").
`with_environment_origin` fills the config's environment fields from the instance (training/trainer.py
calls it for every `env=`), so run_config.json says how to build it again, and refuses a config that names
a class the instance is not, nor a subclass of (eval and resume would read the wrong one).

Left out: the command line (commands/), whose flags are the messages' own words.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError


def with_environment_origin(config: RunConfig, env: Any) -> RunConfig:
    """`config` (a copy) naming the environment an instance handed in from Python came from, where the
    config leaves it out: `load_environment`'s module, class and keyword arguments when it built the
    instance, else the instance's own class (an AITraining instance's, not its wrapper's). So
    `train(RunConfig(), env=instance)` needs no `rl_env_module`/`rl_env_class`, and run_config.json records
    how to build the environment again (eval and resume read it)."""
    if isinstance(env, (type, str)):  # the class, or its name, where an instance belongs
        shown = env.__name__ if isinstance(env, type) else env
        raise ConfigError(f"env= takes an environment instance, e.g. {shown}() or load_environment('module', 'Class'), "
                          f"not {'the class' if isinstance(env, type) else 'the string'} {shown!r}; or leave env out "
                          f"and name it in RunConfig(rl_env_module=..., rl_env_class=...)")
    if config.rl_env:  # named by --rl-env already
        return config
    origin = getattr(env, "loaded_from", None)
    if not isinstance(origin, dict):
        cls = type(getattr(env, "user", env))
        origin = {"rl_env_module": cls.__module__, "rl_env_class": cls.__name__, "rl_env_config": None}
    # A config naming a class the instance is not (nor a subclass of): run_config.json would name the wrong one.
    classes = {cls.__name__ for cls in type(getattr(env, "user", env)).__mro__} | {origin["rl_env_class"]}
    if config.rl_env_class and config.rl_env_class not in classes:
        raise ConfigError(f"env= is a {origin['rl_env_class']} but the config names rl_env_class="
                          f"{config.rl_env_class}; leave rl_env_module and rl_env_class out (the instance's are "
                          f"recorded), or make them name the instance's class")
    filled = {key: value for key, value in origin.items() if not getattr(config, key)}
    return dataclasses.replace(config, **filled) if filled else config


def as_python_arguments(message: str) -> str:
    """`message` with each flag of a `RunConfig` field written as that keyword argument: `--overwrite`
    and `--no-peft` become `overwrite=True` and `peft=False`, `--batch-size 8` becomes `batch_size=8`."""
    fields = RunConfig.__dataclass_fields__

    def keyword(match: re.Match) -> str:
        negated, name, value = match.group(1), match.group(2).replace("-", "_"), match.group(3)
        if name not in fields:
            return match.group(0)
        if fields[name].type in ("bool", bool, "bool | None"):
            return f"{name}={'False' if negated else 'True'}" + (value or "")
        if value and not _is_value(name, value.strip()):  # "--lr must be a number": the next word is prose
            return name + value
        return f"{name}=" + (value.strip() if value else "")

    return re.sub(r"--(no-)?([a-z][a-z0-9-]*)( [^\s,;:()]+)?", keyword, message)


# Words that follow a flag in this package's messages and are never its value.
_PROSE = frozenset("must is are was needs exceeds names takes has have cannot can does and or with without of to at "
                   "from the a an alone only here on in for holds gives given applies plays keeps".split())


def _is_value(name: str, word: str) -> bool:
    """Whether `word`, after the flag of field `name` in a message, is the flag's value (`--batch-size 8`,
    `--rl-loss-type dapo`) rather than the sentence going on (`--lr must be a number`)."""
    field_ = RunConfig.__dataclass_fields__[name]
    choices = field_.metadata.get("choices")
    if choices:
        return word.strip("'\"") in choices
    if str(field_.type).split(" |")[0] in ("int", "float"):
        return re.fullmatch(r"'?[-+]?(\d[\d_.]*(e[-+]?\d+)?|inf|nan)'?", word, re.IGNORECASE) is not None
    return word not in _PROSE
