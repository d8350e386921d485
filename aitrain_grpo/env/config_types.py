"""`--rl-env-config` values against the constructor's annotations, before the constructor runs.

JSON has one number type and a boolean, so `{"turns": true}`, `2.5` or `1e308` reach an `int` parameter
and Python takes them without a word (`range(True)` is one turn, `[0] * 2.5` a TypeError deep inside the
class). `check_config_types(cls, kwargs)` compares each value with its parameter's annotation and raises
a one-line `EnvLoadError` naming the parameter, the annotation and the value.

What is checked: `int` (an integer, never a boolean), `float` (a number; an integer is one), `bool`,
`str`, `list`/`tuple`/`Sequence` (an array, its items checked against the item type), `dict`/`Mapping` (an
object, its values checked), `Optional`/`Union`/`X | None` (any member), `Literal` (one of its values).
Left out, accepted as given: unannotated parameters, `Any`, annotations that do not resolve (a name the
module imports only for type checkers), and every other class (the constructor judges `Path`, enums and
its own types).
"""

from __future__ import annotations

import collections.abc
import inspect
import json
import types
import typing
from typing import Any

from aitrain_grpo.errors import EnvLoadError

_NOT_CHECKED = object()  # an annotation this module does not judge


def _annotations(cls: type) -> dict[str, Any]:
    """The constructor's resolved annotations, or {} when they do not resolve."""
    init = getattr(cls, "__init__", None)
    try:
        return typing.get_type_hints(init) if init is not None else {}
    except Exception:  # a forward reference only a type checker resolves: nothing is checked
        return {}


def _matches(value: Any, hint: Any) -> bool | object:
    """Whether `value` (from JSON) fits `hint`; `_NOT_CHECKED` for a hint this module does not judge."""
    if hint is Any or hint is inspect.Parameter.empty:
        return _NOT_CHECKED
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        results = [_matches(value, arg) for arg in args]
        if any(r is True for r in results):
            return True
        return _NOT_CHECKED if any(r is _NOT_CHECKED for r in results) else False
    if origin is typing.Literal:
        return value in args and all(type(value) is type(a) for a in args if a == value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    container = origin or hint
    if container in (list, tuple, set, frozenset, collections.abc.Sequence):
        if not isinstance(value, list):
            return False
        item = args[0] if args and (container is not tuple or len(args) == 2 and args[1] is Ellipsis) else Any
        return all(_matches(v, item) is not False for v in value)
    if container in (dict, collections.abc.Mapping):
        if not isinstance(value, dict):
            return False
        item = args[1] if len(args) == 2 else Any
        return all(_matches(v, item) is not False for v in value.values())
    return _NOT_CHECKED


def _shown(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return text or str(hint).replace("typing.", "")


def check_config_types(cls: type, kwargs: dict[str, Any], option: str = "--rl-env-config") -> None:
    """Raise `EnvLoadError` for the first value in `kwargs` that does not fit its parameter's annotation
    (`option`: the flag the values came from, named in the error)."""
    hints = _annotations(cls)
    for name, value in kwargs.items():
        if name not in hints or _matches(value, hints[name]) is not False:
            continue
        shown = json.dumps(value) if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
        raise EnvLoadError(f"{cls.__name__}'s config key {name!r} is annotated {_shown(hints[name])} but got "
                           f"{shown[:60]} ({type(value).__name__}); pass a value of that type in {option}")
