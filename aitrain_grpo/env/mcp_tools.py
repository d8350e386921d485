"""Tools from an MCP server: a `ToolEnvironment` offers them as if they were its own `@tool` methods.

    class CalculatorEnv(ToolEnvironment):
        def __init__(self):
            self.mcp_servers = [MCPTools(command=[sys.executable, "my_server.py"])]   # or url="http://.../mcp"

`MCPTools` connects with the `mcp` package's client (mcp 2.x: `mcp.Client`, over stdio for a command,
Streamable HTTP for a URL) on first use, lists the server's tools and turns each into a `ToolSpec`: the
schema is the server's (`inputSchema` as the function's parameters, checked against the model's
arguments like any tool's), and calling it sends `tools/call` to the server. The result's text blocks
(or its structured content, as JSON) are the tool message; a result the server marks as an error, or
a call that fails or times out, becomes an `Error: ...` tool message, counted as a tool error. (mcp 2's
`MCPServer` sends the text of a `ToolError` the tool raises; any other exception reaches the model only as
"Error executing tool NAME", with the traceback in the server's stderr, which is this process's.)

The client lives on its own thread with its own event loop, for the life of the environment: episodes
call tools from the engine's worker threads, and env check, eval and training each run their own event
loops, which the client's streams must not be tied to. The server process (stdio) starts once per
environment instance and ends with it (`close`, or at interpreter exit).

Left out: MCP resources, prompts, sampling and elicitation (tools only); servers that need auth.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import threading
from typing import Any

from aitrain_grpo.errors import EnvLoadError

INSTALL = "pip install 'aitrain-grpo[mcp]'"


class MCPToolError(RuntimeError):
    """The MCP server answered a tool call with an error; its text is what the model reads."""


class MCPTools:
    """One MCP server's tools (see the module docstring). `include` keeps only the named tools."""

    def __init__(self, command: list[str] | None = None, url: str | None = None, *, env: dict[str, str] | None = None,
                 include: list[str] | None = None, timeout: float = 30.0):
        if bool(command) == bool(url):
            raise EnvLoadError("MCPTools takes a server command (command=[...]) or a URL (url=...), exactly one")
        if command is not None and (isinstance(command, str) or not all(isinstance(c, str) for c in command)):
            raise EnvLoadError(f"MCPTools command must be a list of strings, e.g. [sys.executable, 'server.py'], "
                               f"not {command!r}")
        self.command, self.url, self.env, self.include, self.timeout = command, url, env, include, timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client = None
        self._closing: asyncio.Event | None = None
        self._owner: Any = None
        self._schemas: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return " ".join(self.command) if self.command else str(self.url)

    # ------------------------------------------------------------------------------- connection

    def _target(self):
        try:
            import mcp
        except ImportError:
            raise EnvLoadError(f"MCP tools need the mcp package (2.x); install it with {INSTALL}") from None
        if not hasattr(mcp, "Client"):
            raise EnvLoadError(f"MCP tools need mcp 2.x (mcp.Client); this is mcp {getattr(mcp, '__version__', '1.x')}: "
                               f"{INSTALL}")
        if self.url:
            return mcp, self.url
        return mcp, mcp.StdioServerParameters(command=self.command[0], args=list(self.command[1:]), env=self.env)

    async def _hold(self, ready: asyncio.Future) -> None:
        """Open the client, hand back its tools, and keep it open in this one task until `close`
        (the client's task groups must be entered and left by the same task)."""
        try:
            mcp, target = self._target()
            async with mcp.Client(target, read_timeout_seconds=self.timeout) as client:
                listed = await client.list_tools()
                self._client = client
                ready.set_result(listed.tools)
                await self._closing.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller waiting on `ready`
            if not ready.done():
                ready.set_exception(exc)
            elif not isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
                raise
        finally:
            self._client = None

    def _connect(self) -> list[Any]:
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="aitrain-mcp", daemon=True).start()

        async def start() -> Any:
            self._closing = asyncio.Event()
            ready = self._loop.create_future()
            self._owner = asyncio.ensure_future(self._hold(ready))
            return await asyncio.wait_for(ready, self.timeout)

        try:
            tools = asyncio.run_coroutine_threadsafe(start(), self._loop).result(self.timeout + 5)
        except EnvLoadError:
            self.close()
            raise
        except BaseException as exc:
            self.close()
            detail = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
            raise EnvLoadError(f"could not list the tools of MCP server {self.where!r} ({detail}); check that the "
                               f"command runs (or the URL answers) and speaks MCP") from None
        atexit.register(self.close)
        return tools

    def close(self) -> None:
        """End the session (and a stdio server's process); the tools may be listed again afterwards."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._closing is not None and self._owner is not None:
            async def finish() -> None:
                self._closing.set()
                await asyncio.wait([self._owner], timeout=5)

            try:
                asyncio.run_coroutine_threadsafe(finish(), loop).result(10)
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        loop.call_soon_threadsafe(loop.stop)
        self._schemas = None

    # ------------------------------------------------------------------------------- tools

    def schemas(self) -> list[dict[str, Any]]:
        """The server's tools as function schemas (connecting on first use)."""
        with self._lock:
            if self._schemas is None:
                tools = self._connect()
                kept = [t for t in tools if self.include is None or t.name in self.include]
                missing = sorted(set(self.include or ()) - {t.name for t in tools})
                if missing:
                    raise EnvLoadError(f"MCP server {self.where!r} has no tool(s) {', '.join(missing)}; it has "
                                       f"{', '.join(t.name for t in tools) or 'none'}")
                self._schemas = [function_schema(t.name, t.description, getattr(t, "input_schema", None) or getattr(t, "inputSchema", None))
                                 for t in kept]
            return self._schemas

    def call(self, name: str, **arguments: Any) -> str:
        """Run tool `name` on the server and return its text; raises `MCPToolError` for an error result."""
        if self._loop is None or self._client is None:
            raise MCPToolError(f"the MCP server {self.where!r} is not connected")
        future = asyncio.run_coroutine_threadsafe(self._client.call_tool(name, arguments), self._loop)
        try:
            result = future.result(self.timeout + 5)
        except TimeoutError:
            future.cancel()
            raise MCPToolError(f"{name} did not answer within {self.timeout:g}s") from None
        text = result_text(result)
        if getattr(result, "is_error", False) or getattr(result, "isError", False):
            raise MCPToolError(text or f"{name} failed")
        return text

    def tool_functions(self) -> dict[str, Any]:
        """name -> a callable taking the tool's arguments as keywords."""
        return {schema["function"]["name"]: functools.partial(self.call, schema["function"]["name"])
                for schema in self.schemas()}


def function_schema(name: str, description: str | None, input_schema: dict[str, Any] | None) -> dict[str, Any]:
    """An MCP tool as the function schema chat templates take; the parameters always name their
    `properties` and `required` (argument checks read both)."""
    parameters = dict(input_schema or {})
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    parameters.setdefault("required", [])
    return {"type": "function", "function": {"name": name, "description": description or name, "parameters": parameters}}


def result_text(result: Any) -> str:
    """A tool result's text blocks joined, else its structured content as JSON."""
    texts = [block.text for block in getattr(result, "content", None) or [] if getattr(block, "text", None) is not None]
    if texts:
        return "\n".join(texts)
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    return json.dumps(structured) if structured is not None else ""
