"""`EpisodeSettings.from_options` is the one mapping from a run's options to how episodes are played: each
option it reads reaches its setting, from a RunConfig or a mapping of the same names (`aitrain eval`'s
flags), a missing or None option keeps the default, and those defaults are the run options' defaults
(save `top_k`, documented in engine/settings.py). What the engine does with each setting is tested where
it is played (test_tokens.py, test_cut_turn.py, test_continuous.py, test_agent_endpoint.py, ...)."""

from __future__ import annotations

import dataclasses

import pytest

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.backends.base import SamplingParams
from aitrain_grpo.engine.settings import EpisodeSettings

# Every option from_options reads, set away from its default, and the settings it must give.
OPTIONS = dict(model="some/model", rl_max_new_tokens=7, rl_max_turns=3, rl_max_completion_length=99,
               rl_temperature=0.5, rl_top_k=4, rl_top_p=0.9, rl_min_p=0.05, rl_repetition_penalty=1.2,
               rl_env_timeout=5.0, rl_rollout_schedule="lockstep",
               rl_cut_turn="end", rl_tool_parser="hermes", agent_host="0.0.0.0", agent_port=8123)
EXPECTED = EpisodeSettings(max_new_tokens=7, max_turns=3, max_completion_length=99, sampling=SamplingParams(0.5, 4, 0.9, 0.05, 1.2),
                           env_timeout=5.0, schedule="lockstep", cut_turn="end", tool_parser="hermes",
                           model_name="some/model", agent_address=("0.0.0.0", 8123))


def test_each_option_reaches_its_setting_from_a_run_config_or_a_mapping():
    assert EpisodeSettings.from_options(RunConfig(**OPTIONS)) == EXPECTED
    assert EpisodeSettings.from_options(OPTIONS) == EXPECTED


def test_an_option_missing_or_none_keeps_the_default():
    settings = EpisodeSettings.from_options({"rl_temperature": 0.7, "rl_max_turns": None})
    assert settings == dataclasses.replace(EpisodeSettings(), sampling=SamplingParams(0.7, 50, 1.0))


def test_the_defaults_are_the_run_options_defaults_but_top_k():
    from_run = EpisodeSettings.from_options(RunConfig())
    assert from_run.sampling.top_k == 0 and EpisodeSettings().sampling.top_k == 50
    assert dataclasses.replace(from_run, sampling=SamplingParams(), model_name="policy") == EpisodeSettings()


def test_settings_are_one_frozen_value_and_a_schedule_typo_is_refused():
    with pytest.raises(dataclasses.FrozenInstanceError):
        EpisodeSettings().max_new_tokens = 1
    with pytest.raises(ValueError, match="schedule must be one of"):
        EpisodeSettings(schedule="sideways")
