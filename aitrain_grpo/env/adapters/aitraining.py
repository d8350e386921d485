"""Environments written for AITraining, run unchanged: recognised by their signature, adapted to ours.

AITraining's GRPO trainer takes a duck-typed class with `build_dataset(self, tokenizer)` (a `prompt`
column, usually a `case_idx` column), `score_episode(self, model, tokenizer, completion, case_idx) ->
float` scoring one completion, and optionally `get_tools(self) -> list[dict]` (OpenAI-style function
schemas). `scores_with_policy(cls)` recognises that `score_episode` by its parameter names;
`AITrainingEnvironment` wraps an instance so that the engine sees an ordinary one-turn `Environment`:

- `build_dataset` passes the user's rows through (our checks of `prompt` follow in env/dataset.py),
  adding a `case_idx` column holding each row's index where the rows have none;
- `tools` are `get_tools()`'s schemas, normalised to `{"type": "function", "function": {...}}` (a bare
  function dict is wrapped) and checked at load time; they reach the prompt like any environment's
  tools. The engine parses tool calls in the completion into `episode.tool_calls` and counts them
  (`env/tool_calls_mean`); nothing executes them, as in AITraining;
- `score_episode(episode)` calls the user's method by keyword, as AITraining does: `completion` is what
  TRL hands reward functions (the text for a string prompt, `[{"role": "assistant", "content": text}]`
  for a chat prompt), `case_idx` the row's, `model` and `tokenizer` the policy given to `use_policy`.
  The call runs under `torch.no_grad()` with the model in eval mode (restored afterwards), one call at
  a time: episodes are scored concurrently in worker threads, while AITraining scores in a loop and
  user code written for it may not be thread-safe. So `--rl-env-timeout` bounds a call together with
  its wait for the calls queued before it.

The policy reaches the adapter explicitly (`needs_policy`): whoever plays episodes calls `env.use_policy(model,
tokenizer)` (training: the unwrapped trainer model before each rollout; `eval` and `env check`: the
model they load). The adapter class is made per user class and carries its name, so every message
that names the environment ("HelloEnv.score_episode raised ...") names the user's class.

Left out: executing tool calls (AITraining does not either), multi-turn play (an AITraining
environment plays further turns itself, inside `score_episode`, with the model it is given), and
scores outside [0, 1] (AITraining takes any float; here they are the environment's error, as for ours).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Mapping
from typing import Any

from aitrain_grpo.env.base import Environment, Episode
from aitrain_grpo.errors import EnvLoadError, one_line, raised_message

AITRAINING_PARAMETERS = ("model", "tokenizer", "completion", "case_idx")
OUR_SIGNATURE = "score_episode(self, episode)"
AITRAINING_SIGNATURE = "score_episode(self, model, tokenizer, completion, case_idx)"
CASE_COLUMN = "case_idx"


def _parameters(cls: type) -> list[inspect.Parameter] | None:
    """`score_episode`'s parameters without `self` (None when it has no introspectable signature)."""
    raw = inspect.getattr_static(cls, "score_episode", None)
    try:
        params = list(inspect.signature(getattr(cls, "score_episode")).parameters.values())
    except (TypeError, ValueError):
        return None
    if not isinstance(raw, (staticmethod, classmethod)) and params and \
            params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]  # self
    return params


def scores_with_policy(cls: type) -> bool:
    """Whether `cls.score_episode` is AITraining's (by parameter names; defaults allowed). Raises
    `EnvLoadError` for a signature that is neither AITraining's nor ours (one episode argument)."""
    params = _parameters(cls)
    if params is None:
        return False
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if set(AITRAINING_PARAMETERS) <= keywords:
        extra = [p.name for p in params if p.name not in AITRAINING_PARAMETERS and p.default is p.empty
                 and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return True if not extra else _reject(cls, params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_args = any(p.kind == p.VAR_POSITIONAL for p in params)
    if (positional and len(required) <= 1 and all(p in positional[:1] for p in required)) or takes_args:
        return False
    return _reject(cls, params)


def _reject(cls: type, params: list[inspect.Parameter]) -> bool:
    shown = ", ".join(["self"] + [str(p) for p in params])
    raise EnvLoadError(f"{cls.__name__}.score_episode({one_line(shown, 120)}) fits neither interface; write "
                       f"{OUR_SIGNATURE} (aitrain-grpo) or {AITRAINING_SIGNATURE} (AITraining)")


# ------------------------------------------------------------------------------------------- tools


def normalise_tools(tools: Any, owner: str) -> list[dict[str, Any]]:
    """`get_tools()`'s list as chat-template tool schemas; anything unusable is an `EnvLoadError`."""
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, (list, tuple)):
        raise EnvLoadError(f"{owner}.get_tools() returned {type(tools).__name__}; return a list of function "
                           f"schemas such as {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
    schemas = []
    for i, schema in enumerate(tools):
        function = schema.get("function", schema) if isinstance(schema, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
            raise EnvLoadError(f"{owner}.get_tools() item {i} ({one_line(repr(schema), 80)}) has no function "
                               f"name; write {{'type': 'function', 'function': {{'name': 'lookup', 'description': "
                               f"..., 'parameters': {{...}}}}}}")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping):
            raise EnvLoadError(f"{owner}.get_tools() item {i} ({function['name']}): 'parameters' is a "
                               f"{type(parameters).__name__}; make it a JSON schema object")
        schemas.append({"type": "function", "function": {**function, "parameters": dict(parameters)}})
    return schemas


# ----------------------------------------------------------------------------------------- adapter


class AITrainingEnvironment(Environment):
    """An AITraining-style object as a one-turn `Environment` (see the module docstring). Build it with
    `adapt(obj)`, which names the adapter class after the user's."""

    max_turns = 1
    interface = "AITraining"
    needs_policy = True

    def __init__(self, user: Any):
        self.user = user
        self.model = None
        self.tokenizer = None
        self._lock = threading.Lock()
        self._tools = self._load_tools()

    def _load_tools(self) -> list[dict[str, Any]]:
        get_tools = getattr(self.user, "get_tools", None)
        if not callable(get_tools):
            return []
        owner = type(self.user).__name__
        try:
            tools = get_tools()
        except Exception as exc:
            raise EnvLoadError(f"{raised_message(f'{owner}.get_tools()', exc)}; fix {owner}.get_tools") from exc
        return normalise_tools(tools, owner)

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self._tools

    def use_policy(self, model, tokenizer) -> None:
        """The model and tokenizer `score_episode` receives from now on."""
        self.model, self.tokenizer = model, tokenizer

    def build_dataset(self, tokenizer) -> Any:
        rows = self.user.build_dataset(tokenizer)
        if inspect.isawaitable(rows):
            rows = asyncio.run(rows)
        return with_case_index(rows)

    def score_episode(self, episode: Episode) -> float:
        text = episode.last_completion
        completion = text if isinstance(episode.row.get("prompt"), str) else [{"role": "assistant", "content": text}]
        import torch  # here, not at import: loading an environment stays fast

        with self._lock, torch.no_grad(), _eval_mode(self.model):
            value = self.user.score_episode(model=self.model, tokenizer=self.tokenizer, completion=completion,
                                            case_idx=episode.row.get(CASE_COLUMN))
            if inspect.isawaitable(value):  # an `async def score_episode`, awaited in this worker thread
                value = asyncio.run(value)
        return value


@contextlib.contextmanager
def _eval_mode(model):
    """The model in eval mode inside, its own mode again afterwards (no model: nothing to switch)."""
    training = bool(getattr(model, "training", False))
    if training:
        model.eval()
    try:
        yield
    finally:
        if training:
            model.train()


def with_case_index(rows: Any) -> Any:
    """`rows` with a `case_idx` column of row indices where they have none; anything that is not a
    Dataset or a list of mappings passes through untouched, for env/dataset.py to report."""
    if hasattr(rows, "column_names") and hasattr(rows, "add_column"):  # a datasets.Dataset
        return rows if CASE_COLUMN in rows.column_names else rows.add_column(CASE_COLUMN, list(range(len(rows))))
    if isinstance(rows, list) and all(isinstance(row, Mapping) for row in rows):
        return [row if CASE_COLUMN in row else {**row, CASE_COLUMN: i} for i, row in enumerate(rows)]
    return rows


_ADAPTERS: dict[type, type] = {}


def adapt(user: Any) -> AITrainingEnvironment:
    """Wrap an AITraining-style instance. Tool schemas are read and checked here (`EnvLoadError`)."""
    cls = type(user)
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = type(cls.__name__, (AITrainingEnvironment,),
                              {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _ADAPTERS[cls](user)
