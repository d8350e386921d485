"""skyrl-gym (0.4.0) environments run unchanged through `SkyRLEnv`: one instance per episode made as SkyRL's
generator makes it (`env_config`, `extras` from the row's columns plus `max_turns`), `init` making the
prompt, each model turn passed to `step`, observations as replies, `done` ending the episode, and the sum
of the step rewards (what SkyRL's GRPO advantage sums) clamped to [0, 1] as the score.

A small multi-turn `BaseTextEnv` written here, and skyrl-gym's own `gsm8k` and `gsm8k_multi_turn` (they
run offline). Scripted model turns play most cases (seconds); one 2-step GRPO run of the tiny model
trains through the adapter (a few seconds)."""

from __future__ import annotations

import json

import pytest

from helpers import require  # noqa: E402

require("skyrl_gym", "pip install 'aitrain-grpo[skyrl]'")

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

from aitrain_grpo.engine.runner import play  # noqa: E402
from aitrain_grpo.env.adapters.skyrl import SkyRLEnv, adapt_skyrl  # noqa: E402
from aitrain_grpo.env.dataset import build_rows  # noqa: E402
from aitrain_grpo.errors import EnvLoadError  # noqa: E402


class HigherLowerEnv(BaseTextEnv):
    """Guess a number in a few turns: a hint after each wrong answer, a small reward per answered turn."""

    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.target = int(extras["target"])
        self.max_turns = extras["max_turns"]
        self.bonus = env_config.get("bonus", 0.6)
        self.made = extras

    def init(self, prompt):
        return [{"role": "system", "content": "Answer with one number."}, *prompt], {"target": self.target}

    def step(self, action):
        self.turns += 1
        answer = action.strip()
        right = answer == str(self.target)
        done = right or self.turns >= self.max_turns
        hint = "Higher." if answer.isdigit() and int(answer) < self.target else "Lower."
        return BaseTextEnvStepOutput(observations=[] if done else [{"role": "user", "content": hint}],
                                     reward=self.bonus if right else 0.1, done=done, metadata={})

    def get_metrics(self):
        return {"turns_used": self.turns, "note": "text is left out"}


class NoStepEnv(BaseTextEnv):
    def __init__(self, env_config=None, extras={}):
        super().__init__()


class SilentEnv(HigherLowerEnv):
    def step(self, action):
        return BaseTextEnvStepOutput(observations=[], reward=0.0, done=False, metadata={})


def rows() -> list[dict]:
    return [{"prompt": [{"role": "user", "content": "Guess my number."}], "target": 5, "data_source": "test"}]


def scripted(*turns: str):
    return lambda episode: turns[episode.turns]


def test_a_multi_turn_episode_steps_on_its_own_instance_and_sums_the_rewards():
    env = adapt_skyrl(HigherLowerEnv, rows=rows(), env_config={"bonus": 0.7}, max_turns=4)
    assert type(env).__name__ == "HigherLowerEnv"
    built = build_rows(env, None)
    assert built[0]["prompt"] == [{"role": "system", "content": "Answer with one number."},
                                  {"role": "user", "content": "Guess my number."}]  # what init made
    (episode,) = play(env, built, scripted("3", "7", "5"))
    assert [m["content"] for m in episode.messages if m["role"] == "user"][1:] == ["Higher.", "Lower."]
    assert (episode.turns, episode.stop_reason, episode.error) == (3, "env", None)  # done ended it
    assert episode.score == pytest.approx(0.1 + 0.1 + 0.7)
    assert episode.metrics == pytest.approx({"reward_step_1": 0.1, "reward_step_2": 0.1, "reward_step_3": 0.7,
                                             "reward_total": 0.9, "turns_used": 3.0})
    # Made as SkyRL's generator makes it: extras are the row's other columns plus max_turns.
    assert episode.state["skyrl_env"].made == {"target": 5, "data_source": "test", "max_turns": 4}


def test_the_turn_cap_and_the_environments_own_done_agree():
    env = adapt_skyrl(HigherLowerEnv, rows=rows(), max_turns=2)
    (episode,) = play(env, build_rows(env, None), scripted("1", "2", "3"))
    assert episode.turns == 2 and episode.stop_reason == "env"  # the env said done at its max_turns (ours)
    assert episode.score == pytest.approx(0.2)


@pytest.fixture
def registered():
    """HigherLowerEnv registered with skyrl-gym, as SkyRL projects register their own environments."""
    from skyrl_gym.envs import deregister, register

    register(id="higher_lower", entry_point=HigherLowerEnv)
    yield "higher_lower"
    deregister("higher_lower")


def test_a_rows_env_class_column_names_its_registered_environment(registered):
    env = SkyRLEnv(rows=[{**rows()[0], "env_class": registered}], max_turns=3)
    (episode,) = play(env, build_rows(env, None), scripted("5"))
    assert episode.score == pytest.approx(0.6) and episode.turns == 1
    assert episode.state["skyrl_env"].made == {"target": 5, "data_source": "test", "max_turns": 3}  # no env_class
    # The row's column wins over the adapter's env_class, as in SkyRL.
    env = adapt_skyrl("gsm8k", rows=[{**rows()[0], "env_class": registered}])
    assert isinstance(play(env, build_rows(env, None), scripted("5"))[0].state["skyrl_env"], HigherLowerEnv)


def test_skyrl_gyms_own_gsm8k_environments_play_offline(tmp_path):
    spec = {"prompt": [{"role": "user", "content": "What is 2 + 3?"}],
            "reward_spec": {"method": "rule", "ground_truth": "5"}, "extra_info": {"split": "test"}}
    env = adapt_skyrl("gsm8k_multi_turn", rows=[spec], max_turns=3)
    (episode,) = play(env, build_rows(env, None), scripted("It is 4.\n#### 4", "#### 5"))
    assert episode.turns == 2 and episode.stop_reason == "env"
    follow_up = [m for m in episode.messages if m["role"] == "user"][1]["content"]
    assert follow_up.startswith("Please provide your step-by-step reasoning")
    # Step rewards 0.2 / 3 (formatted, wrong) and 1.0 sum past 1: the score is clamped, the sum kept.
    assert episode.metrics["reward_step_1"] == pytest.approx(0.2 / 3)
    assert episode.metrics["reward_total"] == pytest.approx(1 + 0.2 / 3)
    assert episode.score == 1.0 and episode.metrics["steps"] == 2.0
    # Each row may name its own registered class (SkyRL's env_class column), read from a SkyRL parquet file.
    from datasets import Dataset

    Dataset.from_list([{**spec, "env_class": "gsm8k"}, {**spec, "env_class": "gsm8k_multi_turn"}]).to_parquet(
        tmp_path / "train.parquet")
    env = SkyRLEnv(rows=str(tmp_path / "train.parquet"))
    single, multi = play(env, build_rows(env, None), scripted("#### 7", "#### 5"))
    assert (single.turns, single.score) == (1, 0.0)
    assert (multi.turns, multi.score) == (2, 1.0)


def test_what_cannot_be_mapped_is_a_one_line_error():
    with pytest.raises(EnvLoadError, match="NoStepEnv does not implement step"):
        adapt_skyrl(NoStepEnv, rows=rows())
    with pytest.raises(EnvLoadError, match="'gsm9k' is not a registered skyrl-gym environment"):
        adapt_skyrl("gsm9k", rows=rows())
    with pytest.raises(EnvLoadError, match=r"row 0: gsm8k\(env_config, extras\) raised AssertionError: reward_spec "
                                           r"field is required"):
        adapt_skyrl("gsm8k", rows=rows())
    with pytest.raises(EnvLoadError, match="row 0 has no env_class column and no env_class was given"):
        SkyRLEnv(rows=rows())
    env = adapt_skyrl(SilentEnv, rows=rows())
    (episode,) = play(env, build_rows(env, None), scripted("5"))
    assert episode.error == ("SilentEnv.step raised ValueError: returned done=False with no observations; return a "
                             "message to show the model (e.g. [{'role': 'user', 'content': ...}]) or done=True")


def test_two_grpo_steps_train_the_tiny_model_through_the_adapter(tiny_model_dir, tmp_path):
    from aitrain_grpo import RunConfig, train

    env = adapt_skyrl(HigherLowerEnv, rows=rows() * 2, max_turns=2)
    out = tmp_path / "run"
    summary = train(RunConfig(model=tiny_model_dir, output_dir=str(out), max_steps=2, rl_max_new_tokens=8), env=env)
    assert summary["global_step"] == 2
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["env/errors"] == 0 for m in metrics)
    # Wrong answers earn 0.1 a turn: every episode that was not cut off scored its turns' sum.
    assert all(m["env/reward_step_1"] == pytest.approx(0.1) for m in metrics if "env/reward_step_1" in m)
    assert any("env/reward_total" in m for m in metrics)
    recorded = json.loads((out / "run_config.json").read_text())
    assert recorded["rl_env_module"] == "aitrain_grpo.env.adapters.skyrl"
    assert recorded["rl_env_config"]["env_class"] == "test_adapter_skyrl:HigherLowerEnv"
