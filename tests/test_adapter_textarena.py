"""TextArena single-player games through `--rl-env textarena:GAME`: real games from the package (no
mocks), played turn by turn through our engine; the game's reward in -1..1 becomes a score in 0..1."""

from __future__ import annotations

import json
import re

import pytest

from helpers import require  # noqa: E402

require("textarena", "pip install 'aitrain-grpo[textarena]'")

from aitrain_grpo.engine.runner import play  # noqa: E402
from aitrain_grpo.env.adapters.textarena import TextArenaEnv, game_reply  # noqa: E402
from aitrain_grpo.errors import EnvLoadError  # noqa: E402
from helpers import run_cli  # noqa: E402


def bisect(episode) -> str:
    """Guess the Number by halving the range, reading the game's replies in the conversation."""
    low, high, last = 1, 20, None
    for message in episode.messages:
        guess = re.search(r"\[(\d+)\]", message["content"]) if message["role"] == "assistant" else None
        if guess:
            last = int(guess.group(1))
        elif last is not None and "lower" in message["content"]:
            high = last - 1
        elif last is not None and "higher" in message["content"]:
            low = last + 1
    return f"My guess is [{(low + high) // 2}]"


def test_a_won_game_scores_one_and_the_model_sees_only_the_games_replies():
    env = TextArenaEnv("GuessTheNumber-v0", num_tasks=3, seed=7)
    episodes = play(env, env.build_dataset(None), bisect, max_turns=10)
    assert [ep.score for ep in episodes] == [1.0, 1.0, 1.0]
    replies = [m["content"] for ep in episodes for m in ep.messages[1:] if m["role"] == "user"]
    assert replies and all(r.startswith("[GAME] The target number is") for r in replies)
    assert "You are Player 0. You are playing Guess The Number" in episodes[0].messages[0]["content"]


@pytest.mark.parametrize("game", ["TowerOfHanoi-v0", "Mastermind-v0", "FrozenLake-v0"])
def test_other_games_play_and_score_in_range(game):
    env = TextArenaEnv(game, num_tasks=2, seed=1, max_turns=3)
    episodes = play(env, env.build_dataset(None), lambda ep: "[not a move]", max_turns=3)
    for episode in episodes:
        assert episode.error is None and 0.0 <= episode.score <= 1.0
        assert episode.metrics["invalid_move"] >= 1  # the game's own rule for invalid moves applied
    # The prompt is the game's first observation for that seed: the same seed gives the same prompt.
    assert env.build_dataset(None)[0]["prompt"] == TextArenaEnv(game, num_tasks=1, seed=1).build_dataset(None)[0]["prompt"]


def test_held_out_games_are_other_seeds():
    train = {r["seed"] for r in TextArenaEnv("GuessTheNumber-v0", num_tasks=8).build_dataset(None)}
    held = {r["seed"] for r in TextArenaEnv("GuessTheNumber-v0", num_tasks=8, split="held_out").build_dataset(None)}
    assert len(train) == len(held) == 8 and not train & held


def test_games_that_cannot_run_here_are_refused_in_one_line():
    with pytest.raises(EnvLoadError, match=r"TicTacToe-v0 cannot be played by 1 player.*give an opponent"):
        TextArenaEnv("TicTacToe-v0")
    with pytest.raises(EnvLoadError, match=r"GuessTheNumber-v0 cannot be played by 2 player.*leave out opponent"):
        TextArenaEnv("GuessTheNumber-v0", opponent="random")
    with pytest.raises(EnvLoadError, match="no game 'GuessTheNumbr-v0'; did you mean GuessTheNumber-v0"):
        TextArenaEnv("GuessTheNumbr-v0")


def test_game_reply_drops_the_echo_of_the_action():
    before = "[GAME] Guess a number."
    assert game_reply(before, before + "\n[Player] I say [5]\n[GAME] Higher.", "I say [5]") == "[GAME] Higher."
    assert game_reply(before, before + "\n[GAME] [A C]\n[GAME] Moved.", "A C") == "[GAME] Moved."


@pytest.mark.integration
@pytest.mark.parametrize("game, config, metric", [
    ("GuessTheNumber-v0", '{"num_tasks": 8}', "env/invalid_move"),
    ("TicTacToe-v0", '{"num_tasks": 8, "opponent": "random"}', "env/won"),  # two players, a fixed opponent
])
def test_grpo_trains_a_game_from_the_command_line(tmp_path, game, config, metric):
    run = run_cli("grpo", "--rl-env", f"textarena:{game}", "--rl-env-config", config,
                  "--max-steps", "2", "--batch-size", "4", "--rl-max-new-tokens", "8", "--rl-max-turns", "3",
                  "--output-dir", str(tmp_path / "run"))
    assert run.returncode == 0, run.stderr[-2000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(metric in m for m in metrics) == 2


def test_a_game_that_downloads_data_is_refused_in_one_line(capfd, tmp_path):
    """Offline, Wordle printed seven lines of nltk download errors before its refusal; now its downloads
    are answered from the installed data, so the refusal is the one line and nothing is fetched or written."""
    nltk = pytest.importorskip("nltk")
    try:
        nltk.data.find("corpora/words")
        nltk.data.find("taggers/averaged_perceptron_tagger_eng")
        pytest.skip("nltk's data is installed here, so Wordle runs")
    except LookupError:
        pass
    for game in ("Wordle-v0", "Hangman-v0"):
        with pytest.raises(EnvLoadError, match=f"{game} needs data it downloads at run time") as refused:
            TextArenaEnv(game)
        assert "\n" not in str(refused.value) and "nltk.downloader" in str(refused.value)
    captured = capfd.readouterr()
    assert "nltk_data" not in captured.out + captured.err
    from helpers.cli import refused as refused_command

    refused_command(["grpo", "--rl-env", "textarena:Wordle-v0", "--output-dir", str(tmp_path / "run")], tmp_path,
                    "Wordle-v0 needs data it downloads at run time", "textarena:GuessTheNumber-v0")
    assert not (tmp_path / "run").exists()


def test_the_game_every_help_names_runs_here():
    """`--rl-env`'s help (every command's) names a TextArena game; it must build offline, with no extra data."""
    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.env_spec import KINDS

    named = re.findall(r"textarena:([\w-]+)", RunConfig.help_for("rl_env") + KINDS["textarena"].example)
    assert named and all(TextArenaEnv(game, num_tasks=2).build_dataset(None) for game in named)


def first_listed_move(episode) -> str:
    """The model's side of TicTacToe in the tests: the first move the game's latest message lists."""
    text = next(m["content"] for m in reversed(episode.messages) if m["role"] in ("user", "tool"))
    listed = [line for line in text.splitlines() if "Available Moves" in line]
    return re.findall(r"'(\[\d+\])'", listed[-1])[0]


def test_two_player_games_are_played_against_a_fixed_opponent():
    # A scripted opponent (module:function) that always takes the lowest free cell, against a model that
    # does the same and moves first: the model gets 0, 2, 4, 6 and wins on the diagonal 2-4-6 (reward 1 ->
    # score 1); the opponent's moves reach the model in the game's replies.
    env = TextArenaEnv("TicTacToe-v0", num_tasks=3, opponent="envs_fixtures.ta_opponents:lowest_move")
    episodes = play(env, env.build_dataset(None), first_listed_move)
    for episode in episodes:
        assert episode.error is None and episode.metrics["finished"] == 1.0
        assert episode.score in (0.0, 0.5, 1.0) and episode.metrics["won"] == float(episode.score == 1.0)
        assert any("Player 1" in m["content"] for m in episode.messages if m["role"] == "user")  # its moves shown
    assert {ep.score for ep in episodes} == {1.0}


def test_a_random_opponent_is_seeded_and_may_open_the_game():
    # In KuhnPoker seat 1 opens: the random opponent has moved before the model's first observation, the
    # same move whenever the game with that seed is built (dataset) and reset (episode).
    env = TextArenaEnv("KuhnPoker-v0", num_tasks=4, opponent="random")
    rows = env.build_dataset(None)
    assert all("[Player 1]" in row["prompt"][0]["content"] for row in rows)
    again = TextArenaEnv("KuhnPoker-v0", num_tasks=4, opponent="random").build_dataset(None)
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in again]
    episodes = play(env, rows, lambda ep: "[check]" if "[check]" in ep.messages[-1]["content"] else "[call]")
    assert all(ep.error is None and 0.0 <= ep.score <= 1.0 for ep in episodes)
