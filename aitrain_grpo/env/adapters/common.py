"""What the TRL-factory and skyrl-gym adapters share: naming things by `module:attribute`, reading the
rows a user hands in, naming the adapter class after the user's, clamping rewards, and recording how to
build the adapter again.

Neither TRL's `environment_factory` classes nor skyrl-gym's `BaseTextEnv` classes build a dataset (TRL
takes `train_dataset`, SkyRL parquet files), so both adapters take `rows`: a list of dicts, a
`datasets.Dataset`, a `module:function` (called with no arguments; a `module:NAME` that is a list or a
Dataset is used as it is), or the path of a `.parquet`, `.json`, `.jsonl` or `.csv` file (row_files.py).
Every problem is a one-line `EnvLoadError` naming the option.

Left out: hub dataset names (load them in a `module:function`), and dataset splits other than the file's.
"""

from __future__ import annotations

import inspect
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from aitrain_grpo.env.adapters.row_files import ROW_FILES, read_row_file
from aitrain_grpo.errors import EnvLoadError, one_line, raised_message



def import_object(spec: str, option: str) -> Any:
    """The object a `module:attribute` string names (dotted attributes allowed: `mod:Outer.inner`)."""
    module, sep, attribute = spec.partition(":")
    if not sep or not module.strip() or not attribute.strip():
        raise EnvLoadError(f"{option}={one_line(repr(spec), 80)} is not 'module:name'; write e.g. "
                           f"'my_envs.wordle:WordleEnv' (the module's dotted path, a colon, the name)")
    from aitrain_grpo.env.loading import import_user_module  # loading imports the adapters package

    obj = import_user_module(module.strip(), flag=option, what=f"{option} module")
    for part in attribute.strip().split("."):
        if not hasattr(obj, part):
            names = ", ".join(n for n in dir(obj) if not n.startswith("_"))
            raise EnvLoadError(f"{option}={spec!r}: module {module!r} has no {part!r} (it has: "
                               f"{one_line(names, 160)}); check the name after the colon")
        obj = getattr(obj, part)
    return obj


def spec_of(obj: Any) -> str | None:
    """`module:qualname` of a class or function that can be imported again by that name, else None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    return f"{module}:{qualname}"


def load_rows(rows: Any, owner: str, example: str) -> list[dict[str, Any]]:
    """`rows` as checked plain dicts (each with a usable `prompt`); see the module docstring."""
    from aitrain_grpo.env.dataset import validate_dataset

    source = f"{owner} rows"
    if rows is None:
        raise EnvLoadError(f"{owner} needs rows: {example} classes build no dataset; pass rows=[{{'prompt': "
                           f"...}}, ...], rows='module:function' or rows='data/train.parquet'")
    if isinstance(rows, str):
        path = os.path.expanduser(rows)
        if rows.endswith(ROW_FILES) or os.path.sep in rows and ":" not in rows or os.path.exists(path):
            if os.path.isdir(path) or os.path.isfile(path) and not rows.endswith(ROW_FILES):
                raise EnvLoadError(f"rows {rows!r} is a {'folder' if os.path.isdir(path) else 'file of another kind'}; "
                                   f"name a {', '.join(ROW_FILES)} file of rows with a 'prompt' column")
            if not os.path.isfile(path):
                raise EnvLoadError(f"rows file {rows!r} not found (relative paths start at {os.getcwd()}); "
                                   f"check the path")
            rows = read_row_file(rows, path)
        else:
            source = f"rows={rows!r}"
            rows = import_object(rows, "rows")
            if callable(rows) and not isinstance(rows, (list, tuple)):
                try:
                    rows = rows()
                except Exception as exc:
                    raise EnvLoadError(f"{raised_message(source, exc)} when called with no arguments; "
                                       f"fix it") from exc
    return validate_dataset(rows, source=source)


def without(row: Mapping[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    """The row's columns as the user gave them (the adapter's own columns removed)."""
    return {key: value for key, value in row.items() if key not in columns}


def reward_number(value: Any, what: str) -> float:
    """A reward as a float; a value that is not a finite number is the environment's error."""
    if not isinstance(value, (int, float)) and callable(getattr(value, "item", None)):
        try:
            value = value.item()  # numpy and torch scalars
        except (ValueError, RuntimeError, TypeError):
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} returned {one_line(repr(value), 40)}, not a finite number")
    return float(value)


def clamp01(value: float) -> float:
    """A reward as a score: our scores lie in [0, 1] (the two adapters clamp, they do not rescale)."""
    return min(1.0, max(0.0, value))


_NAMED: dict[tuple[type, type], type] = {}


def named_adapter(base: type, user_class: Any) -> type:
    """`base`, or a subclass of it named after the user's class, so that every message naming the
    environment ("WordleEnv.reset raised ...", "environment WordleEnv") names the user's class."""
    if not inspect.isclass(user_class):
        return base
    key = (base, user_class)
    if key not in _NAMED:
        _NAMED[key] = type(user_class.__name__, (base,), {"__module__": user_class.__module__,
                                                           "__qualname__": user_class.__qualname__})
    return _NAMED[key]


def resolve_named(base: type, env_class: Any) -> type:
    """`named_adapter` for what `env_class` names, or `base` when it cannot be resolved yet (the
    constructor then reports why)."""
    if isinstance(env_class, str) and ":" in env_class:
        try:
            env_class = import_object(env_class, "env_class")
        except EnvLoadError:
            return base
    return named_adapter(base, env_class)


def origin(adapter: type, options: dict[str, Any]) -> dict[str, Any]:
    """What `load_environment` would record for this adapter: its module and class, and options that
    build it again (classes and functions by `module:name`). None as the config when they cannot be
    written as JSON (a class defined inside a function, a lambda), so a later `eval` asks for them."""
    config: dict[str, Any] | None = {}
    for key, value in options.items():
        if value is None:
            continue
        if inspect.isclass(value) or inspect.isroutine(value):
            value = spec_of(value)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = None
        if value is None:
            config = None
            break
        config[key] = value
    return {"rl_env_module": adapter.__module__, "rl_env_class": adapter.__name__, "rl_env_config": config}
