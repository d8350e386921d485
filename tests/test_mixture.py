"""Mixtures: `--rl-env` repeated trains several environments in one run, each episode played by its own
environment with its own tools, metrics per environment, through grpo, sft, eval and env check."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.engine.backends.hf import HFBackend
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.env_spec import environment_of
from aitrain_grpo.errors import ConfigError, EnvLoadError
from helpers import run_cli

WEATHER, STATIONS = "envs.weather:WeatherEnv", "envs.stations:StationEnv"


def mixture(weights=None, config=None):
    return load_environment(*environment_of([WEATHER, STATIONS], None, None, config, weights))


def test_weights_set_each_environments_share_of_the_rows():
    env = mixture("3,1", '[{"repeats": 4}, {"repeats": 4}]')
    rows = env.build_dataset(None)
    shares = Counter(row["aitrain_env"] for row in rows)
    assert shares["WeatherEnv"] == 3 * shares["StationEnv"]
    assert len(rows) == 128  # 64 + 64 built; their shares redrawn 3:1
    # Without weights each keeps the rows it built; the per-environment config reached each.
    plain = Counter(r["aitrain_env"] for r in mixture(None, '[{"repeats": 2}, null]').build_dataset(None))
    assert plain == {"WeatherEnv": 32, "StationEnv": 64}


def test_each_episode_gets_its_own_environments_row_and_tools(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = mixture()
    rows = env.build_dataset(tokenizer)
    picked = [next(r for r in rows if r["aitrain_env"] == name) for name in ("WeatherEnv", "StationEnv")]
    engine = RolloutEngine(env, tokenizer, HFBackend.for_model(model, tokenizer), EpisodeSettings(max_new_tokens=8, max_turns=1))
    with engine:
        batch = engine.run(picked)
    weather, stations = (tokenizer.decode(trace.prompt_ids) for trace in batch.traces)
    assert "get_temperature" in weather and "find_station" not in weather
    assert "find_station" in stations and "get_temperature" not in stations
    # reset handed each episode its own environment's row (the columns its score reads).
    assert "city" in batch.episodes[0].row and batch.episodes[0].row["aitrain_env"] == "WeatherEnv"
    assert set(batch.episodes[1].metrics) >= {"StationEnv/score_mean", "StationEnv/answered"}
    assert not any(key.startswith("WeatherEnv/") for key in batch.episodes[1].metrics)


def test_the_oracle_of_a_mixture_is_each_environments_own():
    from aitrain_grpo.sft.oracle import play_demonstrations
    from aitrain_grpo.env.dataset import build_rows

    env = mixture()
    rows = build_rows(env, None)
    demos, errors = play_demonstrations(env, rows, 16, max_turns=None, timeout=10)
    assert not errors and all(demo.score == 1.0 for demo in demos)
    names = {demo.tools[0]["function"]["name"] for demo in demos}
    assert names == {"get_temperature", "find_station"}  # each demonstration carries its own tools


@pytest.mark.parametrize("weights, config, problem", [
    ("1,2,3", None, "--rl-env-weights '1,2,3' must be 2 non-negative numbers"),
    ("0,0", None, "not all zero"),
    (None, '{"repeats": 2}', "must be a JSON array of 2 objects"),
    (None, "[{}]", "must be a JSON array of 2 objects"),
])
def test_a_mixture_refuses_config_it_cannot_map(weights, config, problem):
    with pytest.raises((ConfigError, EnvLoadError), match=problem):
        environment_of([WEATHER, STATIONS], None, None, config, weights)
    with pytest.raises(ConfigError, match="give --rl-env two or more times"):
        RunConfig(rl_env=WEATHER, rl_env_weights="1").validate()


@pytest.mark.integration
def test_grpo_trains_a_mixture_and_logs_each_environment(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = run_cli("grpo", "--model", tiny_model_dir, "--rl-env", WEATHER, "--rl-env", "envs.letters:LetterEnv",
                     "--rl-env-config", '[null, {"letter": "a"}]', "--rl-env-weights", "1,1", "--max-steps", "2",
                     "--batch-size", "8", "--rl-max-new-tokens", "8", "--output-dir", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    recorded = json.loads((out / "run_config.json").read_text())
    assert recorded["rl_env"] == [WEATHER, "envs.letters:LetterEnv"] and recorded["rl_env_weights"] == "1,1"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = {key for record in records for key in record}
    assert {"env/WeatherEnv/score_mean", "env/LetterEnv/score_mean", "env/WeatherEnv/valid_call"} <= logged
    # eval on the run rebuilds the same mixture from run_config.json.
    evaluated = run_cli("eval", "--model", str(out), "--episodes", "4", "--rl-max-new-tokens", "8")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert f"{WEATHER} + envs.letters:LetterEnv: temperature" in evaluated.stdout
