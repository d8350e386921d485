"""TRL `environment_factory` classes run unchanged through `TRLFactoryEnv`: one instance per episode, reset
with the row's columns and its string appended to the prompt, the public methods offered as tools with the
schemas TRL itself makes (compared with a real `GRPOTrainer`), the model's calls run on the episode's
instance, and `get_reward()` (or a TRL reward function reading `environments`) as the score, clamped.

The environment classes below are written the way TRL's docs write them (the first is examples/trl_guess.py's):
plain classes, no import from aitrain_grpo. Scripted model turns play most cases in-process (seconds); one 2-step GRPO run of the tiny
model trains through the adapter (about 20 s)."""

from __future__ import annotations

import json

import pytest

from aitrain_grpo.engine.runner import play
from aitrain_grpo.env.adapters.trl_factory import TRLFactoryEnv, adapt_trl_factory
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.errors import EnvLoadError
from examples.trl_guess import GuessNumberEnv
from helpers import REPO


class NumberGuessEnv(GuessNumberEnv):
    """examples/trl_guess.py's environment, as TRL's docs write an environment_factory class, with a second
    tool, and an `__init__` that sets the state before `reset` (TRL builds the instance first)."""

    def __init__(self):
        self.secret = None
        self.guesses = 0
        self.solved = False

    def is_even(self) -> bool:
        """Tell whether the secret number is even."""
        return self.secret % 2 == 0


class BonusEnv(NumberGuessEnv):
    """Rewards outside [0, 1], as TRL allows."""

    def get_reward(self) -> float:
        return 5.0 if self.solved else -1.0


class RewardFuncEnv:
    """No get_reward: a TRL reward function reads the state, as in TRL's Wordle example."""

    def __init__(self, word: str = "crane"):
        self.word = word
        self.reward = 0.0

    def reset(self, **kwargs) -> None:
        self.reward = 0.0

    def guess(self, word: str) -> str:
        """Guess the word.

        Args:
            word: A five-letter word.
        """
        self.reward = 1.0 if word == self.word else 0.25
        return "correct" if word == self.word else "wrong"


def env_reward(environments, **kwargs) -> list[float]:
    return [environment.reward for environment in environments]


class RandomResetEnv(NumberGuessEnv):
    """A reset string that changes from call to call for the same row."""

    calls = 0

    def reset(self, **kwargs) -> str:
        super().reset(**kwargs)
        RandomResetEnv.calls += 1
        return f" Round {RandomResetEnv.calls}."


def rows(n: int = 2) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"Find my number ({i})."}], "secret": 3 + 2 * i, "high": 10}
            for i in range(n)]


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def scripted(*turns: str):
    """The same model turns for every episode."""
    return lambda episode: turns[episode.turns]


def test_an_episode_runs_the_tools_on_its_own_instance_and_scores_get_reward():
    env = adapt_trl_factory(NumberGuessEnv, rows=rows(2))
    assert type(env).__name__ == "NumberGuessEnv"  # messages name the user's class
    built = build_rows(env, None)
    # reset's string is appended to the last prompt message, as TRL appends it; reset saw the row's columns.
    assert built[0]["prompt"] == [{"role": "user", "content": "Find my number (0). The number is between 1 and 10."}]
    text_prompt = adapt_trl_factory(NumberGuessEnv, rows=[{"prompt": "Find it.", "secret": 3, "high": 9}])
    assert build_rows(text_prompt, None)[0]["prompt"] == "Find it. The number is between 1 and 9."
    scripts = {3: [call("is_even"), call("guess", number=3), "It is 3."],
               5: [call("guess", number=4), call("guess", number=6), call("guess", number=5), "It is 5."]}
    first, second = play(env, built, lambda episode: scripts[episode.row["secret"]][episode.turns])
    # Results as TRL shows them, str(result): a bool is "False", not JSON's "false".
    assert [(m["name"], m["content"]) for m in first.messages if m["role"] == "tool"] == [
        ("is_even", "False"), ("guess", "Right!")]
    assert [m["content"] for m in second.messages if m["role"] == "tool"] == ["Too low.", "Too high.", "Right!"]
    # A turn without a tool call ended each episode; get_reward is 1 / guesses.
    assert (first.stop_reason, first.turns, first.score) == ("env", 3, 1.0)
    assert (second.stop_reason, second.turns) == ("env", 4) and second.score == pytest.approx(1 / 3)
    assert first.error is None and second.error is None
    # Each episode had its own instance, reset with its own row.
    assert first.state["trl_env"] is not second.state["trl_env"]
    assert (first.state["trl_env"].secret, second.state["trl_env"].secret) == (3, 5)


def test_bad_calls_answer_errors_and_the_turn_cap_ends_the_episode():
    env = adapt_trl_factory(NumberGuessEnv, rows=rows(1), max_turns=3)
    turns = (call("guess", number="three"), call("shout"), call("guess", number=1))
    (episode,) = play(env, build_rows(env, None), scripted(*turns))
    replies = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert replies[0] == "Error: argument 'number' of guess must be integer, got \"three\""
    assert replies[1] == "Error: unknown tool 'shout'; tools: guess, is_even"
    # The third turn's call ran, but the cap ended the episode before its result was shown.
    assert len(replies) == 2 and episode.state["trl_env"].guesses == 1
    assert episode.num_tool_errors == 2
    assert episode.stop_reason == "max_turns" and episode.score == 0.0


def test_rewards_are_clamped_and_the_raw_value_kept():
    env = adapt_trl_factory(BonusEnv, rows=rows(1))
    (won,) = play(env, build_rows(env, None), scripted(call("guess", number=3), "ok"))
    (lost,) = play(env, build_rows(env, None), scripted("no idea"))
    assert (won.score, won.metrics["trl_reward"]) == (1.0, 5.0)
    assert (lost.score, lost.metrics["trl_reward"]) == (0.0, -1.0)


def test_the_tools_are_the_ones_trl_offers_with_the_same_schemas(tiny_model_dir, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import get_json_schema
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.response_template = qwen3_template  # TRL knows no response parser for the tiny model's template
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), processing_class=tokenizer,
        args=GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2,
                        num_generations=2, report_to=[], use_cpu=True),
        train_dataset=Dataset.from_list(rows(1)), environment_factory=NumberGuessEnv)
    offered_by_trl = [get_json_schema(method) for method in trainer._env_tools[None]]
    assert [s["function"]["name"] for s in offered_by_trl] == ["guess", "is_even"]
    assert adapt_trl_factory(NumberGuessEnv, rows=rows(1)).tools == offered_by_trl
    assert trainer.reward_func_names == ["NumberGuessEnv"]  # TRL, too, scores with get_reward


def test_a_trl_reward_function_reads_the_environments():
    env = adapt_trl_factory(RewardFuncEnv, rows=[{"prompt": "Guess the word."}], env_kwargs={"word": "slate"},
                            reward_func=env_reward)
    (right,) = play(env, build_rows(env, None), scripted(call("guess", word="slate"), "done"))
    (wrong,) = play(env, build_rows(env, None), scripted(call("guess", word="crane"), "done"))
    assert (right.score, wrong.score) == (1.0, 0.25)
    assert build_rows(env, None)[0]["prompt"] == "Guess the word."  # reset returned None: prompt untouched


def test_what_cannot_be_mapped_is_a_one_line_load_error():
    with pytest.raises(EnvLoadError, match=r"RewardFuncEnv has no get_reward\(\), so its reward comes from a TRL "
                                           r"reward function: pass reward_func='module:function'"):
        adapt_trl_factory(RewardFuncEnv, rows=rows(1))
    with pytest.raises(EnvLoadError, match=r"needs rows: TRL factory classes build no dataset"):
        adapt_trl_factory(NumberGuessEnv)
    with pytest.raises(EnvLoadError, match="dict of factories"):
        TRLFactoryEnv({"guess": NumberGuessEnv}, rows=rows(1))

    class Undocumented(NumberGuessEnv):
        def peek(self, hint):
            return self.secret

    with pytest.raises(EnvLoadError, match=r"Undocumented.peek is public, so TRL offers it as a tool, but its "
                                           r"schema cannot be made"):
        adapt_trl_factory(Undocumented, rows=rows(1))
    with pytest.raises(EnvLoadError, match=r"row 0: NumberGuessEnv.reset\(\*\*row\) raised KeyError: 'secret'"):
        adapt_trl_factory(NumberGuessEnv, rows=[{"prompt": "no secret column"}])


def test_a_reset_string_that_changes_for_the_same_row_fails_its_episode():
    RandomResetEnv.calls = 0
    env = adapt_trl_factory(RandomResetEnv, rows=rows(1))
    (episode,) = play(env, build_rows(env, None), scripted("hi"))
    assert episode.score == 0.0
    assert episode.error.startswith("RandomResetEnv.reset raised ValueError: returned ' Round 2.', not the ' Round 1.'")


def test_the_adapter_loads_from_the_command_line_by_module_and_class(monkeypatch):
    from typer.testing import CliRunner

    from aitrain_grpo.commands.cli import app

    monkeypatch.chdir(REPO / "tests")
    config = json.dumps({"env_class": "test_adapter_trl_factory:NumberGuessEnv",
                         "rows": "test_adapter_trl_factory:rows", "max_turns": 4})
    result = CliRunner().invoke(app, ["env", "check", "--rl-env-module", "aitrain_grpo.env.adapters.trl_factory",
                                      "--rl-env-class", "TRLFactoryEnv", "--rl-env-config", config,
                                      "--policies", "empty", "--episodes", "2"])
    assert result.exit_code == 0, result.output
    assert "guess(number)" in result.output and "is_even()" in result.output


def test_two_grpo_steps_train_the_tiny_model_through_the_adapter(tiny_model_dir, tmp_path):
    from aitrain_grpo import RunConfig, train

    env = adapt_trl_factory(NumberGuessEnv, rows=rows(4), max_turns=2)
    out = tmp_path / "run"
    summary = train(RunConfig(model=tiny_model_dir, output_dir=str(out), max_steps=2, rl_max_new_tokens=16,
                              log_episodes_every=1, log_episodes_count=8), env=env)
    assert summary["global_step"] == 2
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["env/errors"] == 0 for m in metrics)
    assert all("env/trl_reward" in m for m in metrics)
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert any("The number is between 1 and 10." in json.dumps(e) for e in episodes)  # reset's string was shown
    recorded = json.loads((out / "run_config.json").read_text())
    assert recorded["rl_env_module"] == "aitrain_grpo.env.adapters.trl_factory"
    assert recorded["rl_env_config"]["env_class"] == "test_adapter_trl_factory:NumberGuessEnv"
