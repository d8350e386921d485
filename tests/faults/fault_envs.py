"""Environments that fail on purpose, for the fault-injection suite and the resume/signal tests.

`FaultyEnv`: each task row names the fault its episodes meet (`FAULTS`), so one run exercises many
faults side by side. `BadToolCallsEnv`: the model's tool calls break in every way we know; the tiny
model never writes tool calls, so `step` hands the real parser scripted model text in their place.
`SlowLetters`: envs.letters with a slow `score_episode`, so a test can act between steps.
`SecretLetters`: envs.letters that takes credentials, to check they are not written anywhere.

Loaded by module path (`--rl-env-module fault_envs`) with `tests/faults` as the working directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from aitrain_grpo import Environment, Episode, ToolEnvironment, tool
from aitrain_grpo.engine.tool_parsers import parse_tool_calls
from envs.letters import LetterEnv

FAULTS = (
    "ok", "reset_raises", "step_raises", "step_hangs", "step_bad_reply", "score_raises", "score_hangs",
    "score_nan", "score_inf", "score_above_one", "score_not_number",
)


class FaultyEnv(Environment):
    """Two-turn episodes; row `fault` decides what goes wrong. `step` is sync and `score_episode`
    async, so a hang is tested on both kinds of call."""

    max_turns = 2

    def __init__(self, faults: list[str] = FAULTS, hang_seconds: float = 3600.0):
        unknown = set(faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        self.faults = list(faults)
        self.hang_seconds = hang_seconds

    def build_dataset(self, tokenizer):
        return [{"prompt": f"Task {i}: say something.", "fault": f, "task": i} for i, f in enumerate(self.faults)]

    def reset(self, episode: Episode):
        if episode.row["fault"] == "reset_raises":
            raise RuntimeError("reset exploded")

    def step(self, episode: Episode, completion: str):
        fault = episode.row["fault"]
        if fault == "step_raises":
            raise KeyError("no such door")
        if fault == "step_hangs":
            time.sleep(self.hang_seconds)  # a sync call stuck in a worker thread
        if fault == "step_bad_reply":
            return 42
        return "Go on." if episode.turns < 2 else None

    async def score_episode(self, episode: Episode):
        fault = episode.row["fault"]
        if fault == "score_raises":
            raise ZeroDivisionError("division by zero in the grader")
        if fault == "score_hangs":
            await asyncio.sleep(self.hang_seconds)
        return {
            "score_nan": float("nan"), "score_inf": float("inf"), "score_above_one": 1.5, "score_not_number": "high",
        }.get(fault, 0.5)


# Tool calls that break in every known way, each with what the error message to the model must say.
BAD_TOOL_CALLS = [
    ('<tool_call>{"name": "lookup", "arguments": {"key": "a"</tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "lookup", "arguments": {"key": 5}}</tool_call>', "must be string"),
    ('<tool_call>{"name": "launch", "arguments": {}}</tool_call>', "unknown tool 'launch'"),
    ('<tool_call>{"name": "lookup", "arguments": {"key": "boom"}}</tool_call>', "RuntimeError: the lookup service is down"),
    ('<tool_call>{"name": "lookup", "arguments": {"key": "' + "x" * 20_000 + '"}}</tool_call>', "too long"),
    ('<tool_call>{"name": "lookup", "arguments": ["a"]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "lookup", "arguments": {"key": "a"}}', "unterminated <tool_call>"),
]
# Text that would do harm if it were evaluated; it must reach the tool as a plain string.
INJECTION = '<tool_call>{"name": "lookup", "arguments": {"key": "__import__(\'os\').system(\'touch PWNED\')"}}</tool_call>'
BAD_TOOL_TURN = " ".join([INJECTION] + [text for text, _ in BAD_TOOL_CALLS])


class BadToolCallsEnv(ToolEnvironment):
    """After the model's first turn, `step` parses `BAD_TOOL_TURN` (every bad call at once) with the
    real parser in place of the model's text and answers it the default way; the replies go to the
    model as tool messages and the episode goes on for one more turn. `bad_calls_misanswered` counts
    bad calls whose reply was not the expected `Error: ...` message (plus the harmful text not
    reaching the tool as text)."""

    max_turns = 2

    def build_dataset(self, tokenizer):
        return [{"prompt": f"Look up key {k}.", "task": i} for i, k in enumerate("abcd")]

    @tool
    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        if key == "boom":
            raise RuntimeError("the lookup service is down")
        return json.dumps({"key": key, "value": len(key)})

    async def step(self, episode: Episode, completion: str):
        if episode.turns > 1:
            return None
        episode.tool_calls, episode.tool_call_errors = parse_tool_calls(BAD_TOOL_TURN)
        replies = await super().step(episode, BAD_TOOL_TURN)
        contents = [m["content"] for m in replies]
        wrong = 0 if any("os').system" in c and not c.startswith("Error") for c in contents) else 1
        for _, expected in BAD_TOOL_CALLS:
            if not any(c.startswith("Error: ") and expected in c for c in contents):
                wrong += 1
        episode.state["misanswered"] = wrong
        return replies

    def score_episode(self, episode: Episode) -> float:
        if "misanswered" not in episode.state:  # the first turn was cut off before any tool call
            return 0.0
        episode.metrics["bad_calls_misanswered"] = float(episode.state["misanswered"])
        return 1.0 if episode.state["misanswered"] == 0 else 0.0


class SlowLetters(LetterEnv):
    """envs.letters whose scoring takes `delay` seconds (episodes are scored concurrently, so a step
    takes about `delay` longer)."""

    def __init__(self, delay: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.delay = delay

    def score_episode(self, episode: Episode) -> float:
        time.sleep(self.delay)
        return super().score_episode(episode)


class SecretLetters(LetterEnv):
    """envs.letters that is handed credentials, as environments that call an API are, and that puts
    the `HF_TOKEN` of its environment into a row column and into its replies."""

    def __init__(self, api_key: str = "", hub_auth: str = "", **kwargs):
        super().__init__(**kwargs)
        self.api_key, self.hub_auth = api_key, hub_auth

    def build_dataset(self, tokenizer):
        token = os.environ.get("HF_TOKEN", "")
        return [{**row, "auth_header": f"Bearer {token}"} for row in super().build_dataset(tokenizer)]

    def step(self, episode: Episode, completion: str):
        reply = super().step(episode, completion)
        return None if reply is None else f"{reply} (checked with {os.environ.get('HF_TOKEN', '')})"
