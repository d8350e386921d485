"""The environment contract: `Environment`, `ToolEnvironment`, `Episode` and the `@tool` decorator.

A user subclasses `Environment` (free-form replies) or `ToolEnvironment` (replies are the results of the
model's tool calls). The rollout engine owns the loop: it samples a model turn, stores it in
`episode.messages`, parses tool calls into `episode.tool_calls`, calls `step` for the reply, and calls
`score_episode` once the episode ends. Nothing here knows about tokens, TRL or generation backends.

Left out on purpose: tool execution sandboxes (a tool is the environment's own Python method) and any
retry policy (an exception in a tool becomes an error message to the model).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

Message = dict[str, Any]
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
ToolCall = dict[str, Any]  # {"name": str, "arguments": dict}
EnvReply = str | list[Message] | None
# Why an episode ended: the environment ended it (`step` returned None, or a single-turn episode), the
# turn cap, a model turn cut off by --rl-max-new-tokens, the completion token budget, or an error.
STOP_REASONS = ("env", "max_turns", "turn_tokens", "completion_budget", "error")


@dataclass
class Episode:
    """One conversation between the model and an environment, from prompt to score.

    `messages` is the conversation exactly as the model saw it: the prompt messages, then each
    assistant turn's raw text (tool calls included, as written) and each environment reply.
    """

    row: dict[str, Any]
    messages: list[Message]
    state: dict[str, Any] = field(default_factory=dict)
    turns: int = 0
    done: bool = False
    truncated: bool = False
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    tool_calls: list[ToolCall] = field(default_factory=list)
    # Problems found while parsing the last turn's tool calls (bad JSON, missing name, ...).
    tool_call_errors: list[str] = field(default_factory=list)
    score: float | None = None
    # The turn cap in force for this episode (the environment's, or lower if the run config says so).
    max_turns: int | None = None
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    # Why the episode ended, set by the engine: one of STOP_REASONS (None while it runs).
    stop_reason: str | None = None
    # Model turns cut off by the per-turn token limit that the episode went on after (--rl-cut-turn continue).
    truncated_turns: int = 0

    @property
    def last_completion(self) -> str:
        """The text of the model's latest turn ('' before the first one)."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return str(message.get("content") or "")
        return ""


class Environment:
    """Base class for a training environment. Subclass it and implement the methods below.

    Required: `build_dataset(tokenizer)` and `score_episode(episode)`.
    Optional: `reset(episode)`, `step(episode, completion)` (without it an episode is one model turn),
    `solve(episode)` (an expert's next message, used by checks), and `tools` (JSON schemas rendered into
    the prompt). `reset`, `step` and `score_episode` may be `async def`.
    """

    #: Upper bound on model turns per episode; the run config may lower it.
    max_turns: int = 10

    def build_dataset(self, tokenizer) -> Any:
        """Return a `datasets.Dataset` or a list of dicts, each with a `prompt` (a string or a list of
        `{"role", "content"}` messages) and any other columns; they reach `episode.row`."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_dataset(self, tokenizer)")

    def reset(self, episode: Episode) -> None:
        """Per-episode setup, e.g. filling `episode.state`. Called before the first model turn."""
        return None

    def step(self, episode: Episode, completion: str) -> EnvReply:
        """Answer the model's latest turn: a string (one user message), a list of messages
        (`user`/`tool`), or None to end the episode. The default ends after one turn."""
        return None

    def score_episode(self, episode: Episode) -> float:
        """Score the finished episode from 0.0 to 1.0."""
        raise NotImplementedError(f"{type(self).__name__} must implement score_episode(self, episode)")

    @property
    def tools(self) -> list[dict[str, Any]]:
        """JSON schemas of the tools offered to the model (rendered through the chat template)."""
        return []

    @property
    def is_multi_turn(self) -> bool:
        return type(self).step is not Environment.step


# --------------------------------------------------------------------------------------------- tools

_TOOL_MARK = "__aitrain_tool__"


def tool(func: Callable | None = None, *, name: str | None = None, description: str | None = None):
    """Mark a method of a `ToolEnvironment` as a tool the model may call.

    The JSON schema comes from the signature's type hints and the docstring (first paragraph is the
    description; an `Args:` section describes parameters). The method receives `episode` as a keyword
    argument if it declares one; that parameter is not shown to the model.
    """

    def mark(f: Callable) -> Callable:
        setattr(f, _TOOL_MARK, {"name": name or f.__name__, "description": description})
        return f

    return mark(func) if func is not None else mark


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def _json_type(annotation: Any) -> dict[str, Any]:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(options) == 1:
            return _json_type(options[0])
        return {"anyOf": [_json_type(a) for a in options]}
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        schema = _json_type(type(values[0]))
        schema["enum"] = values
        return schema
    if origin in (list, tuple, set):
        args = typing.get_args(annotation)
        schema: dict[str, Any] = {"type": "array"}
        if args:
            schema["items"] = _json_type(args[0])
        return schema
    if origin is dict:
        return {"type": "object"}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    return {}


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {param: description})."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    parts = re.split(r"^(?:Args|Arguments|Parameters):\s*$", doc, maxsplit=1, flags=re.M)
    head, rest = parts[0], (parts[1] if len(parts) > 1 else "")
    description = " ".join(head.strip().split("\n\n")[0].split())
    params: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        if re.match(r"^\S", line) and line.rstrip().endswith(":"):
            break  # next section (Returns:, Raises:)
        m = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if m:
            current = m.group(1)
            params[current] = m.group(2).strip()
        elif current and line.strip():
            params[current] += " " + line.strip()
    return description, params


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the engine sees it: its schema, and the bound method that runs it."""

    name: str
    schema: dict[str, Any]
    function: Callable
    wants_episode: bool

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"]["parameters"]


def tool_spec(method: Callable) -> ToolSpec:
    """Build a `ToolSpec` (OpenAI-style function schema) from a `@tool` method."""
    meta = getattr(method, _TOOL_MARK, {}) or {}
    signature = inspect.signature(method)
    try:
        hints = typing.get_type_hints(method)
    except Exception:  # unresolved forward references: fall back to raw annotations
        hints = {}
    description, param_docs = _docstring_parts(inspect.getdoc(method))
    properties: dict[str, Any] = {}
    required: list[str] = []
    wants_episode = False
    for pname, param in signature.parameters.items():
        if pname == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if pname == "episode":
            wants_episode = True
            continue
        prop = _json_type(hints.get(pname, param.annotation))
        if pname in param_docs:
            prop["description"] = param_docs[pname]
        properties[pname] = prop
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    name = meta.get("name") or method.__name__
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": meta.get("description") or description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }
    return ToolSpec(name=name, schema=schema, function=method, wants_episode=wants_episode)


def _matches(value: Any, schema: dict[str, Any]) -> bool:
    if "anyOf" in schema:
        return any(_matches(value, s) for s in schema["anyOf"])
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind is None:
        return True
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list) and all(_matches(v, schema.get("items", {})) for v in value)
    checks = {"string": str, "boolean": bool, "object": dict}
    return isinstance(value, checks.get(kind, object))


def validate_arguments(spec: ToolSpec, arguments: Any) -> str | None:
    """Check a model's arguments against the tool schema; return a message for the model, or None."""
    if not isinstance(arguments, dict):
        return f"arguments for {spec.name} must be a JSON object, got {type(arguments).__name__}"
    params = spec.parameters
    missing = [p for p in params["required"] if p not in arguments]
    if missing:
        return f"{spec.name} is missing required argument(s): {', '.join(missing)}"
    unknown = [a for a in arguments if a not in params["properties"]]
    if unknown:
        accepted = ", ".join(params["properties"]) or "none"
        return f"{spec.name} got unknown argument(s): {', '.join(unknown)} (accepted: {accepted})"
    for pname, value in arguments.items():
        prop = params["properties"][pname]
        if not _matches(value, prop):
            expected = prop.get("type") or prop.get("enum") or "another type"
            return f"argument {pname!r} of {spec.name} must be {expected}, got {json.dumps(value)[:80]}"
    return None


class ToolEnvironment(Environment):
    """An environment whose replies are the results of the model's tool calls.

    Methods decorated with `@tool` are offered to the model. The default `step` runs every tool call of
    the model's last turn and returns one `tool` message per call; a turn without a tool call ends the
    episode. Unknown tools, bad JSON, wrong arguments and tools that raise become error messages to the
    model (counted in `env/tool_errors`), never crashes.
    """

    max_turns = 10

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Definition order (base classes first), so the prompt lists tools as the author wrote them.
        names: dict[str, None] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                if callable(value) and hasattr(value, _TOOL_MARK):
                    names[attr] = None
        cls._tool_names = list(names)

    @property
    def tool_specs(self) -> dict[str, ToolSpec]:
        cached = self.__dict__.get("_tool_specs_cache")
        if cached is None:
            cached = {}
            for attr in getattr(type(self), "_tool_names", []):
                spec = tool_spec(getattr(self, attr))
                cached[spec.name] = spec
            self.__dict__["_tool_specs_cache"] = cached
        return cached

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [spec.schema for spec in self.tool_specs.values()]

    def no_tool_call(self, episode: Episode, completion: str) -> EnvReply:
        """Reply to a turn without tool calls. The default ends the episode; override it to answer
        (for example a simulated user replying to a question)."""
        return None

    async def step(self, episode: Episode, completion: str) -> EnvReply:
        if not episode.tool_calls and not episode.tool_call_errors:
            reply = self.no_tool_call(episode, completion)
            return await reply if inspect.isawaitable(reply) else reply
        replies: list[Message] = []
        for problem in episode.tool_call_errors:
            episode.num_tool_errors += 1
            replies.append({"role": "tool", "name": "error", "content": f"Error: {problem}"})
        # One call after another, in the order the model wrote them: tools often change state
        # (a booking), and the model reads the results in that order. Episodes still run concurrently.
        for call in episode.tool_calls:
            replies.append(await self.run_tool_call(episode, call))
        return replies

    async def run_tool_call(self, episode: Episode, call: ToolCall) -> Message:
        """Run one parsed tool call and turn its result (or failure) into a `tool` message."""
        name = call.get("name")
        spec = self.tool_specs.get(name) if isinstance(name, str) else None
        if spec is None:
            episode.num_tool_errors += 1
            known = ", ".join(self.tool_specs) or "none"
            return {"role": "tool", "name": str(name), "content": f"Error: unknown tool {name!r}; tools: {known}"}
        problem = validate_arguments(spec, call.get("arguments"))
        if problem:
            episode.num_tool_errors += 1
            return {"role": "tool", "name": spec.name, "content": f"Error: {problem}"}
        kwargs = dict(call["arguments"])
        if spec.wants_episode:
            kwargs["episode"] = episode
        try:
            if inspect.iscoroutinefunction(spec.function):
                result = await spec.function(**kwargs)
            else:  # in a worker thread, so a slow tool does not hold up the other episodes
                result = await asyncio.to_thread(spec.function, **kwargs)
        except Exception as exc:  # a tool's failure is information for the model, not a crash
            episode.num_tool_errors += 1
            return {"role": "tool", "name": spec.name, "content": f"Error: {type(exc).__name__}: {exc}"}
        content = result if isinstance(result, str) else json.dumps(result, default=str)
        return {"role": "tool", "name": spec.name, "content": content}
