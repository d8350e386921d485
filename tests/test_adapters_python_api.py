"""The reasoning-gym and TextArena adapters built by hand in Python and handed to `train(config, env=...)`,
as a user writing a script does (tests/test_adapter_reasoning_gym.py and test_adapter_textarena.py go
through `--rl-env` on the command line instead): two GRPO steps on the tiny model, with the real
packages. What a user would look at: the run finishes its steps, no episode errored, the adapter's own
metrics reach metrics.jsonl, and episodes.jsonl shows the task's prompt and scores in [0, 1]."""

from __future__ import annotations

import json

import pytest


def two_steps(model: str, env, out) -> tuple[list[dict], list[dict]]:
    from aitrain_grpo import RunConfig, train

    config = RunConfig(model=model, output_dir=str(out), max_steps=2, batch_size=4, rl_max_new_tokens=8)
    summary = train(config, env=env)
    assert summary["global_step"] == 2
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["env/errors"] == 0 for m in metrics)
    assert episodes and all(ep["error"] is None and 0.0 <= ep["score"] <= 1.0 for ep in episodes)
    return metrics, episodes


def test_a_reasoning_gym_family_trains_from_python(tiny_model_dir, tmp_path):
    pytest.importorskip("reasoning_gym")
    from aitrain_grpo.env.adapters.reasoning_gym import ReasoningGymEnv

    env = ReasoningGymEnv(task="chain_sum", size=40, seed=2)
    questions = {row["rg_index"]: row["prompt"][-1]["content"] for row in env.build_dataset(None)}
    assert len(questions) == 32  # every fifth of the 40 entries is held out
    metrics, episodes = two_steps(tiny_model_dir, env, tmp_path / "run")
    assert all("env/answered" in m and "env/correct" in m for m in metrics)
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    same = reasoning_gym.create_dataset("chain_sum", size=40, seed=2)
    for episode in episodes:  # one turn on the entry's own question, never a held-out entry
        index = episode["row"]["rg_index"]
        assert episode["turns"] == 1 and index % 5 != 4
        assert episode["messages"][1] == {"role": "user", "content": questions[index]}
        # The score is the family's own verdict on what the model wrote (0 without an <answer> tag).
        answer = extract_answer(episode["messages"][-1]["content"])
        expected = 0.0 if answer is None else min(1.0, max(0.0, same.score_answer(answer=answer, entry=same[index])))
        assert episode["score"] == pytest.approx(expected)
        assert episode["metrics"]["answered"] == float(answer is not None)


def test_a_textarena_game_trains_from_python(tiny_model_dir, tmp_path):
    pytest.importorskip("textarena")
    from aitrain_grpo.env.adapters.textarena import TextArenaEnv

    env = TextArenaEnv(game="GuessTheNumber-v0", num_tasks=8, max_turns=3)
    first = {row["seed"]: row["prompt"][0]["content"] for row in env.build_dataset(None)}
    metrics, episodes = two_steps(tiny_model_dir, env, tmp_path / "run")
    assert all("env/invalid_move" in m and "env/finished" in m for m in metrics)
    # The tiny model's text is never a valid guess: the game gives another try (so episodes last past
    # one turn) and then ends the game as a loss.
    assert any(episode["turns"] > 1 for episode in episodes)
    for episode in episodes:  # the game's first observation for that seed, then the game's own replies
        assert episode["messages"][0]["content"] == first[episode["row"]["seed"]]
        assert "You are playing Guess The Number" in episode["messages"][0]["content"]
        replies = [m["content"] for m in episode["messages"][1:] if m["role"] == "user"]
        assert len(replies) == episode["turns"] - 1 and all(r.startswith("[GAME]") for r in replies)
        assert not any("You are Player 0" in r for r in replies)  # replies are new text, not the whole log
        assert episode["score"] == replayed_score("GuessTheNumber-v0", episode)
        assert episode["metrics"]["invalid_move"] >= 1


def replayed_score(game: str, episode: dict) -> float:
    """The episode's moves played again in a fresh TextArena game with its seed: the reward for player 0
    when the game ended (its -1 for a losing invalid move as 0), 0 when it had not."""
    import textarena as ta

    env = ta.make(game)
    env.reset(num_players=1, seed=episode["row"]["seed"])
    done = False
    for message in episode["messages"]:
        if message["role"] == "assistant" and not done:
            done, _ = env.step(message["content"])
    rewards, _ = env.close()
    return min(1.0, max(0.0, float(rewards[0]))) if done and rewards else 0.0
