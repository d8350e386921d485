"""Tools: the `@tool` decorator, tool JSON schemas, argument checks, and `ToolEnvironment`.

A `@tool` method's schema is what `transformers.utils.get_json_schema` makes of its type hints and
Google-style docstring (the same schema chat templates and TRL render), with what is ours on top: a
parameter named `episode` is passed by the engine and hidden from the model, `@tool(name=...,
description=...)` overrides, and a definition the schema cannot be made from is an `EnvLoadError`
naming the method and the fix. A model's arguments are checked against the schema with `jsonschema`
before the method runs; what fails becomes an `Error: ...` message to the model.

Left out: tool execution sandboxes (a tool is the environment's own Python method), retries (a tool
that raises is reported to the model once), and running one turn's calls in parallel (they often change
state, e.g. a booking, so they run in the order the model wrote them).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import typing
from dataclasses import dataclass
from typing import Any, Callable

from jsonschema import Draft202012Validator, validators

from aitrain_grpo.env.base import Environment, EnvReply, Episode, Message, ToolCall
from aitrain_grpo.errors import EnvLoadError

_TOOL_MARK = "__aitrain_tool__"
EPISODE_PARAMETER = "episode"  # passed by the engine, never shown to the model


def tool(func: Callable | None = None, *, name: str | None = None, description: str | None = None):
    """Mark a method of a `ToolEnvironment` as a tool the model may call.

    The JSON schema comes from the signature's type hints and the docstring: the text before `Args:`
    is the description, and `Args:` has one `name: description` line per parameter. The method receives
    `episode` as a keyword argument if it declares one; that parameter is not shown to the model.
    """

    def mark(f: Callable) -> Callable:
        setattr(f, _TOOL_MARK, {"name": name or f.__name__, "description": description})
        return f

    return mark(func) if func is not None else mark


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


def _visible_signature(method: Callable) -> tuple[inspect.Signature, bool]:
    """The signature the model sees (no `episode`, no *args/**kwargs), and whether `episode` was there."""
    signature = inspect.signature(method)
    kept, wants_episode = [], False
    for param in signature.parameters.values():
        if param.name == EPISODE_PARAMETER:
            wants_episode = True
        elif param.name != "self" and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            kept.append(param)
    return signature.replace(parameters=kept, return_annotation=inspect.Signature.empty), wants_episode


# get_json_schema insists on a docstring and on a description for every parameter; a tool without them
# worked before it was used here and still does: the gaps are filled with this mark, removed afterwards.
_NO_DESCRIPTION = "aitrain-no-description"


def _complete_docstring(doc: str, parameters: list[str]) -> str:
    """`doc` with a description and an `Args:` line for every parameter that lacks one."""
    from transformers.utils.chat_template_utils import parse_google_format_docstring

    description, documented, _ = parse_google_format_docstring(doc) if doc.strip() else (None, {}, None)
    documented = documented or {}
    lines = [description or _NO_DESCRIPTION, "", "Args:"]
    lines += [f"    {name}: {documented.get(name) or _NO_DESCRIPTION}" for name in parameters]
    return "\n".join(lines)


def _without_placeholders(schema: dict[str, Any]) -> dict[str, Any]:
    function = schema["function"]
    if function.get("description") == _NO_DESCRIPTION:
        function["description"] = ""
    for prop in function["parameters"].get("properties", {}).values():
        if prop.get("description") == _NO_DESCRIPTION:
            del prop["description"]
    return schema


def tool_spec(method: Callable) -> ToolSpec:
    """Build a `ToolSpec` (OpenAI-style function schema) from a `@tool` method."""
    # transformers.utils pulls in torch (about 2 s); imported here so that `import aitrain_grpo` and
    # the CLI's error paths stay fast.
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    meta = getattr(method, _TOOL_MARK, {}) or {}
    where = f"tool {getattr(method, '__qualname__', method.__name__)}"
    try:
        hints = typing.get_type_hints(method)
    except Exception as exc:  # a hint naming something the module cannot resolve
        raise EnvLoadError(f"{where}: its type hints do not resolve ({type(exc).__name__}: {exc}); import the "
                           f"types it names at module level") from None
    signature, wants_episode = _visible_signature(method)
    # get_json_schema reads the signature, hints and docstring of what it is given: a stand-in that
    # shows only the model's parameters. A parameter without a hint takes any JSON value, as before.
    def stand_in(): ...

    stand_in.__name__ = meta.get("name") or method.__name__
    stand_in.__doc__ = _complete_docstring(inspect.getdoc(method) or meta.get("description") or "",
                                           [p.name for p in signature.parameters.values()])
    stand_in.__annotations__ = {p.name: hints.get(p.name, Any) for p in signature.parameters.values()}
    stand_in.__signature__ = signature.replace(
        parameters=[p.replace(annotation=stand_in.__annotations__[p.name]) for p in signature.parameters.values()])
    try:
        schema = _without_placeholders(get_json_schema(stand_in))
    except DocstringParsingException as exc:
        raise EnvLoadError(f"{where}: {exc}; write its docstring in Google style (a description, then an "
                           f"`Args:` section with a `name: description` line per parameter)") from None
    except TypeHintParsingException as exc:
        raise EnvLoadError(f"{where}: a type hint has no JSON schema ({' '.join(map(str, exc.args))}); use str, "
                           f"int, float, bool, list[...], dict[str, ...], Literal[...] or a union of them") from None
    function = schema["function"]
    if meta.get("description"):
        function["description"] = meta["description"]
    function["parameters"].setdefault("required", [])  # always present, as chat templates expect
    return ToolSpec(name=stand_in.__name__, schema=schema, function=method, wants_episode=wants_episode)


def _is_integer(checker, value: Any) -> bool:
    # JSON Schema counts 2.0 as an integer; a tool hinted `int` should get a Python int.
    return isinstance(value, int) and not isinstance(value, bool)


_ArgumentValidator = validators.extend(
    Draft202012Validator, type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer))


def _accepting_null(schema: Any) -> Any:
    """The schema with transformers' `nullable` (an Optional hint) turned into JSON Schema's null type."""
    if isinstance(schema, list):
        return [_accepting_null(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _accepting_null(v) for k, v in schema.items() if k != "nullable"}
    if schema.get("nullable"):
        if "anyOf" in out:
            out["anyOf"] = [*out["anyOf"], {"type": "null"}]
        elif "type" in out:
            kinds = out["type"] if isinstance(out["type"], list) else [out["type"]]
            out["type"] = [*kinds, "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def _expected(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    kinds = schema.get("type") or [s.get("type") for s in schema.get("anyOf", []) if s.get("type")]
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return " or ".join(str(k) for k in kinds) or "another type"


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
        error = next(_ArgumentValidator(_accepting_null(prop)).iter_errors(value), None)
        if error is not None:
            shown = json.dumps(value, default=str)[:80]
            if error.absolute_path:  # a wrong item inside a list or object
                inner = "".join(f"[{json.dumps(p)}]" for p in error.absolute_path)
                return f"argument {pname!r} of {spec.name}: {pname}{inner} must be {_expected(error.schema)}, got {shown}"
            return f"argument {pname!r} of {spec.name} must be {_expected(_accepting_null(prop))}, got {shown}"
    return None


def refused_call(specs: dict[str, Any], episode: Episode, call: ToolCall) -> Message | None:
    """The `Error: ...` tool message for a call of a tool not in `specs` or with arguments its schema
    refuses, counted in `episode.num_tool_errors` (`EpisodeLog.tool_failed`); None when the call may run."""
    name = call.get("name")
    spec = specs.get(name) if isinstance(name, str) else None
    if spec is None:
        episode.log.tool_failed()
        known = ", ".join(specs) or "none"
        return {"role": "tool", "name": str(name), "content": f"Error: unknown tool {name!r}; tools: {known}"}
    problem = validate_arguments(spec, call.get("arguments"))
    if problem:
        episode.log.tool_failed()
        return {"role": "tool", "name": name, "content": f"Error: {problem}"}
    return None


class ToolEnvironment(Environment):
    """An environment whose replies are the results of the model's tool calls.

    Methods decorated with `@tool` are offered to the model. The default `step` runs the tool calls of
    the model's last turn one after another, in the order written, and returns one `tool` message per
    call; a turn without a tool call ends the episode. Unknown tools, bad JSON, wrong arguments and
    tools that raise become error messages to the model (counted in `env/tool_errors`), never crashes.
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

    #: MCP servers whose tools are offered beside the `@tool` methods (env/mcp_tools.py: `MCPTools`).
    mcp_servers: tuple = ()

    @property
    def tool_specs(self) -> dict[str, ToolSpec]:
        cached = self.__dict__.get("_tool_specs_cache")
        if cached is None:
            cached = {}
            for attr in getattr(type(self), "_tool_names", []):
                spec = tool_spec(getattr(self, attr))
                if spec.name in cached:  # a second @tool(name=...) hid the first
                    raise EnvLoadError(f"{type(self).__name__} has two tools named {spec.name!r} ({cached[spec.name].function.__name__} "
                                       f"and {attr}); give each @tool its own name")
                cached[spec.name] = spec
            for server in self.mcp_servers or ():
                for schema in server.schemas():
                    name = schema["function"]["name"]
                    if name in cached:
                        raise EnvLoadError(f"{type(self).__name__} has two tools named {name!r} (a method and one of "
                                           f"MCP server {server.where!r}); rename the method or pass include=[...]")
                    cached[name] = ToolSpec(name, schema, functools.partial(server.call, name), wants_episode=False)
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
            episode.log.tool_failed()
            replies.append({"role": "tool", "name": "error", "content": f"Error: {problem}"})
        # One call after another, in the order the model wrote them: tools often change state
        # (a booking), and the model reads the results in that order. Episodes still run concurrently.
        for call in episode.tool_calls:
            replies.append(await self.run_tool_call(episode, call))
        return replies

    async def run_tool_call(self, episode: Episode, call: ToolCall) -> Message:
        """Run one parsed tool call and turn its result (or failure) into a `tool` message."""
        refused = refused_call(self.tool_specs, episode, call)
        if refused is not None:
            return refused
        spec = self.tool_specs[call["name"]]
        kwargs = dict(call["arguments"])
        if spec.wants_episode:
            kwargs[EPISODE_PARAMETER] = episode
        try:
            if inspect.iscoroutinefunction(spec.function):
                result = await spec.function(**kwargs)
            else:  # in a worker thread, so a slow tool does not hold up the other episodes
                result = await asyncio.to_thread(spec.function, **kwargs)
        except Exception as exc:  # a tool's failure is information for the model, not a crash
            episode.log.tool_failed()
            return {"role": "tool", "name": spec.name, "content": f"Error: {type(exc).__name__}: {exc}"}
        content = result if isinstance(result, str) else json.dumps(result, default=str)
        return {"role": "tool", "name": spec.name, "content": content}
