"""Environments written for TRL's `GRPOTrainer(environment_factory=MyEnv)`, run unchanged.

What TRL 1.16 does with such a class (trl/trainer/grpo_trainer.py), and what this adapter does:

- Instances. TRL calls the factory with no arguments, probes one instance at start, and keeps a pool
  reused across batches ("construct once, reset often"). Here each episode gets a fresh
  `env_class(**env_kwargs)` in `reset`, kept in `episode.state["trl_env"]`; one probe instance reads
  the tools and makes the prompts (below).
- `reset(**row)`. TRL calls it with every column of the dataset row, `prompt` included. A string it
  returns is appended to the content of the prompt's last message (plain concatenation); None leaves
  the prompt as it is. Ours renders the prompt before `reset` runs, so the probe's `reset` is called on
  each row when the rows are read and its string appended then; each episode's own `reset` must return
  the same string, or the episode fails (score 0) with a message saying so: a reset whose text changes
  from call to call for one row (a random puzzle in the text) needs a column to seed it from.
- Tools. TRL offers `inspect.getmembers(type(env), inspect.isfunction)` minus `reset`, `get_reward` and
  names starting with `_`: every public method (static methods too, not class methods or properties),
  sorted by name, each schema made by `transformers.utils.get_json_schema` from the bound method (what
  the chat template makes of it). Ours offers exactly those schemas; a method they cannot be made from
  is an `EnvLoadError` here (TRL fails when it first renders a prompt).
- Tool calls run on the episode's instance in the order written (async tools awaited); the result is
  `str(result)`, as TRL makes it. Unlike TRL, arguments are checked against the schema first, and a
  tool that raises (or a bad call) answers `Error: ...` (TRL: `{'error': '...'}`), as every
  `ToolEnvironment` does. A turn without tool calls ends the episode, as it ends TRL's tool loop; the
  turn cap is `max_turns` (TRL's `max_tool_calling_iterations`, unlimited by default there).
- Reward. TRL adds `get_reward()` (sync or async, once per finished rollout) as a reward source of
  weight 1 next to `reward_funcs`, which read the instances through their `environments` keyword. Here
  the score is `get_reward()` plus `reward_func` when given (a TRL reward function, `module:function`
  or callable, called for this one episode with `environments=[instance]`, `prompts`, `completions`,
  the row's columns as one-element lists, and `log_metric` writing to `episode.metrics`), clamped to
  [0, 1]; the raw sum is `episode.metrics["trl_reward"]`. A class with neither is an `EnvLoadError`.

Rows: TRL factory classes build no dataset, so `rows` is required (a list of dicts, a Dataset, a
`module:function` or a .parquet/.json/.jsonl path; env/adapters/common.py). Two columns are added:
`_trl_prompt` (the prompt as given, what `reset` receives) and `_trl_reset` (what the probe's reset
returned). From the command line (all options are JSON):

    aitrain grpo --rl-env-module aitrain_grpo.env.adapters.trl_factory --rl-env-class TRLFactoryEnv \\
        --rl-env-config '{"env_class": "my_envs:WordleEnv", "rows": "my_envs:rows"}'

Left out: a dict of factories (TRL's multi-environment form: one adapter per class), multimodal reset
strings and tool results (content blocks), reusing instances between episodes, TRL's placeholder
dataset for classes whose reset writes the whole prompt (give rows of an empty user message and a
seed column), and `completion_ids`/`trainer_state`/`log_extra` for `reward_func` (None and a no-op).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from typing import Any

from aitrain_grpo.env.adapters.common import (clamp01, import_object, load_rows, origin, resolve_named,
                                              reward_number, without)
from aitrain_grpo.env.base import Episode, Message, ToolCall
from aitrain_grpo.env.tools import ToolEnvironment, ToolSpec, refused_call
from aitrain_grpo.errors import EnvLoadError, one_line, raised_message

RESERVED = ("reset", "get_reward")  # never tools, as in TRL
STATE_KEY = "trl_env"
PROMPT_LENGTH_KEY = "trl_prompt_length"  # messages before the first model turn
PROMPT_COLUMN = "_trl_prompt"
RESET_COLUMN = "_trl_reset"
OWN_COLUMNS = (PROMPT_COLUMN, RESET_COLUMN)
DEFAULT_MAX_TURNS = 10
REWARD_FUNC_EXAMPLE = "def reward(environments, **kwargs): return [env.reward for env in environments]"


def tool_names(cls: type) -> list[str]:
    """The methods TRL exposes as tools, in TRL's order (sorted by name)."""
    return [name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if name not in RESERVED and not name.startswith("_")]


def with_reset_text(prompt: Any, text: str | None) -> Any:
    """The prompt with `reset`'s string appended to its last message, as TRL appends it."""
    if text is None:
        return prompt
    if isinstance(prompt, str):
        return prompt + text
    last = prompt[-1]
    return [*prompt[:-1], {**last, "content": (last.get("content") or "") + text}]


class TRLFactoryEnv(ToolEnvironment):
    """A TRL `environment_factory` class as a tool `Environment` (see the module docstring)."""

    interface = "TRL environment_factory"

    def __new__(cls, env_class: Any, rows: Any = None, env_kwargs: dict | None = None,
                reward_func: Any = None, max_turns: int = DEFAULT_MAX_TURNS):
        # The same parameters as __init__: load_environment checks config keys against this signature.
        return super().__new__(resolve_named(cls, env_class) if cls is TRLFactoryEnv else cls)

    def __init__(self, env_class: Any, rows: Any = None, env_kwargs: dict | None = None,
                 reward_func: Any = None, max_turns: int = DEFAULT_MAX_TURNS):
        if isinstance(env_class, dict):
            raise EnvLoadError("env_class is a dict of factories (TRL's multi-environment form); give one "
                               "class per TRLFactoryEnv")
        if isinstance(env_class, str):
            env_class = import_object(env_class, "env_class")
        if not callable(env_class):
            raise EnvLoadError(f"env_class is a {type(env_class).__name__}; give the environment class (or a "
                               f"factory called with no arguments), or 'module:Class'")
        if env_kwargs is not None and not isinstance(env_kwargs, dict):
            raise EnvLoadError(f"env_kwargs is a {type(env_kwargs).__name__}; give a dict of keyword arguments "
                               f"for the environment class")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise EnvLoadError(f"max_turns={max_turns!r}; give a whole number of model turns, at least 1")
        self.env_class, self.env_kwargs, self.max_turns = env_class, dict(env_kwargs or {}), max_turns
        self.name = getattr(env_class, "__name__", type(env_class).__name__)
        self.probe = self.new_instance(EnvLoadError)
        members = dict(inspect.getmembers(type(self.probe), predicate=inspect.isfunction))
        if "reset" not in members:
            raise EnvLoadError(f"{self.name} has no reset method, which TRL requires; define "
                               f"def reset(self, **kwargs) -> str | None")
        self.has_get_reward = "get_reward" in members
        self.reward_func = import_object(reward_func, "reward_func") if isinstance(reward_func, str) else reward_func
        if self.reward_func is not None and not callable(self.reward_func):
            raise EnvLoadError(f"reward_func is a {type(self.reward_func).__name__}; give a TRL reward function "
                               f"or 'module:function', e.g. {REWARD_FUNC_EXAMPLE}")
        if not self.has_get_reward and self.reward_func is None:
            raise EnvLoadError(f"{self.name} has no get_reward(), so its reward comes from a TRL reward "
                               f"function: pass reward_func='module:function' ({REWARD_FUNC_EXAMPLE})")
        self._schemas, self._specs = self._read_tools()
        self.rows = [self._with_reset(i, row) for i, row in enumerate(load_rows(rows, self.name, "TRL factory"))]
        self.loaded_from = origin(TRLFactoryEnv, {"env_class": env_class, "rows": rows, "env_kwargs": env_kwargs,
                                                  "reward_func": reward_func, "max_turns": max_turns})

    # ---------------------------------------------------------------------------------- setup

    def new_instance(self, error: type[Exception] = RuntimeError) -> Any:
        try:
            return self.env_class(**self.env_kwargs)
        except Exception as exc:
            raise error(raised_message(f"{self.name}(**env_kwargs)", exc)) from exc

    def _read_tools(self) -> tuple[list[dict[str, Any]], dict[str, ToolSpec]]:
        from transformers.utils import get_json_schema

        schemas, specs = [], {}
        for name in tool_names(type(self.probe)):
            try:
                schema = get_json_schema(getattr(self.probe, name))
            except Exception as exc:
                raise EnvLoadError(f"{self.name}.{name} is public, so TRL offers it as a tool, but its schema "
                                   f"cannot be made ({one_line(exc, 160)}); give it type hints and a Google-style "
                                   f"docstring with an Args: line per parameter, or rename it _{name}") from exc
            checked = copy.deepcopy(schema)
            checked["function"]["parameters"].setdefault("required", [])
            schemas.append(schema)
            specs[name] = ToolSpec(name=name, schema=checked, function=getattr(self.probe, name),
                                   wants_episode=False)
        return schemas, specs

    def _with_reset(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        """The row with the probe's reset string in its prompt (and the columns to check it by)."""
        try:
            text = self._call_reset(self.probe, row)
        except Exception as exc:
            raise EnvLoadError(f"row {index}: {raised_message(f'{self.name}.reset(**row)', exc)}; fix reset or the "
                               f"row") from exc
        return {**row, "prompt": with_reset_text(row["prompt"], text), PROMPT_COLUMN: row["prompt"],
                RESET_COLUMN: text}

    @staticmethod
    def _call_reset(instance: Any, row: dict[str, Any]) -> str | None:
        text = instance.reset(**copy.deepcopy(row))
        if inspect.isawaitable(text):
            text = asyncio.run(text)
        if text is not None and not isinstance(text, str):
            raise TypeError(f"reset returned a {type(text).__name__}; return a string (appended to the prompt) "
                            f"or None")
        return text

    # ---------------------------------------------------------------------------------- contract

    @property
    def tool_specs(self) -> dict[str, ToolSpec]:
        return self._specs

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self._schemas

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        return [dict(row) for row in self.rows]

    def reset(self, episode: Episode) -> None:
        instance = self.new_instance()
        row = {**without(episode.row, OWN_COLUMNS), "prompt": episode.row.get(PROMPT_COLUMN, episode.row["prompt"])}
        text, shown = self._call_reset(instance, row), episode.row.get(RESET_COLUMN)
        if text != shown:
            raise ValueError(f"returned {one_line(repr(text), 60)}, not the {one_line(repr(shown), 60)} it returned "
                             f"for this row when the prompt was made (prompts are made before the episode); "
                             f"make reset's string depend only on the row (seed from a column)")
        episode.state[STATE_KEY] = instance
        episode.state[PROMPT_LENGTH_KEY] = len(episode.messages)

    async def run_tool_call(self, episode: Episode, call: ToolCall) -> Message:
        """Run one call on the episode's instance; its result as TRL shows it, `str(result)`."""
        refused = refused_call(self._specs, episode, call)
        if refused is not None:
            return refused
        name = call["name"]
        method = getattr(episode.state[STATE_KEY], name)
        try:
            if inspect.iscoroutinefunction(method):
                result = await method(**call["arguments"])
            else:  # in a worker thread, so a slow tool does not hold up the other episodes
                result = await asyncio.to_thread(method, **call["arguments"])
        except Exception as exc:  # a tool's failure is information for the model, not a crash
            episode.log.tool_failed()
            return {"role": "tool", "name": name, "content": f"Error: {type(exc).__name__}: {exc}"}
        return {"role": "tool", "name": name, "content": str(result)}

    async def score_episode(self, episode: Episode) -> float:
        instance = episode.state[STATE_KEY]
        total = 0.0
        if self.has_get_reward:
            get_reward = instance.get_reward
            value = await get_reward() if inspect.iscoroutinefunction(get_reward) else \
                await asyncio.to_thread(get_reward)
            total += reward_number(value, f"{self.name}.get_reward()")
        if self.reward_func is not None:
            total += await self._reward_func_value(episode, instance)
        episode.metrics["trl_reward"] = total
        return clamp01(total)

    async def _reward_func_value(self, episode: Episode, instance: Any) -> float:
        """`reward_func` called as TRL calls reward functions, for a batch of this one episode."""
        prompt_length = episode.state[PROMPT_LENGTH_KEY]
        columns = {key: [value] for key, value in without(episode.row, OWN_COLUMNS).items()
                   if key not in ("prompt", "completion", "completion_ids")}
        kwargs = dict(prompts=[episode.messages[:prompt_length]], completions=[episode.messages[prompt_length:]],
                      completion_ids=[None], trainer_state=None, log_extra=lambda *args, **kw: None,
                      log_metric=lambda name, value: episode.metrics.__setitem__(str(name), float(value)),
                      environments=[instance], **columns)
        if inspect.iscoroutinefunction(self.reward_func):
            values = await self.reward_func(**kwargs)
        else:
            values = await asyncio.to_thread(lambda: self.reward_func(**kwargs))
        what = f"reward_func {getattr(self.reward_func, '__name__', '')}".rstrip()
        if not isinstance(values, (list, tuple)) or len(values) != 1:
            raise ValueError(f"{what} returned {one_line(repr(values), 60)}; return a list of one reward per "
                             f"completion (here one)")
        return 0.0 if values[0] is None else reward_number(values[0], what)  # None abstains, as in TRL


def adapt_trl_factory(env_class: Any, **config: Any) -> TRLFactoryEnv:
    """Wrap a TRL `environment_factory` class: `adapt_trl_factory(WordleEnv, rows=[...])`; the keyword
    arguments are `TRLFactoryEnv`'s (`rows`, `env_kwargs`, `reward_func`, `max_turns`)."""
    return TRLFactoryEnv(env_class, **config)
