"""Tools from MCP servers (env/mcp_tools.py): real servers over stdio, started from Python files; their
tools are offered, checked and called like `@tool` methods, and their errors reach the model."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from aitrain_grpo import ToolEnvironment
from aitrain_grpo.engine.runner import oracle_policy, play
from aitrain_grpo.env.mcp_tools import MCPTools
from aitrain_grpo.errors import EnvLoadError
from examples.mcp_calculator import CalculatorEnv
from helpers import require, run_cli

require("mcp.server.mcpserver", "pip install 'aitrain-grpo[mcp]'")

FAILING_SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("lookup")

    @server.tool()
    def lookup(city: str) -> str:
        """Look a city up."""
        if city != "Lisbon":
            raise ToolError(f"no station in {city}")
        return "LIS-101"

    server.run()
''')


class LookupEnv(ToolEnvironment):
    max_turns = 4

    def __init__(self, server_file: str):
        self.mcp_servers = [MCPTools(command=[sys.executable, server_file], timeout=20)]

    def build_dataset(self, tokenizer):
        return [{"prompt": "Find the station."}]

    def score_episode(self, episode):
        return 1.0 if any(m["content"] == "LIS-101" for m in episode.messages if m["role"] == "tool") else 0.0


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_the_oracle_solves_the_calculator_through_the_mcp_server():
    env = CalculatorEnv(tasks=3)
    try:
        assert [t["function"]["name"] for t in env.tools] == ["multiply", "add"]  # the server's schemas
        episodes = play(env, env.build_dataset(None), oracle_policy(env))
    finally:
        env.mcp_servers[0].close()
    for episode, (a, b, c) in zip(episodes, env.tasks):
        results = [m["content"] for m in episode.messages if m["role"] == "tool"]
        assert results == [str(a * b), str(a * b + c)]  # computed by the server process
        assert episode.score == 1.0 and episode.num_tool_errors == 0


def test_server_errors_and_bad_arguments_are_error_messages_to_the_model(tmp_path):
    server = tmp_path / "lookup_server.py"
    server.write_text(FAILING_SERVER)
    env = LookupEnv(str(server))
    turns = iter([call("lookup", city="Porto"), call("lookup", town="Lisbon"), call("lookup", city="Lisbon"), "LIS-101"])
    try:
        (episode,) = play(env, env.build_dataset(None), lambda ep: next(turns))
    finally:
        env.mcp_servers[0].close()
    replies = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert replies[0].startswith("Error:") and "no station in Porto" in replies[0]  # raised in the server
    assert replies[1] == "Error: lookup is missing required argument(s): city"  # refused by its schema, here
    assert replies[2] == "LIS-101" and episode.score == 1.0
    assert episode.num_tool_errors == 2


def test_a_server_that_does_not_start_is_a_one_line_error():
    tools = MCPTools(command=[sys.executable, "-c", "import sys; sys.exit(3)"], timeout=10)
    with pytest.raises(EnvLoadError, match="could not list the tools of MCP server") as caught:
        tools.schemas()
    assert "\n" not in str(caught.value)
    with pytest.raises(EnvLoadError, match="exactly one"):
        MCPTools()


@pytest.mark.integration
def test_grpo_trains_the_mcp_example(tiny_model_dir, tmp_path):
    result = run_cli("grpo", "--model", tiny_model_dir, "--rl-env", "examples.mcp_calculator:CalculatorEnv",
                     "--rl-env-config", '{"tasks": 8}', "--max-steps", "2", "--batch-size", "4",
                     "--rl-max-new-tokens", "8", "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "env/score_mean" in r] == [1, 2]
