"""An environment author's mistakes and surprises (tests/envs_fixtures/authoring.py), each answered where it
is made: tools that are not schemas refused as the environment loads (they crashed env check after every
episode, or trained without a word), a duck-typed class without the optional methods played (tracebacks),
a reset that raises the turn cap held to the run's, rows played as training stores them and each episode
with its own copy, and metrics named like the engine's kept beside its own rather than over them."""

from __future__ import annotations

import json
import math

import pytest

from aitrain_grpo.engine.runner import play
from aitrain_grpo.engine.stats import episode_stats
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import as_environment
from aitrain_grpo.errors import EnvLoadError
from envs_fixtures import authoring
from helpers import REPO, in_process_cli

AUTHORING = ["--rl-env-module", "envs_fixtures.authoring"]


@pytest.fixture
def aitrain(monkeypatch):
    return in_process_cli(monkeypatch, REPO / "tests")


@pytest.mark.parametrize("env_class, message", [
    ("FunctionTools", "FunctionTools.tools[0] is a function, not a tool schema like {\"type\": \"function\""),
    ("OneSchemaTools", "OneSchemaTools.tools is a dict; it must be a list of tool schemas"),
    ("MethodTools", "MethodTools.tools is a method; make it a @property, or a list attribute of tool schemas"),
    ("NamelessTools", "NamelessTools.tools[0] has no function name; give it one"),
    ("TwiceNamedTools", "TwiceNamedTools.tools[0] and [1] are both named 'add'; give each tool its own name"),
    ("TwoToolsOneName", "TwoToolsOneName has two tools named 'add' (add_ints and add_floats); give each @tool its own"),
])
def test_tools_that_are_not_schemas_are_refused_as_the_environment_loads(env_class, message, aitrain):
    result = aitrain("env", "check", *AUTHORING, "--rl-env-class", env_class, "--policies", "empty", "--episodes", "1")
    last = result.stderr.strip().splitlines()[-1]
    assert result.exit_code == 2 and last.startswith("error: ") and message in last, result.stderr
    if env_class != "TwoToolsOneName":  # an instance handed in from Python is checked the same way
        with pytest.raises(EnvLoadError, match="tools"):
            as_environment(getattr(authoring, env_class)())


def test_a_tool_environment_without_marked_tools_is_a_warning(aitrain):
    result = aitrain("env", "check", *AUTHORING, "--rl-env-class", "UnmarkedTools", "--policies", "empty",
                     "--episodes", "2")
    assert result.exit_code == 0, result.stderr
    assert ("warning: UnmarkedTools is a ToolEnvironment with no tools: the model is offered none; mark each tool "
            "method with @tool (e.g. add)") in result.output


def test_a_duck_typed_class_without_the_optional_methods_checks_and_trains(aitrain, tmp_path):
    # It has no tools, reset or step: env check said "DuckNoExtras.tools raised AttributeError", grpo crashed.
    check = aitrain("env", "check", *AUTHORING, "--rl-env-class", "DuckNoExtras", "--policies", "empty",
                    "--episodes", "2")
    assert check.exit_code == 0 and "env check passed" in check.stdout, check.stderr
    run = aitrain("grpo", *AUTHORING, "--rl-env-class", "DuckNoExtras", "--max-steps", "1", "--batch-size", "4",
                  "--rl-num-generations", "2", "--rl-max-new-tokens", "4", "--output-dir", tmp_path / "run")
    assert run.exit_code == 0, (run.stderr, run.exception)
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["rl_env_class"] == "DuckNoExtras"


def test_reset_may_lower_the_turn_cap_but_not_raise_it_past_the_runs(aitrain):
    rows = build_rows(authoring.RaisesTurnCap(), None)
    assert {ep.turns for ep in play(authoring.RaisesTurnCap(), rows, lambda ep: "x", max_turns=2)} == {2}
    assert {ep.turns for ep in play(authoring.RaisesTurnCap(), rows, lambda ep: "x")} == {3}  # the class's cap
    text = play(authoring.TextTurnCap(), rows, lambda ep: "x")
    assert {ep.error for ep in text} == {"TextTurnCap.reset set episode.max_turns to '2'; set an integer from 1 to 3 "
                                         "(the run's cap), or leave it as it is"}


def test_each_episode_plays_its_own_copy_of_the_row(aitrain):
    # env check plays every policy on the same rows: a reset that edited its row leaked into the next policy.
    env = authoring.RowChanger()
    rows = build_rows(env, None)
    for _ in range(2):
        assert [ep.state["tags"] for ep in play(env, rows, lambda ep: "x")] == [["a", "seen"], ["b", "seen"]]
    assert [row["tags"] for row in rows] == [["a"], ["b"]]


def test_env_check_plays_the_rows_as_training_stores_them(aitrain):
    # A set comes back a list and 1 beside 2.5 a float, in training; env check passed the originals and
    # the run then failed in score_episode.
    assert build_rows(authoring.ArrowTypedRows(), None)[0] == {"prompt": "Say 1.", "tags": ["x"], "n": 1.0}
    result = aitrain("env", "check", *AUTHORING, "--rl-env-class", "ArrowTypedRows", "--policies", "empty",
                     "--episodes", "2")
    assert result.exit_code == 0 and "env check passed" in result.stdout, result.stderr


def test_metrics_named_like_the_engines_are_logged_beside_them():
    env = authoring.EngineNamedMetrics()
    episodes = play(env, build_rows(env, None), lambda ep: "x")
    logged = episode_stats(episodes).env_metrics()
    assert logged["env/errors"] == 2.0 and logged["env/score_mean"] == 0.0  # the engine's, not the environment's
    assert logged["env/metric/errors"] == 0.0 and math.isclose(logged["env/metric/score_mean"], 0.9)
    assert logged["env/guesses"] == 2.0 and logged["env/solved"] == 0.5  # its own names keep env/<name>


@pytest.mark.parametrize("env_class, says", [
    ("NoneSolve", "NoneSolve.solve returned NoneType, not the text of the next message"),  # "raised TypeError: ..."
    ("AsyncSolve", "AsyncSolve.solve is async def; make it a plain def"),  # "returned coroutine", and a warning
])
def test_a_solve_that_breaks_its_contract_is_named_for_what_it_did(env_class, says, aitrain):
    result = aitrain("env", "check", *AUTHORING, "--rl-env-class", env_class, "--policies", "oracle", "--episodes", "2")
    assert result.exit_code == 1 and says in result.output and "raised" not in result.output, result.output
