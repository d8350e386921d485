"""envs.stations: two dependent tool calls, played with scripted turns (no model). The second call
needs the id only the first returns; each right call is rewarded on its own turn; tasks are held back."""

from __future__ import annotations

import json

import pytest

from aitrain_grpo.engine.runner import play
from envs.stations import StationEnv


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def play_turns(env: StationEnv, *turns: str):
    script = iter(turns)
    (episode,) = play(env, env.build_dataset(None)[:1], lambda ep: next(script))
    assert episode.error is None, episode.error
    return episode


def test_the_oracle_finds_reads_and_answers_with_a_reward_on_each_turn():
    env = StationEnv()
    episodes = play(env, env.build_dataset(None)[:4], env.solve)
    assert [ep.score for ep in episodes] == [1.0] * 4 and all(ep.turns == 3 for ep in episodes)
    assert all(ep.turn_rewards == [0.2, 0.3, 0.4] for ep in episodes)


def test_reading_a_station_needs_the_id_the_first_call_returned():
    env = StationEnv()
    city = env.build_dataset(None)[0]["city"]
    station = env.stations[city]
    number = env.temperatures[station]
    # A guessed id: the tool refuses it, nothing is read, and the answer earns nothing.
    guessed = play_turns(env, call("read_station", station_id=f"{city[:3].upper()}-000"), f"It is {number} degrees.")
    assert guessed.score == pytest.approx(0.1) and guessed.num_tool_errors == 1
    # Another city's station: found, but not the asked one.
    other = next(c for c in env.stations if c != city)
    wrong = play_turns(env, call("find_station", city=other), call("read_station", station_id=env.stations[other]),
                       f"It is {env.temperatures[env.stations[other]]} degrees.")
    assert wrong.score == pytest.approx(0.1) and wrong.turn_rewards == []
    # The right station, but a wrong number: no answer credit.
    wrong_number = play_turns(env, call("find_station", city=city), call("read_station", station_id=station),
                              f"It is {number + 1} degrees.")
    assert wrong_number.score == pytest.approx(0.6) and wrong_number.turn_rewards == [0.2, 0.3]
    assert wrong_number.metrics == {"found_station": 1.0, "read_station": 1.0, "answered": 0.0, "wrong_id": 0.0}


def test_held_out_cities_are_never_trained_on():
    train = {row["city"] for row in StationEnv().build_dataset(None)}
    held_out = {row["city"] for row in StationEnv(split="held_out").build_dataset(None)}
    assert len(held_out) == 16 and not train & held_out
    env = StationEnv(split="held_out")
    assert len(set(env.stations.values())) == len(env.stations) == 32  # an id names one city's station
