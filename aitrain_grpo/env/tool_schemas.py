"""The tool schemas an environment offers (`tools`), checked once when it loads.

A schema the chat template cannot render, or one without a name, used to surface late and elsewhere: a
function object in `tools` crashed `env check` after every episode had played (and trained without a
word), a schema without `function.name` was blamed on env check's own tools probe, two schemas of one
name were offered twice, and `def tools(self)` without `@property` failed as "'method' object is not
iterable". Each is now one `EnvLoadError` naming the entry and the fix.

Left out: tools that vary by row (`tools_for_row` overridden: a mixture checks each of its environments'
own), and the JSON Schema of `parameters` itself, which the chat template and the model read as given.
"""

from __future__ import annotations

from typing import Any

from aitrain_grpo.errors import EnvLoadError

EXAMPLE = '{"type": "function", "function": {"name": "add", "description": ..., "parameters": {...}}}'


def check_tool_schemas(env: Any) -> None:
    """Raise `EnvLoadError` unless `env.tools` is a list of schemas, each with its own function name."""
    from aitrain_grpo.env.base import tools_vary_by_row

    if tools_vary_by_row(env):
        return
    name = type(env).__name__
    try:
        tools = getattr(env, "tools", None)
    except Exception as exc:
        raise EnvLoadError(f"{name}.tools raised {type(exc).__name__}: {exc}") from exc
    if tools is None:
        return
    if callable(tools):
        raise EnvLoadError(f"{name}.tools is a method; make it a @property, or a list attribute of tool schemas")
    if not isinstance(tools, (list, tuple)):
        raise EnvLoadError(f"{name}.tools is a {type(tools).__name__}; it must be a list of tool schemas, e.g. "
                           f"[{EXAMPLE}] (or write the tools as @tool methods of a ToolEnvironment)")
    seen: dict[str, int] = {}
    for i, schema in enumerate(tools):
        if not isinstance(schema, dict):
            what = "a function" if callable(schema) else f"a {type(schema).__name__}"
            raise EnvLoadError(f"{name}.tools[{i}] is {what}, not a tool schema like {EXAMPLE} "
                               f"(a Python function becomes a tool as an @tool method of a ToolEnvironment)")
        function = schema.get("function", schema)
        tool = function.get("name") if isinstance(function, dict) else None
        if not isinstance(tool, str) or not tool.strip():
            raise EnvLoadError(f"{name}.tools[{i}] has no function name; give it one: {EXAMPLE}")
        if tool in seen:
            raise EnvLoadError(f"{name}.tools[{seen[tool]}] and [{i}] are both named {tool!r}; give each tool its "
                               f"own name (the model calls tools by name)")
        seen[tool] = i
