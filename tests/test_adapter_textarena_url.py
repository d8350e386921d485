"""A TextArena opponent behind an OpenAI-compatible URL (`opponent: {"base_url": ..., "model": ...}`): real
TextArena games against a small scripted chat-completions server in the test process
(envs_fixtures/chat_server.py; what is under test is our client: what the opponent is sent, how its reply
becomes its move, and how an unreachable server, an unknown model or a failing request are reported)."""

from __future__ import annotations

import re

import pytest

from helpers import require  # noqa: E402

require("textarena", "pip install 'aitrain-grpo[textarena]'")
pytest.importorskip("openai")

from typer.testing import CliRunner  # noqa: E402

from aitrain_grpo.commands.cli import app  # noqa: E402
from aitrain_grpo.engine.runner import play  # noqa: E402
from aitrain_grpo.env.adapters.textarena import TextArenaEnv  # noqa: E402
from aitrain_grpo.errors import EnvLoadError  # noqa: E402
from envs_fixtures.chat_server import ChatServer  # noqa: E402


def first_listed_move(episode) -> str:
    """The trained seat in these tests: the first move the game's latest message lists."""
    text = next(m["content"] for m in reversed(episode.messages) if m["role"] == "user")
    listed = [line for line in text.splitlines() if "Available Moves" in line]
    return re.findall(r"'(\[\d+\])'", listed[-1])[0]


@pytest.fixture
def server():
    with ChatServer() as running:
        yield running


def test_the_opponent_model_gets_its_seats_conversation_and_its_reply_is_its_move(server):
    config = {"base_url": server.url, "model": "scripted", "api_key": "sk-test-key-1234", "temperature": 0.3,
              "max_tokens": 12}
    env = TextArenaEnv("TicTacToe-v0", num_tasks=2, opponent=config)
    episodes = play(env, env.build_dataset(None), first_listed_move)
    # Seat 0 takes the first listed cell, the server's model the lowest: 0, 1, 2, 3, 4, 5, 6: seat 0 wins
    # on the diagonal 2-4-6 after the opponent played [1], [3], [5].
    for episode in episodes:
        assert episode.error is None and episode.score == 1.0 and episode.metrics["won"] == 1.0
        replies = "\n".join(m["content"] for m in episode.messages if m["role"] == "user")
        assert all(f"[Player 1] {move}" in replies for move in ("[1]", "[3]", "[5]"))
    assert len(server.requests) == 6  # three moves per game
    first, last = (sorted(server.requests, key=lambda r: len(r["messages"]))[i] for i in (0, -1))
    assert (first["model"], first["temperature"], first["max_tokens"]) == ("scripted", 0.3, 12)
    assert {h.get("Authorization") or h.get("authorization") for h in server.headers} == {"Bearer sk-test-key-1234"}
    # Its seat as the trained seat sees its own: its first observation, then its moves and the game's replies.
    assert [m["role"] for m in first["messages"]] == ["user"]
    assert "You are Player 1 in Tic Tac Toe" in first["messages"][0]["content"]
    assert [m["role"] for m in last["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in last["messages"][1::2]] == ["[1]", "[3]"]
    assert not any("You are Player 1" in m["content"] for m in last["messages"][2::2])  # replies, not the log


def test_an_unreachable_server_or_unknown_model_is_a_one_line_error_before_training(server, refused_url):
    with pytest.raises(EnvLoadError, match=r"the opponent at http://127\.0\.0\.1:\d+/v1 cannot be reached") as refused:
        TextArenaEnv("TicTacToe-v0", opponent={"base_url": f"{refused_url}/v1", "model": "scripted"})
    assert "\n" not in str(refused.value)
    with pytest.raises(EnvLoadError, match=r"serves no model 'gpt-9' \(it serves: scripted\)"):
        TextArenaEnv("TicTacToe-v0", opponent={"base_url": server.url, "model": "gpt-9"})
    with pytest.raises(EnvLoadError, match="optional api_key, temperature, max_tokens"):
        TextArenaEnv("TicTacToe-v0", opponent={"base_url": server.url, "model": "scripted", "top_q": 1})
    # From the command line: exit 2 and the one line, before any model is loaded.
    config = '{"opponent": {"base_url": "%s/v1", "model": "scripted"}}' % refused_url
    result = CliRunner().invoke(app, ["env", "check", "--rl-env", "textarena:TicTacToe-v0", "--rl-env-config", config])
    assert result.exit_code == 2 and "cannot be reached" in result.output
    assert sum("cannot be reached" in line for line in result.output.splitlines()) == 1


def test_a_request_that_fails_during_an_episode_fails_that_episode_naming_the_opponent(server):
    env = TextArenaEnv("TicTacToe-v0", num_tasks=2, opponent={"base_url": server.url, "model": "scripted"})
    server.fail_completions = True
    episodes = play(env, env.build_dataset(None), first_listed_move)
    for episode in episodes:
        assert episode.score == 0.0 and episode.stop_reason == "error"
        assert re.match(r"TextArenaEnv\.step raised RuntimeError: the opponent scripted at http://127\.0\.0\.1:\d+/v1 "
                        r"failed: .*500.*the scripted model is down", episode.error), episode.error
