"""Environments with an author's mistake or surprise in them: tools that are not schemas, a duck-typed class
without the optional methods, a reset that moves the turn cap or changes its row, rows Arrow converts,
metrics named like the engine's."""

import numpy

from aitrain_grpo import Environment, ToolEnvironment, tool

SCHEMA = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                           "parameters": {"type": "object", "properties": {}}}}


def add(a, b):
    return a + b


class Base(Environment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "Say 1.", "tags": ["a"]}, {"prompt": "Say 2.", "tags": ["b"]}]

    def score_episode(self, episode):
        return 0.5


class FunctionTools(Base):
    tools = [add]


class OneSchemaTools(Base):
    tools = SCHEMA


class MethodTools(Base):
    def tools(self):
        return [SCHEMA]


class NamelessTools(Base):
    tools = [{"type": "function", "function": {"description": "no name", "parameters": {}}}]


class TwiceNamedTools(Base):
    tools = [SCHEMA, SCHEMA]


class TwoToolsOneName(ToolEnvironment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "Add 1 and 2."}]

    def score_episode(self, episode):
        return 0.0

    @tool(name="add")
    def add_ints(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool(name="add")
    def add_floats(self, a: float, b: float) -> float:
        """Add two floats."""
        return a + b


class UnmarkedTools(ToolEnvironment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "Add 1 and 2."}] * 2

    def score_episode(self, episode):
        return 1.0 if "3" in episode.last_completion else 0.0

    def add(self, a: int, b: int) -> int:  # no @tool: the model is offered nothing
        """Add two integers."""
        return a + b


class DuckNoExtras:
    """Our two methods, not our base class, and none of the optional ones (tools, reset, step)."""

    def build_dataset(self, tokenizer):
        return [{"prompt": "Say 1."}] * 4

    def score_episode(self, episode):
        return 1.0 if episode.last_completion.strip() else 0.0


class RaisesTurnCap(Base):
    """reset asks for more turns than the run allows; step always answers."""

    max_turns = 3

    def reset(self, episode):
        episode.max_turns = 40

    def step(self, episode, completion):
        return "more"


class TextTurnCap(RaisesTurnCap):
    def reset(self, episode):
        episode.max_turns = "2"


class RowChanger(Base):
    """reset edits its row: a later episode of the same row must not see the edit."""

    def reset(self, episode):
        episode.row["tags"].append("seen")
        episode.state["tags"] = list(episode.row["tags"])


class ArrowTypedRows(Base):
    """A set and an int beside a float: training's rows hold a list and floats, and so must env check's."""

    def build_dataset(self, tokenizer):
        return [{"prompt": "Say 1.", "tags": {"x"}, "n": 1}, {"prompt": "Say 2.", "tags": {"y"}, "n": 2.5}]

    def score_episode(self, episode):
        assert isinstance(episode.row["tags"], list) and isinstance(episode.row["n"], float), episode.row
        return 0.5


class EngineNamedMetrics(Base):
    """Metrics named like the engine's own; every step raises, so every episode is an error."""

    def step(self, episode, completion):
        episode.metrics["errors"] = 0
        episode.metrics["score_mean"] = 0.9
        episode.metrics["guesses"] = numpy.int64(2)  # numpy's numbers and flags are numbers too
        episode.metrics["solved"] = episode.row["prompt"] == "Say 1."
        raise RuntimeError("broken tool backend")


class NoneSolve(Base):
    def solve(self, episode):
        return None  # forgot the return


class AsyncSolve(Base):
    async def solve(self, episode):
        return "1"
