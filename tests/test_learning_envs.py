"""The learning benchmark's environments score what they claim, played with scripted turns (no model):
envs.rewrite cannot be gamed by a degenerate answer, and envs.weather pays for the tool call and the
number only the tool knows. Both hold tasks back for evaluation."""

from __future__ import annotations

import json
import random

import pytest

from aitrain_grpo.engine.runner import play
from envs.cities import CITIES
from envs.rewrite import RewriteEnv
from envs.weather import WeatherEnv

SENTENCE = "The ocean hides deep canyons, bright coral reefs and ancient shipwrecks."


def rewrite_score(constraint: str, first: str, second: str) -> float:
    env = RewriteEnv(constraints=[constraint])
    turns = iter([first, second])
    (episode,) = play(env, env.build_dataset(None)[:1], lambda ep: next(turns))
    assert episode.error is None
    return episode.score


@pytest.mark.parametrize("constraint, rewrite, expected", [
    ("lowercase", SENTENCE.lower(), 1.0),
    ("no_commas", SENTENCE.replace(",", ""), 1.0),
    ("lowercase", SENTENCE, 0.5),                      # kept every word, but one capital
    ("no_commas", SENTENCE, 0.5),                      # one comma left
    ("lowercase", "the sea is big.", 0.0),             # meets the constraint, keeps no key word
    ("lowercase", "the ocean is big.", 0.125),         # keeps one key word in eight
    ("lowercase", "", 0.0),
])
def test_rewrite_scores_content_and_constraint(constraint, rewrite, expected):
    assert rewrite_score(constraint, SENTENCE, rewrite) == pytest.approx(expected)


@pytest.mark.parametrize("degenerate", ["", "ocean", "ok ok ok"])
def test_rewrite_degenerate_answers_score_zero(degenerate):
    for constraint in ("lowercase", "no_commas"):
        assert rewrite_score(constraint, degenerate, degenerate.lower()) == 0.0


def test_rewrite_first_turn_in_lowercase_cannot_pass_the_lowercase_rewrite_by_copying():
    assert rewrite_score("lowercase", SENTENCE.lower(), SENTENCE.lower()) == 0.0
    assert rewrite_score("lowercase", SENTENCE, SENTENCE.lower()) == 1.0


def test_rewrite_held_out_topics_are_never_trained_on():
    train = {row["topic"] for row in RewriteEnv().build_dataset(None)}
    held_out = {row["topic"] for row in RewriteEnv(split="held_out").build_dataset(None)}
    assert held_out and not train & held_out


def call(city: str) -> str:
    return f'<tool_call>\n{json.dumps({"name": "get_temperature", "arguments": {"city": city}})}\n</tool_call>'


def weather_episode(turns: list[str], row: int = 0):
    env = WeatherEnv()
    row_data = env.build_dataset(None)[row]
    answers = iter(turns)
    (episode,) = play(env, [row_data], lambda ep: next(answers))
    return env, row_data, episode


def test_weather_pays_for_the_call_and_the_number():
    env = WeatherEnv()
    city = env.build_dataset(None)[0]["city"]
    number = env.temperatures[city]
    assert weather_episode([call(city), f"It is {number} degrees in {city}."])[2].score == pytest.approx(1.0)
    assert weather_episode([call(city), "It is warm."])[2].score == pytest.approx(0.5)
    # A broken call (the placeholder copied from the system message) earns the 0.1 for trying only.
    broken = '<tool_call>\n{"name": "<function name>", "arguments": {<arguments as JSON>}}\n</tool_call>'
    assert weather_episode([broken, "I could not look it up."])[2].score == pytest.approx(0.1)
    other = next(c for c in env.temperatures if c != city)
    # The wrong city's lookup pays little more than trying: one city for every question is no strategy.
    assert weather_episode([call(other), f"It is {env.temperatures[other]} degrees."])[2].score == pytest.approx(0.2)
    # Without the tool, even the right number earns nothing: it had to be looked up.
    assert weather_episode([f"It is {number} degrees in {city}."])[2].score == 0.0


def test_weather_held_out_cities_are_never_trained_on():
    train = {row["city"] for row in WeatherEnv().build_dataset(None)}
    held_out = {row["city"] for row in WeatherEnv(split="held_out").build_dataset(None)}
    assert len(held_out) == 16 and not train & held_out
    assert held_out <= set(WeatherEnv(split="held_out").temperatures)  # the tool knows every one


def test_weather_held_back_cities_added_later_change_no_earlier_temperature():
    """Models trained before the 12 held-back-only cities were added stay valid: the 20 first cities keep
    the temperatures that seed draws for them."""
    rng = random.Random(3)
    expected = {city: rng.randint(-5, 35) for city in CITIES}
    assert {city: WeatherEnv(seed=3).temperatures[city] for city in CITIES} == expected


def test_weather_oracle_scores_full_marks():
    env = WeatherEnv()
    episodes = play(env, env.build_dataset(None)[:4], env.solve)
    assert [ep.score for ep in episodes] == [1.0] * 4 and all(ep.turns == 2 for ep in episodes)
