"""verifiers environments through `--rl-env verifiers:...`: environments written with verifiers' own classic
classes (tests/envs_fixtures/verifiers_envs.py: SingleTurnEnv, a MultiTurnEnv subclass, a ToolEnv), played
by verifiers' own rollout code against the run's endpoint and scored by their own rubrics. Nothing of
verifiers, openai or transformers is mocked; no data set comes from a hub."""

from __future__ import annotations

import re
import sys

import pytest

from helpers import require  # noqa: E402

require("verifiers.legacy", "see .ci/run (verifiers 0.3.1 beside mcp 2)")

from aitrain_grpo.engine.backends.hf import HFBackend  # noqa: E402
from aitrain_grpo.engine.rollout import RolloutEngine  # noqa: E402
from aitrain_grpo.engine.settings import EpisodeSettings  # noqa: E402
from aitrain_grpo.engine.runner import play  # noqa: E402
from aitrain_grpo.env.adapters.verifiers import VerifiersEnv  # noqa: E402
from aitrain_grpo.env.loading import load_environment  # noqa: E402
from aitrain_grpo.env_spec import environment_of  # noqa: E402
from aitrain_grpo.errors import EnvLoadError  # noqa: E402

FIXTURES = "envs_fixtures.verifiers_envs"


def env_of(name: str, **env_args) -> VerifiersEnv:
    return VerifiersEnv(f"{FIXTURES}:{name}", env_args=env_args)


def guess_by_halves(episode) -> str:
    """The countdown expert: bisect 1..9 on the environment's 'lower'/'higher' replies."""
    low, high, last = 1, 9, None
    for message in episode.messages:
        if message["role"] == "assistant":
            last = int(message["content"])
        elif message["role"] == "user" and last is not None:
            low, high = (low, last - 1) if "lower" in message["content"] else (last + 1, high) if "higher" in message["content"] else (low, high)
    return str((low + high) // 2)


def multiply_then_answer(episode) -> str:
    results = [m["content"] for m in episode.messages if m["role"] == "tool"]
    if not results:
        a, b = map(int, re.findall(r"\d+", episode.messages[-1]["content"])[:2])
        return f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
    return f"The product is {results[-1]}."


def test_single_turn_rows_keep_verifiers_fields_and_the_rubric_decides_the_score():
    env = env_of("capitals")
    rows = env.build_dataset(None)
    assert [r["answer"] for r in rows] == ["Paris", "Lima", "Cairo", "Oslo"]
    assert rows[0]["prompt"] == [{"role": "system", "content": "You know geography."},
                                 {"role": "user", "content": "What is the capital of France? Answer with the city only."}]
    assert rows[0]["info"] == {"country": "France"} and rows[0]["example_id"] == 0
    right = play(env, rows, lambda ep: ep.row["answer"])
    assert [ep.score for ep in right] == [1.0] * 4 and all(ep.error is None for ep in right)
    assert right[0].messages[-1] == {"role": "assistant", "content": "Paris"}
    # Both reward functions show as metrics; the weight-0 one does not move the score.
    assert right[0].metrics["correct_city"] == 1.0 and right[0].metrics["brief"] == 1.0
    wrong = play(env, rows, lambda ep: "London, I believe, though I am not at all sure of it")
    assert [ep.score for ep in wrong] == [0.0] * 4 and all(ep.error is None for ep in wrong)
    assert wrong[0].metrics["correct_city"] == 0.0 and wrong[0].metrics["reward_clipped"] == 0.0
    # An empty reply ends verifiers' rollout with an EmptyModelResponseError: the model's doing, scored 0.
    empty = play(env, rows[:1], lambda ep: "")
    assert empty[0].error is None and empty[0].score == 0.0 and empty[0].metrics["empty_reply"] == 1.0


def test_a_reward_above_one_is_clipped_and_counted():
    env = env_of("capitals", size=1, weight=3.0)
    (episode,) = play(env, env.build_dataset(None), lambda ep: ep.row["answer"])
    assert episode.score == 1.0 and episode.metrics["reward_clipped"] == 1.0


def test_multi_turn_env_responses_reach_the_policy_and_its_stop_ends_the_game():
    env = env_of("countdown")
    rows = env.build_dataset(None)
    solved = play(env, rows, guess_by_halves)
    assert [ep.score for ep in solved] == [1.0, 1.0] and all(ep.error is None for ep in solved)
    said = [m["content"] for m in solved[0].messages]  # the hidden number is 3: 5, then 2, then 3
    assert said == ["Guess my number between 1 and 9.", "5", "Wrong: lower. Guess again.", "2",
                    "Wrong: higher. Guess again.", "3"]
    stuck = play(env, rows, lambda ep: "1")
    assert [ep.score for ep in stuck] == [0.0, 0.0]
    assert [ep.turns for ep in stuck] == [4, 4]  # verifiers' own max_turns ended it


def test_the_tool_env_runs_the_python_tool_the_policy_calls():
    env = env_of("calculator")
    rows = env.build_dataset(None)
    episodes = play(env, rows, multiply_then_answer)
    assert [ep.score for ep in episodes] == [1.0, 1.0] and all(ep.error is None for ep in episodes)
    tool_messages = [m for m in episodes[0].messages if m["role"] == "tool"]
    assert [(m.get("name"), m["content"]) for m in tool_messages] == [("multiply", "408")]
    assert episodes[0].state["agent_tools"][0]["function"]["name"] == "multiply"
    assert episodes[0].metrics["multiply_calls"] == 1.0
    guessed = play(env, rows, lambda ep: "It is 400.")
    assert [ep.score for ep in guessed] == [0.0, 0.0] and guessed[0].metrics["multiply_calls"] == 0.0


@pytest.mark.parametrize("name", ["capitals", "countdown", "calculator"])
def test_the_tiny_model_plays_each_environment_through_the_engine(name, tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = env_of(name)
    engine = RolloutEngine(env, tokenizer, HFBackend.for_model(model, tokenizer),
                           EpisodeSettings(max_new_tokens=8, max_completion_length=128))
    with engine:
        batch = engine.run(env.build_dataset(tokenizer)[:2])
    assert len(batch.traces) == 2
    for i, episode in enumerate(batch.episodes):
        assert episode.error is None, episode.error
        assert sum(batch.traces[i].env_mask) > 0  # the model's own tokens, to train
        assert 0.0 <= episode.score <= 1.0 and "reward_clipped" in episode.metrics


def test_the_spec_loads_a_module_function_with_its_arguments():
    module, cls, config = environment_of(f"verifiers:{FIXTURES}:capitals", None, None, '{"env_args": {"size": 2}}')
    assert (module, cls) == ("aitrain_grpo.env.adapters.verifiers", "VerifiersEnv")
    env = load_environment(module, cls, config)
    assert isinstance(env, VerifiersEnv) and [r["answer"] for r in env.build_dataset(None)] == ["Paris", "Lima"]


def test_bad_names_are_one_line_errors_naming_the_fix():
    with pytest.raises(EnvLoadError, match=r"load_environment\('no_such_vf_env'\) failed: .*vf-install no_such_vf_env"):
        VerifiersEnv("no_such_vf_env")
    with pytest.raises(EnvLoadError, match="returned dict_keys, not a verifiers Environment"):
        VerifiersEnv(f"{FIXTURES}:CAPITALS.keys")  # a function, returning something else
    with pytest.raises(EnvLoadError, match="split must be one of train, eval, got 'test'"):
        VerifiersEnv(f"{FIXTURES}:capitals", split="test")


def test_a_missing_package_names_the_install_command(monkeypatch):
    for name in [m for m in sys.modules if m == "verifiers" or m.startswith("verifiers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "verifiers", None)  # `import verifiers` now raises ImportError
    with pytest.raises(EnvLoadError) as missing:
        VerifiersEnv(f"{FIXTURES}:capitals")
    assert str(missing.value) == ("verifiers environments need the verifiers package; install it with "
                                  "pip install 'aitrain-grpo[verifiers]'")


def test_a_verifiers_without_the_classic_api_is_refused_in_one_line(monkeypatch):
    import verifiers

    monkeypatch.setitem(sys.modules, "verifiers.legacy", None)  # as verifiers 0.4.0: only verifiers.v1
    with pytest.raises(EnvLoadError, match=rf"verifiers {re.escape(verifiers.__version__)} has no classic API .*"
                                           r"install it with pip install 'aitrain-grpo\[verifiers\]'$"):
        VerifiersEnv(f"{FIXTURES}:capitals")
