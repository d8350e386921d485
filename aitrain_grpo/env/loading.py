"""Load a user's environment class by module path, build it from JSON keyword arguments, check its rows.

`load_environment("envs.hotel", "HotelEnv", '{"num_tasks": 64}')` imports the module with the current
directory on `sys.path` (put first when missing, so a project's own `envs/` folder resolves), finds the
class, checks that it is an environment and that the JSON keys match its constructor, instantiates it,
and for a `ToolEnvironment` builds its tool schemas (so a tool the schema cannot be made from is
reported here, not mid-run). Which interface a class is written to is read from `score_episode`'s
signature: ours, `score_episode(self, episode)`, or AITraining's, `score_episode(self, model, tokenizer,
completion, case_idx)`, whose instances are wrapped into a one-turn `Environment` (env/adapters/aitraining.py).
`as_environment(obj)` is that wrapping for an instance built elsewhere (handed to `train` from Python), and
`describe_interface(env)` says which interface was recognised: nothing outside env/ imports an adapter.

Every failure is an `EnvLoadError` whose message is one line: what went wrong, where (module, file:line,
row index), and how to fix it. The CLI prints it as `error: <message>` and exits 2, so nothing here
prints or exits.

Left out on purpose: loading classes from file paths (`envs/hotel.py`; we ask for the dotted name
instead), reloading modules that are already imported (a same-named package imported earlier answers
first; the not-found message shows which folder it came from), and validating columns other than `prompt`.
Config values are checked against the constructor's annotations (env/config_types.py), and the instance's
`max_turns` against its range (`check_max_turns`), before a model loads.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import os
import pkgutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aitrain_grpo.env.adapters.aitraining import (AITRAINING_SIGNATURE, OUR_SIGNATURE, AITrainingEnvironment, adapt,
                                                  scores_with_policy)
from aitrain_grpo.env.agent import AgentEnvironment
from aitrain_grpo.env.base import Environment, with_environment_defaults
from aitrain_grpo.env.tool_schemas import check_tool_schemas
from aitrain_grpo.env.config_types import check_config_types
from aitrain_grpo.env.tools import ToolEnvironment
from aitrain_grpo.errors import EnvLoadError, describe_exception, one_line, raised_message, user_location

REQUIRED_METHODS = ("build_dataset", "score_episode")
# The library's own base classes are never the answer to "which class did you mean?".
_BASE_CLASSES = (Environment, ToolEnvironment, AgentEnvironment)
_CONFIG_EXAMPLE = """'{"num_tasks": 64, "seed": 1}'"""


# ------------------------------------------------------------------------------------------- helpers


def _closest(name: str, options: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return matches[0] if matches else None


_JSON_KIND = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


# -------------------------------------------------------------------------------------------- config


def parse_config_json(text: str | Mapping | None, option: str = "--rl-env-config") -> dict[str, Any]:
    """Turn `--rl-env-config` (or the `option` named in errors, e.g. `--eval-env-config`) into
    constructor keyword arguments.

    Accepts a JSON object string, `@path/to/file.json`, an already-parsed mapping, or None/"" (no
    keyword arguments). Returns a new dict; raises `EnvLoadError` for anything else.
    """
    if text is None:
        return {}
    if isinstance(text, Mapping):
        bad = [k for k in text if not isinstance(k, str)]
        if bad:
            raise EnvLoadError(f"config keys must be strings (they become keyword arguments), got {bad[0]!r} "
                               f"({type(bad[0]).__name__}); use string keys")
        return dict(text)
    if not isinstance(text, str):
        raise EnvLoadError(f"{option} must be a JSON object string, '@file.json', a dict or None, got "
                           f"{type(text).__name__}; pass e.g. {_CONFIG_EXAMPLE}")
    if not text.strip():
        return {}
    source = option
    if text.startswith("@"):
        try:
            path = Path(text[1:].strip()).expanduser()
            found, is_dir = path.is_file(), path.is_dir()
        except (OSError, ValueError, RuntimeError) as exc:  # a name too long, NUL bytes, ~user unknown
            raise EnvLoadError(f"config file {one_line(text[1:], 80)!r} is not a usable path "
                               f"({describe_exception(exc)}); check the path after '@'") from None
        if not found:
            what = "is a directory" if is_dir else "not found"
            raise EnvLoadError(f"config file {str(path)!r} {what} (relative paths start at {os.getcwd()}); "
                               f"check the path after '@'")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EnvLoadError(f"config file {str(path)!r} could not be read: {describe_exception(exc)}; "
                               f"check its permissions and encoding (UTF-8)") from exc
        source = f"config file {str(path)!r}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        if source == option:
            # Most bad inline configs come from the shell eating double quotes, or from Python-style
            # single quotes; say both, and show what actually arrived.
            raise EnvLoadError(
                f"{option} is not valid JSON: {exc.msg} at {where} in {one_line(text, 80)!r}; JSON needs "
                f"double quotes around keys and strings, and the shell needs the whole object in single "
                f"quotes, e.g. {option} {_CONFIG_EXAMPLE}") from exc
        raise EnvLoadError(f"{source} is not valid JSON: {exc.msg} at {where}; fix the file there "
                           f"(keys and strings need double quotes, no trailing commas)") from exc
    if not isinstance(value, dict):
        kind = _JSON_KIND.get(type(value), type(value).__name__)
        raise EnvLoadError(f"{source} must be a JSON object of keyword arguments, got {kind} "
                           f"({one_line(json.dumps(value), 60)}); write e.g. {_CONFIG_EXAMPLE}")
    return value


# ------------------------------------------------------------------------------------ module & class


def _missing_module_message(module: str, missing: str, flag: str = "--rl-env-module") -> str:
    """The module itself (or a package on its path) does not exist: say where we looked, suggest."""
    parent_name, _, leaf = missing.rpartition(".")
    parent = sys.modules.get(parent_name) if parent_name else None
    if parent is not None and hasattr(parent, "__path__"):
        # The package exists but lacks the submodule: list its siblings. Showing the package's location
        # exposes the classic mix-up of a same-named package elsewhere on sys.path.
        siblings = sorted(m.name for m in pkgutil.iter_modules(list(parent.__path__)))
        where = ", ".join(list(parent.__path__)) or "?"
        best = _closest(leaf, siblings)
        fix = f"did you mean '{parent_name}.{best}'?" if best else f"check the module path ({flag})"
        listed = ", ".join(siblings) if siblings else "none"
        return (f"module {module!r} not found: package {parent_name!r} (at {where}) has no module {leaf!r} "
                f"(it has: {one_line(listed, 200)}); {fix}")
    if parent is not None:  # e.g. 'envs.hotel.HotelEnv': a class name was put into the module path
        return (f"module {module!r} not found: {parent_name!r} is a module, not a package, so it has no "
                f"{leaf!r}; if {leaf} is a class, pass module {parent_name!r} and class {leaf!r}")
    top = missing.split(".")[0]
    return (f"module {module!r} not found: no module or package {top!r} in the current directory "
            f"({os.getcwd()}) or on sys.path; run from your project's root folder or fix the module path "
            f"({flag})")


def import_user_module(module: str, flag: str = "--rl-env-module", what: str = "environment module"):
    """Import a user's module by dotted path from the current directory; every failure is a one-line
    `EnvLoadError` naming `flag`. Also imports reward functions (training/rewards/functions.py)."""
    if not module or not module.strip():
        raise EnvLoadError(f"no {what} given; pass a dotted module path such as envs.hotel ({flag})")
    if "/" in module or "\\" in module or module.endswith(".py"):
        dotted = module.removesuffix(".py").replace("\\", "/").strip("/").replace("/", ".")
        raise EnvLoadError(f"{what} must be a dotted module path, not a file path: got "
                           f"{module!r}; use {dotted!r} and run from the folder that contains it")
    if module.startswith("."):
        raise EnvLoadError(f"{what} {module!r} is relative; use the full dotted path, e.g. "
                           f"envs.hotel")
    if os.getcwd() not in sys.path:  # console scripts start with their bin folder there, not the cwd
        sys.path.insert(0, os.getcwd())
    # Files written after start-up (a fresh project, a test's tmp folder) may be missing from the
    # import system's directory caches.
    importlib.invalidate_caches()
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        # Only a miss on the module itself or one of its parent packages means "not found"; any other
        # missing name was imported by code inside the module.
        if missing and (module == missing or module.startswith(missing + ".")):
            raise EnvLoadError(_missing_module_message(module, missing, flag)) from exc
        location = user_location(exc) or "?"
        raise EnvLoadError(f"module {module!r} failed to import: {one_line(exc)} (imported from "
                           f"{location}); install it or fix the import") from exc
    except ImportError as exc:
        location = user_location(exc) or "?"
        raise EnvLoadError(f"module {module!r} failed to import: {one_line(exc)} (imported from "
                           f"{location}); install the right version or fix the import") from exc
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else (user_location(exc) or "?")
        column = f", column {exc.offset}" if exc.offset else ""
        raise EnvLoadError(f"module {module!r} has a syntax error at {where}{column}: "
                           f"{type(exc).__name__}: {one_line(exc.msg)}; fix the code there") from exc
    except (Exception, SystemExit) as exc:  # SystemExit: a stray sys.exit() at module level
        location = user_location(exc) or "?"
        raise EnvLoadError(f"module {module!r} raised {describe_exception(exc)} while importing (at "
                           f"{location}); fix the module's top-level code") from exc


def _is_env_like(obj: Any) -> bool:
    return inspect.isclass(obj) and all(callable(getattr(obj, m, None)) for m in REQUIRED_METHODS)


def _candidate_classes(mod) -> list[str]:
    """Classes a user may have meant: those defined in the module, plus environments it re-exports."""
    names = []
    for name, obj in vars(mod).items():
        if not inspect.isclass(obj) or name.startswith("_"):
            continue
        defined_here = obj.__module__ == mod.__name__
        if defined_here or (_is_env_like(obj) and obj not in _BASE_CLASSES):
            names.append(name)
    return names


def _find_class(mod, class_name: str) -> type:
    module = mod.__name__
    if not class_name or not class_name.strip():
        classes = ", ".join(_candidate_classes(mod)) or "none"
        raise EnvLoadError(f"no environment class given for module {module!r} (classes there: {classes}); "
                           f"pass the class name (--rl-env-class)")
    obj = getattr(mod, class_name, None)
    if obj is None and not hasattr(mod, class_name):
        candidates = _candidate_classes(mod)
        if not candidates:
            raise EnvLoadError(f"module {module!r} ({mod.__file__}) has no class {class_name!r} and defines "
                               f"no classes; check the module path, or define the class there")
        best = _closest(class_name, candidates) or _closest(class_name.lower(), [c.lower() for c in candidates])
        if best and best not in candidates:  # matched case-insensitively: report the real spelling
            best = next(c for c in candidates if c.lower() == best)
        fix = f"did you mean {best!r}?" if best else "pass one of those (--rl-env-class)"
        raise EnvLoadError(f"module {module!r} has no class {class_name!r}; classes defined there: "
                           f"{', '.join(candidates)}; {fix}")
    if not inspect.isclass(obj):
        if isinstance(obj, Environment) or _is_env_like(type(obj)):
            raise EnvLoadError(f"{module}.{class_name} is an instance of {type(obj).__name__}, not a class; "
                               f"pass the class name {type(obj).__name__!r} and its arguments as config")
        kind = "a function" if inspect.isroutine(obj) else f"a {type(obj).__name__}"
        raise EnvLoadError(f"{module}.{class_name} is {kind}, not a class; pass the name of your environment "
                           f"class (classes defined there: {', '.join(_candidate_classes(mod)) or 'none'})")
    return obj


def _refuse_agent_code_outside_agent_environment(cls: type, label: str, missing: list[str]) -> None:
    """A class with agent code (`rollout`) that lacks a required method was meant as an `AgentEnvironment`:
    say so, rather than ask for the `score_episode` that base class supplies."""
    if missing and callable(getattr(cls, "rollout", None)) and not issubclass(cls, AgentEnvironment):
        raise EnvLoadError(f"{label} has rollout but is not an AgentEnvironment (it has no {', '.join(missing)}); "
                           f"subclass aitrain_grpo.AgentEnvironment, which scores each episode with what "
                           f"async def rollout(self, client, row) returns, and implement build_dataset(self, tokenizer)")


def _check_is_environment(cls: type, module: str) -> bool:
    """Raise `EnvLoadError` unless `cls` is an environment; return whether it is AITraining-style."""
    label = f"class {cls.__name__} in {module!r}"
    if issubclass(cls, Environment):
        # A subclass inherits the base's raising placeholders; it must replace them.
        missing = [m for m in REQUIRED_METHODS if getattr(cls, m) is getattr(Environment, m)]
        _refuse_agent_code_outside_agent_environment(cls, label, missing)
        if missing:
            signatures = " and ".join(f"{m}(self, {'tokenizer' if m == 'build_dataset' else 'episode'})"
                                      for m in missing)
            raise EnvLoadError(f"{label} does not implement {', '.join(missing)}; define {signatures} "
                               f"in {cls.__name__}")
    else:
        # Duck typing is fine: a class with both methods works without inheriting from Environment.
        missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None))]
        _refuse_agent_code_outside_agent_environment(cls, label, missing)
        if missing:
            raise EnvLoadError(f"{label} is not an environment: it has no {', '.join(missing)}; subclass "
                               f"aitrain_grpo.Environment and implement build_dataset(self, tokenizer) and "
                               f"score_episode(self, episode) (or AITraining's {AITRAINING_SIGNATURE})")
    if issubclass(cls, AgentEnvironment) and cls.rollout is AgentEnvironment.rollout:
        raise EnvLoadError(f"{label} does not implement rollout; define async def rollout(self, client, row) in "
                           f"{cls.__name__} (it plays one episode with the OpenAI client and returns its score)")
    if inspect.isabstract(cls):
        abstract = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise EnvLoadError(f"{label} is abstract (unimplemented: {abstract}); implement them or pass a "
                           f"concrete subclass")
    return scores_with_policy(cls)


def _check_arguments(cls: type, kwargs: dict[str, Any]) -> None:
    """Compare the config keys with the constructor's signature before calling it, so a typo is
    reported as a typo rather than as a TypeError from deep inside __init__."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no introspectable signature (C extension): let the call decide
        return
    params = list(signature.parameters.values())
    keywords = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        unknown = [k for k in kwargs if k not in keywords]
        if unknown:
            names = ", ".join(repr(k) for k in unknown)
            if not keywords:
                raise EnvLoadError(f"{cls.__name__} takes no config keywords but the config has {names}; "
                                   f"remove them or add them to {cls.__name__}.__init__")
            best = _closest(unknown[0], keywords)
            fix = f"did you mean {best!r}?" if best else "remove or rename them"
            raise EnvLoadError(f"{cls.__name__} does not accept config key(s) {names}; accepted keywords: "
                               f"{', '.join(keywords)}; {fix}")
    required = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.default is p.empty and p.name not in kwargs]
    if required:
        names = ", ".join(repr(k) for k in required)
        example = ", ".join(f'"{k}": ...' for k in required)
        raise EnvLoadError(f"{cls.__name__} requires config key(s) {names} (no default in __init__); add "
                           f"them to the config, e.g. '{{{example}}}'")


def load_environment(module: str, class_name: str, config: str | Mapping | None = None, *,
                     option: str = "--rl-env-config") -> Environment:
    """Import `module`, find `class_name`, and return `cls(**config)`; see `parse_config_json` (`option`:
    the flag the config came from, named in its errors)."""
    kwargs = parse_config_json(config, option)
    mod = import_user_module(module)
    cls = _find_class(mod, class_name)
    aitraining_style = _check_is_environment(cls, mod.__name__)
    if not aitraining_style:  # a duck-typed class gets the base's optional methods (its own come first)
        cls = with_environment_defaults(cls)
    _check_arguments(cls, kwargs)
    check_config_types(cls, kwargs, option)
    try:
        env = cls(**kwargs)
    except EnvLoadError:  # an adapter's own one-line refusal names the problem and the fix already
        raise
    except Exception as exc:
        raise EnvLoadError(f"{raised_message(f'{cls.__name__}(**config)', exc)}; fix the config values or the "
                           f"constructor") from exc
    check_max_turns(env)
    if isinstance(env, ToolEnvironment):
        env.tool_specs  # builds (and caches) the schemas: a bad tool definition is an EnvLoadError now
    if aitraining_style:
        env = as_environment(env)  # reads get_tools() now: a bad schema is an EnvLoadError here, not mid-run
    check_tool_schemas(env)
    try:  # where the instance came from, so a run handed it from Python records how to build it again
        env.loaded_from = {"rl_env_module": module, "rl_env_class": class_name, "rl_env_config": kwargs or None}
    except (AttributeError, TypeError):  # a class with __slots__ or a frozen one: its own class still names it
        pass
    return env


MAX_TURNS_LIMIT = 10_000  # turns of one episode; past it, a typo (an episode's tokens end it far sooner)


def check_max_turns(env: Any) -> None:
    """An environment's `max_turns` (a class attribute, or set in __init__) must be an integer from 1 to
    `MAX_TURNS_LIMIT`: -3 once played one turn, 0 ten (the default), and 10**12 passed without a word."""
    turns = getattr(env, "max_turns", None)
    if turns is None:
        return
    if isinstance(turns, bool) or not isinstance(turns, int) or not 1 <= turns <= MAX_TURNS_LIMIT:
        raise EnvLoadError(f"{type(env).__name__}.max_turns is {turns!r}; set it to the most model turns one "
                           f"episode may take, an integer from 1 to {MAX_TURNS_LIMIT}")


def as_environment(obj: Any) -> Environment:
    """`obj` as the engine plays it: an instance written to AITraining's interface wrapped into a one-turn
    `Environment` (its tool schemas read and checked now: `EnvLoadError`), anything else as it is (ours,
    an adapter, a duck-typed class with our methods). `load_environment` applies it to what it builds;
    a caller handing in an instance it built itself applies it too. Raises `EnvLoadError` for a
    `score_episode` that is neither interface's."""
    check_max_turns(obj)
    env = adapt(obj) if scores_with_policy(type(obj)) else obj
    check_tool_schemas(env)
    return env


def describe_interface(env: Environment) -> str:
    """Which interface the environment was recognised by, for `aitrain grpo` and `aitrain env check`."""
    if isinstance(env, AITrainingEnvironment):
        return (f"AITraining interface ({AITRAINING_SIGNATURE.replace('self, ', '')}): one model turn per "
                f"episode, scored with the policy model in eval mode under torch.no_grad()")
    adapted = getattr(type(env), "interface", None)  # an ecosystem adapter names what it wraps
    if isinstance(adapted, str):
        return f"{adapted} ({type(env).__name__})"
    turns = "multi-turn (step)" if callable(getattr(env, "step", None)) and getattr(type(env), "step", None) \
        is not Environment.step else "single-turn"
    return f"aitrain-grpo interface ({OUR_SIGNATURE.replace('self, ', '')}), {turns}"


__all__ = ["EnvLoadError", "as_environment", "describe_interface", "load_environment", "parse_config_json"]
