"""Self-play in TextArena two-player games (`opponent: "self"`): the other seat is played by the policy
being played, through `episode.policy_turn` (engine/policy_turns.py), and only the chosen seat's turns
train. Real textarena and the real tiny model, through the rollout engine (both schedules), env check,
and two `aitrain grpo` steps from the command line.

TruthAndDeception-v0 is the game: its turns are free text, so the tiny model's samples are moves and both
seats really play (seat 0, the deceiver, talks three times; seat 1 talks, then guesses, and the tiny
model's guess is never in the right format, so the trained seat wins)."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest

from helpers import require  # noqa: E402

require("textarena", "pip install 'aitrain-grpo[textarena]'")

import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from aitrain_grpo.commands.cli import app  # noqa: E402
from aitrain_grpo.engine.backends.base import SamplingParams  # noqa: E402
from aitrain_grpo.engine.backends.hf import HFBackend  # noqa: E402
from aitrain_grpo.engine.rollout import RolloutEngine  # noqa: E402
from aitrain_grpo.engine.settings import EpisodeSettings  # noqa: E402
from aitrain_grpo.engine.runner import play  # noqa: E402
from aitrain_grpo.env.adapters.textarena import TextArenaEnv  # noqa: E402
from aitrain_grpo.errors import EnvLoadError  # noqa: E402
from helpers import REPO, run_cli  # noqa: E402

GAME = "TruthAndDeception-v0"
SELF_PLAY = ["--rl-env", f"textarena:{GAME}", "--rl-env-config", '{"opponent": "self", "num_tasks": 8}']


class RecordingHF(HFBackend):
    """The hf backend, keeping every prompt it was asked to continue and the sample it drew."""

    def generate(self, prompts, max_tokens, sampling):
        samples = super().generate(prompts, max_tokens, sampling)
        self.calls.extend(zip([list(p) for p in prompts], samples))
        return samples


class OneRequestHF(RecordingHF):
    """The same, taking one turn at a time (`generate_one`) as the vLLM backends do (a RequestBackend), so
    the engine draws every turn, the opponent's too, through that path."""

    lock = threading.Lock()

    async def generate_one(self, prompt, max_tokens, sampling):
        def one():
            with self.lock:
                return self.generate([prompt], max_tokens, sampling)[0]

        return await asyncio.get_running_loop().run_in_executor(None, one)


@pytest.mark.parametrize("schedule, backend_class", [("lockstep", RecordingHF), ("continuous", RecordingHF),
                                                     ("continuous", OneRequestHF)])
def test_self_play_trains_only_the_chosen_seats_sampled_tokens(schedule, backend_class, tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = TextArenaEnv(GAME, num_tasks=2, opponent="self")
    backend = backend_class.for_model(model, tokenizer)
    backend.calls = []
    engine = RolloutEngine(env, tokenizer, backend, EpisodeSettings(max_new_tokens=8, schedule=schedule,
                                                                    sampling=SamplingParams(temperature=1.0)))
    torch.manual_seed(0)
    with engine:
        batch = engine.run(env.build_dataset(tokenizer) * 2)  # groups of two, as TRL hands them
    drawn: dict[tuple, list[list[int]]] = {}  # prompt -> the samples drawn for it (a group shares its first)
    for prompt, sample in backend.calls:
        drawn.setdefault(tuple(prompt), []).append(sample.token_ids)
    seat_calls = 0
    for episode, trace in zip(batch.episodes, batch.traces):
        assert episode.error is None and episode.stop_reason == "env" and episode.metrics["finished"] == 1.0
        assert episode.score in (0.0, 0.5, 1.0) and episode.turns == 3
        # Each model turn of the trained sequence is one sample drawn for the sequence so far, and the
        # tokens with mask 1 are exactly those turns': the opponent's samples are not in the sequence.
        trained_total = 0
        for start, end in zip(trace.turn_starts, trace.turn_starts[1:] + [len(trace.completion_ids)]):
            trained = [t for t, m in zip(trace.completion_ids[start:end], trace.env_mask[start:end]) if m]
            candidates = drawn[tuple(trace.prompt_ids + trace.completion_ids[:start])]
            assert trained in candidates
            candidates.remove(trained)
            trained_total += len(trained)
            seat_calls += 1
        assert sum(trace.env_mask) == trained_total
    opponent_calls = [(p, s) for p, s in backend.calls if "You are Player 1" in tokenizer.decode(p)]
    assert len(opponent_calls) == len(backend.calls) - seat_calls >= 3 * len(batch.episodes)
    # The opponent's moves, sampled from the same model, reach the trained seat as the game's reply text.
    seen = "\n".join(m["content"] for ep in batch.episodes for m in ep.messages if m["role"] == "user")
    texts = [tokenizer.decode([t for t in s.token_ids if t not in backend.stop_ids]).strip() for _, s in opponent_calls]
    assert sum(f"[Guesser] {text}" in seen for text in texts if text) >= 2 * len(batch.episodes)
    assert batch.generate_calls >= len(opponent_calls)  # its turns count as generate calls


def test_text_level_self_play_gives_the_opponent_seat_its_own_conversation():
    asked = []

    def first_listed_move(episode) -> str:  # both seats: the first cell the game lists
        asked.append(episode.messages)
        listed = [line for line in episode.messages[-1]["content"].splitlines() if "Available Moves" in line]
        return re.findall(r"'(\[\d+\])'", listed[-1])[0]

    env = TextArenaEnv("TicTacToe-v0", num_tasks=1, opponent="self")
    (episode,) = play(env, env.build_dataset(None), first_listed_move)
    # 0, 1, 2, 3, 4, 5, 6: seat 0 wins on the diagonal 2-4-6, having seen seat 1's moves in the replies.
    assert episode.error is None and episode.score == 1.0 and episode.metrics["won"] == 1.0
    assert all(f"[Player 1] [{cell}]" in "".join(m["content"] for m in episode.messages) for cell in (1, 3, 5))
    opponent = [messages for messages in asked if "You are Player 1" in messages[0]["content"]]
    assert [len(messages) for messages in opponent] == [1, 3, 5]
    assert [m["content"] for m in opponent[-1][1::2]] == ["[1]", "[3]"]  # its own moves, as the assistant
    assert episode.policy_turn is None  # handed back once played


def test_what_self_play_cannot_do_is_refused_in_one_line():
    with pytest.raises(EnvLoadError, match=r"opens with seat 0, played by the policy itself \(self-play\).*player 0"):
        TextArenaEnv("TicTacToe-v0", opponent="self", player=1)
    with pytest.raises(EnvLoadError, match="player 'both' cannot be trained: an episode trains one token sequence"):
        TextArenaEnv("TicTacToe-v0", opponent="self", player="both")


@pytest.mark.integration
def test_env_check_plays_self_play_under_each_policy(monkeypatch):
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(app, ["env", "check", *SELF_PLAY, "--episodes", "4", "--rl-max-new-tokens", "8"])
    assert result.exit_code == 0, result.output[-3000:]
    rows = {cells[0]: cells[1:] for line in result.output.splitlines()
            if (cells := [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]) and cells[0] in ("empty", "model")}
    assert set(rows) == {"empty", "model"}
    for policy, cells in rows.items():  # mean, min, max, turns, errors: three turns each, both seats played
        assert float(cells[0]) in (0.0, 0.5, 1.0) and float(cells[3]) == 3.0 and cells[4] == "0", (policy, cells)


@pytest.mark.integration
def test_grpo_trains_a_seat_against_itself_from_the_command_line(tmp_path):
    run = run_cli("grpo", *SELF_PLAY, "--max-steps", "2", "--batch-size", "4", "--rl-max-new-tokens", "8",
                  "--rl-max-turns", "3", "--output-dir", str(tmp_path / "run"))
    assert run.returncode == 0, run.stderr[-2000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["env/errors"] == 0 and "env/won" in m for m in metrics)
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    for episode in episodes:  # the trained seat's conversation, with the opponent's moves in the game's replies
        assert episode["score"] in (0.0, 0.5, 1.0)
        assert "You are Player 0" in episode["messages"][0]["content"]
        assert any(m["content"].startswith("[Guesser]") for m in episode["messages"][1:] if m["role"] == "user")
