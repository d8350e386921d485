"""A `ToolEnvironment` whose tools come from an MCP server, and the server itself, in one file.

    python examples/mcp_calculator.py              # the MCP server over stdio (the environment starts it)
    aitrain env check --rl-env examples.mcp_calculator:CalculatorEnv
    aitrain grpo --rl-env examples.mcp_calculator:CalculatorEnv --max-steps 20

The task: compute a * b + c with the server's `multiply` and `add` tools, then state the number. The
environment declares no `@tool` method: `mcp_servers` makes the server's tools its tools (schemas from the
server, calls sent to it, its errors shown to the model as `Error: ...`). Needs `pip install
'aitrain-grpo[mcp]'` (mcp 2.x).
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

from aitrain_grpo import Episode, MCPTools, ToolEnvironment


def serve() -> None:
    """The MCP server: two integer tools, over stdio."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("calculator")

    @server.tool()
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    server.run()


def _call(name: str, a: int, b: int) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": {"a": a, "b": b}})}\n</tool_call>'


class CalculatorEnv(ToolEnvironment):
    """a * b + c with an MCP server's calculator: the right number scores 1."""

    max_turns = 4

    def __init__(self, tasks: int = 32, seed: int = 0):
        self.mcp_servers = [MCPTools(command=[sys.executable, str(Path(__file__).resolve())])]
        rng = random.Random(seed)
        self.tasks = [(rng.randint(12, 99), rng.randint(12, 99), rng.randint(1, 99)) for _ in range(tasks)]

    def build_dataset(self, tokenizer) -> list[dict]:
        return [{"prompt": [{"role": "user", "content": f"What is {a} * {b} + {c}? Use the calculator tools, then "
                                                        f"answer with the number."}], "a": a, "b": b, "c": c}
                for a, b, c in self.tasks]

    def solve(self, episode: Episode) -> str:
        """The expert: multiply, add the third number to the product, say the result."""
        row = episode.row
        results = [m["content"] for m in episode.messages if m["role"] == "tool"]
        if not results:
            return _call("multiply", row["a"], row["b"])
        if len(results) == 1:
            return _call("add", int(results[0]), row["c"])
        return f"The answer is {results[-1]}."

    def score_episode(self, episode: Episode) -> float:
        row = episode.row
        wanted = str(row["a"] * row["b"] + row["c"])
        answer = episode.last_completion if not episode.tool_calls else ""
        episode.metrics["used_tools"] = float(episode.num_tool_calls > 0)
        return 1.0 if re.search(rf"(?<!\d){wanted}(?!\d)", answer) else 0.0


if __name__ == "__main__":
    serve()
