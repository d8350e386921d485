"""The environment contract as a user meets it: sync, async and single-turn environments, tools driven
by scripted model turns, and faults that end one episode without stopping the rest."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import pytest

from aitrain_grpo import Environment, Episode, ToolEnvironment, tool
from aitrain_grpo.engine.tool_parsers import parse_tool_calls
from aitrain_grpo.engine.runner import play

ROWS = [{"prompt": "Guess my number between 1 and 9.", "secret": s} for s in (3, 7)]


class GuessEnv(Environment):
    max_turns = 6

    def build_dataset(self, tokenizer):
        return ROWS

    def reset(self, episode):
        episode.state["guesses"] = 0

    def step(self, episode, completion):
        episode.state["guesses"] += 1
        guess = int(completion) if completion.strip().isdigit() else -1
        if guess == episode.row["secret"]:
            return None
        return "higher" if guess < episode.row["secret"] else "lower"

    def score_episode(self, episode):
        episode.metrics["guesses"] = episode.state["guesses"]
        return 1.0 if int(episode.last_completion or -1) == episode.row["secret"] else 0.0


class AsyncGuessEnv(GuessEnv):
    async def reset(self, episode):
        await asyncio.sleep(0.01)
        episode.state["guesses"] = 0

    async def step(self, episode, completion):
        await asyncio.sleep(0.01)
        return super().step(episode, completion)

    async def score_episode(self, episode):
        return super().score_episode(episode)


def counting_up(episode: Episode) -> str:
    return str(episode.turns + 1)


@pytest.mark.parametrize("env_class", [GuessEnv, AsyncGuessEnv])
def test_multi_turn_env_plays_until_step_returns_none(env_class):
    episodes = play(env_class(), ROWS, counting_up)
    assert [ep.turns for ep in episodes] == [3, 6]
    assert [ep.score for ep in episodes] == [1.0, 0.0]  # secret 7 needs 7 guesses; the cap is 6
    assert [ep.truncated for ep in episodes] == [False, True]
    # The conversation holds every model turn and every environment reply, in order.
    assert [m["content"] for m in episodes[0].messages[1:]] == ["1", "higher", "2", "higher", "3"]
    assert episodes[0].metrics["guesses"] == 3


def test_run_config_turn_cap_lowers_the_environments():
    episodes = play(GuessEnv(), ROWS, counting_up, max_turns=2)
    assert [ep.turns for ep in episodes] == [2, 2]
    assert all(ep.truncated and ep.max_turns == 2 for ep in episodes)


class SingleTurnEnv(Environment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "Say hi."}]

    def score_episode(self, episode):
        return 1.0 if "hi" in episode.last_completion else 0.0


def test_env_without_step_is_single_turn():
    episodes = play(SingleTurnEnv(), [{"prompt": "Say hi."}], lambda ep: "hi there")
    assert episodes[0].turns == 1 and episodes[0].score == 1.0 and not episodes[0].truncated


class Calculator(ToolEnvironment):
    max_turns = 4

    def build_dataset(self, tokenizer):
        return [{"prompt": "What is 2 + 3?", "answer": 5}]

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    @tool
    def fail(self) -> str:
        """A tool that always raises."""
        raise RuntimeError("service unavailable")

    def score_episode(self, episode):
        return 1.0 if str(episode.row["answer"]) in episode.last_completion else 0.0


def scripted(*turns: str):
    return lambda episode: turns[episode.turns]


def test_tool_environment_runs_calls_and_ends_on_a_turn_without_one():
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    (episode,) = play(Calculator(), Calculator().build_dataset(None), scripted(call, "The answer is 5."))
    assert episode.turns == 2 and episode.score == 1.0 and not episode.truncated
    tool_message = episode.messages[2]
    assert tool_message == {"role": "tool", "name": "add", "content": "5"}
    assert episode.num_tool_calls == 1 and episode.num_tool_errors == 0


def test_tool_schema_comes_from_type_hints_and_docstring():
    (schema,) = [t for t in Calculator().tools if t["function"]["name"] == "add"]
    params = schema["function"]["parameters"]
    assert schema["function"]["description"] == "Add two integers."
    assert params["properties"]["a"] == {"type": "integer", "description": "The first number."}
    assert params["required"] == ["a", "b"]
    assert [t["function"]["name"] for t in Calculator().tools] == ["add", "fail"]  # definition order


@pytest.mark.parametrize(
    "turn, expected",
    [
        ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "unknown tool 'nope'"),
        ('<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "add", "arguments": {"a": "2", "b": 3}}</tool_call>', "argument 'a' of add must be integer"),
        ('<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>', "missing required argument(s): b"),
        ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3, "c": 1}}</tool_call>', "unknown argument(s): c"),
        ('<tool_call>{"name": "fail", "arguments": {}}</tool_call>', "RuntimeError: service unavailable"),
        ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}', "unterminated <tool_call>"),
    ],
)
def test_bad_tool_calls_become_error_messages_to_the_model(turn, expected):
    (episode,) = play(Calculator(), Calculator().build_dataset(None), scripted(turn, "5"))
    assert episode.error is None and episode.turns == 2
    reply = episode.messages[2]
    assert reply["role"] == "tool" and reply["content"].startswith("Error") and expected in reply["content"]
    assert episode.num_tool_errors == 1


def test_tool_call_parser_reads_several_calls_and_double_encoded_arguments():
    text = 'x <tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call> y <tool_call>{"name": "b", "arguments": "{\\"z\\": 2}"}</tool_call>'
    calls, problems = parse_tool_calls(text)
    assert calls == [{"name": "a", "arguments": {"k": 1}}, {"name": "b", "arguments": {"z": 2}}] and problems == []


class Booking(ToolEnvironment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "Book a room."}]

    @tool
    def book(self, episode: Episode, room: Literal["single", "double"], nights: int, note: str | None = None) -> str:
        """Book a room.

        Args:
            room: The kind of room.
            nights: How many nights.
            note: A note for the hotel.
        """
        episode.state["booked"] = (room, nights, note)
        return "booked"

    def score_episode(self, episode):
        return 1.0 if "booked" in episode.state else 0.0


def test_literal_hints_are_enums_optional_ones_accept_null_and_episode_is_hidden():
    (schema,) = Booking().tools
    params = schema["function"]["parameters"]
    assert list(params["properties"]) == ["room", "nights", "note"] and params["required"] == ["room", "nights"]
    assert params["properties"]["room"]["enum"] == ["single", "double"]
    call = '<tool_call>{"name": "book", "arguments": {"room": "double", "nights": 2, "note": null}}</tool_call>'
    (episode,) = play(Booking(), Booking().build_dataset(None), scripted(call, "Done."))
    assert episode.messages[2]["content"] == "booked" and episode.state["booked"] == ("double", 2, None)


@pytest.mark.parametrize(
    "arguments, expected",
    [
        ('{"room": "suite", "nights": 2}', 'argument \'room\' of book must be one of "single", "double", got "suite"'),
        ('{"room": "single", "nights": 2.0}', "argument 'nights' of book must be integer, got 2.0"),
        ('{"room": "single", "nights": true}', "argument 'nights' of book must be integer, got true"),
        ('{"room": "single", "nights": 1, "note": 5}', "argument 'note' of book must be string or null, got 5"),
    ],
)
def test_arguments_outside_the_schema_are_refused_before_the_tool_runs(arguments, expected):
    call = '<tool_call>{"name": "book", "arguments": ' + arguments + '}</tool_call>'
    (episode,) = play(Booking(), Booking().build_dataset(None), scripted(call, "Done."))
    assert episode.messages[2]["content"] == f"Error: {expected}" and "booked" not in episode.state


class FaultyEnv(Environment):
    """Fails in the way named by the row, to show one episode's fault does not touch the others."""

    max_turns = 3

    def build_dataset(self, tokenizer):
        return []

    def reset(self, episode):
        if episode.row["fault"] == "reset":
            raise KeyError("missing-key")

    def step(self, episode, completion):
        fault = episode.row["fault"]
        if fault == "step":
            raise ValueError("bad move")
        if fault == "hang":
            time.sleep(5)
        if fault == "reply":
            return 42
        return None

    def score_episode(self, episode):
        return {"nan": float("nan"), "big": 1.5, "text": "high"}.get(episode.row["fault"], 1.0)


@pytest.mark.parametrize(
    "fault, message",
    [
        ("reset", "FaultyEnv.reset raised KeyError: 'missing-key'"),
        ("step", "FaultyEnv.step raised ValueError: bad move"),
        ("hang", "FaultyEnv.step timed out after 0.5s"),
        ("reply", "FaultyEnv.step returned int; return a string, a list of messages, or None"),
        ("nan", "FaultyEnv.score_episode returned nan, outside [0, 1]"),
        ("big", "FaultyEnv.score_episode returned 1.5, outside [0, 1]"),
        ("text", "FaultyEnv.score_episode returned str 'high', not a number in [0, 1]"),
    ],
)
def test_a_fault_ends_that_episode_with_score_zero_and_a_named_error(fault, message):
    rows = [{"prompt": "go", "fault": fault}, {"prompt": "go", "fault": "none"}]
    started = time.perf_counter()
    broken, healthy = play(FaultyEnv(), rows, lambda ep: "ok", timeout=0.5)
    assert broken.error == message and broken.score == 0.0 and broken.done
    assert healthy.error is None and healthy.score == 1.0
    assert time.perf_counter() - started < 3  # a hung call is abandoned at its timeout


@pytest.mark.parametrize("make_score", [
    lambda: __import__("numpy").float32(0.5), lambda: __import__("torch").tensor(0.5),
    lambda: __import__("fractions").Fraction(1, 2), lambda: __import__("decimal").Decimal("0.5"),
])
def test_numpy_torch_and_exact_scalars_are_scores(make_score):
    class ArrayScoreEnv(SingleTurnEnv):
        def score_episode(self, episode):
            return make_score()

    (episode,) = play(ArrayScoreEnv(), [{"prompt": "Say hi."}], lambda ep: "hi")
    assert episode.error is None and episode.score == 0.5


class Ledger(ToolEnvironment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "Write a then b."}]

    @tool
    def write(self, episode: Episode, text: str, pause: float = 0.0) -> str:
        """Append text to the ledger.

        Args:
            text: What to append.
            pause: Seconds to wait first.
        """
        time.sleep(pause)
        episode.state.setdefault("ledger", []).append(text)
        return "|".join(episode.state["ledger"])

    def score_episode(self, episode):
        return 1.0


def test_the_tool_calls_of_one_turn_run_in_the_order_written():
    # The first call is slow: were the calls run concurrently, the second would land first.
    calls = ('<tool_call>{"name": "write", "arguments": {"text": "a", "pause": 0.2}}</tool_call>'
             '<tool_call>{"name": "write", "arguments": {"text": "b"}}</tool_call>')
    (episode,) = play(Ledger(), Ledger().build_dataset(None), scripted(calls, "Done."))
    assert episode.state["ledger"] == ["a", "b"]
    assert [m["content"] for m in episode.messages[2:4]] == ["a", "a|b"]


def test_the_public_names_import_and_user_errors_are_one_kind():
    import aitrain_grpo

    assert all(getattr(aitrain_grpo, name) is not None for name in aitrain_grpo.__all__)
    with pytest.raises(aitrain_grpo.UserError, match="did you mean 'HotelEnv'"):
        aitrain_grpo.load_environment("envs.hotel", "HotelEnvv")
    assert issubclass(aitrain_grpo.ConfigError, aitrain_grpo.UserError)
    assert issubclass(aitrain_grpo.TrainingStopped, Exception)


class PerRowTools(ToolEnvironment):
    """Offers each row its own tool (as a mixture does) and counts how often it is asked which."""

    asked = 0

    def build_dataset(self, tokenizer):
        return [{"prompt": "Write.", "tool": name} for name in ("write", "echo")]

    def tools_for_row(self, row):
        PerRowTools.asked += 1
        return [spec for spec in self.tools if spec["function"]["name"] == row["tool"]]

    @tool
    def write(self, text: str) -> str:
        """Write text.

        Args:
            text: What to write.
        """
        return text

    @tool
    def echo(self, text: str) -> str:
        """Echo text.

        Args:
            text: What to echo.
        """
        return text

    def score_episode(self, episode):
        return 1.0


def test_an_episodes_tools_are_fixed_when_it_starts_and_its_bookkeeping_is_apart_from_the_author():
    env, PerRowTools.asked = PerRowTools(), 0
    calls = '<tool_call>{"name": "write", "arguments": {"text": "a"}}</tool_call>'
    episodes = play(env, env.build_dataset(None), scripted(calls, calls, "Done."))
    assert PerRowTools.asked == 2  # once per episode, not once per turn
    assert [[t["function"]["name"] for t in ep.log.tools] for ep in episodes] == [["write"], ["echo"]]
    # The engine's records live in `episode.log`, readable under their old names.
    assert [(ep.num_tool_calls, ep.num_tool_errors) for ep in episodes] == [(2, 0), (2, 0)]
    assert all(ep.log.num_tool_calls == ep.num_tool_calls and ep.stop_reason == ep.log.stop_reason == "env"
               for ep in episodes)
    assert "log" not in repr(episodes[0]) and "stop_reason" not in repr(episodes[0])
