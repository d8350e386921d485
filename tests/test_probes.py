"""`aitrain env check`'s shortcut probes (aitrain_grpo/evaluation/probes.py): scripted replies an honest
score keeps low. A hackable fixture environment (tests/envs_fixtures/probe_envs.py) is flagged with a
warning naming the probe that games it; an honest one is not; every probe has its row in the table.

The probes' pieces are checked on their own first (hollowing a reply, writing a tool call each parser
reads, the thresholds), then the command in-process, as tests/test_envcheck.py runs it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from aitrain_grpo.config import TOOL_PARSERS
from aitrain_grpo.engine.tool_parsers import read_tool_calls
from aitrain_grpo.evaluation.probes import (ABOVE_EMPTY, NEAR_ORACLE, ProbeError, declared_probes, hollow,
                                            minimal_arguments, probe_warnings, write_call)
from helpers import REPO, in_process_cli, policy_row

FIXTURES = ["--rl-env-module", "envs_fixtures.probe_envs"]
PLAYED = ["--policies", "oracle,empty,probes", "--episodes", "8"]


@pytest.fixture
def aitrain(monkeypatch):
    """Run `aitrain ARGS` in-process from tests/, where the fixture environments resolve; wide enough that
    each probe's row is one line (on 80 columns a long name folds within its cell)."""
    monkeypatch.setenv("COLUMNS", "200")
    return in_process_cli(monkeypatch, REPO / "tests")


# ------------------------------------------------------------------------------------ the pieces


@pytest.mark.parametrize("reply, hollowed", [
    ("<answer>42</answer>", "<answer></answer>"),
    ("The answer is \\boxed{17}.", "\\boxed{}."),
    ('{"answer": 12, "why": "because"}', '{"answer": , "why": ""}'),
    ("Just prose, nothing else", ","),
])
def test_the_format_probe_keeps_markup_and_drops_the_substance(reply, hollowed):
    assert hollow(reply, "auto", []) == hollowed


def test_the_format_probe_keeps_a_tool_calls_name_and_empties_its_arguments():
    reply = '<tool_call>{"name": "lookup", "arguments": {"city": "Lisbon"}}</tool_call>'
    calls = read_tool_calls(hollow(reply, "auto", ["lookup"]), "auto", ["lookup"]).calls
    assert calls == [{"name": "lookup", "arguments": {}}]


@pytest.mark.parametrize("parser", TOOL_PARSERS)
def test_a_probes_tool_call_is_read_by_the_runs_parser(parser):
    text = write_call("submit", {"code": 0, "city": ""}, parser)
    assert read_tool_calls(text, parser, ["submit"]).calls == [{"name": "submit", "arguments": {"code": 0, "city": ""}}]


def test_minimal_arguments_fill_each_required_parameter_with_its_types_empty_value():
    schema = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "required": ["s", "n", "b", "unit"],
        "properties": {"s": {"type": "string"}, "n": {"type": "integer"}, "b": {"type": "boolean"},
                       "unit": {"type": "string", "enum": ["C", "F"]}, "optional": {"type": "string"}}}}}
    assert minimal_arguments(schema) == {"s": "", "n": 0, "b": False, "unit": "C"}


def test_declared_probes_take_policies_or_replies_per_turn_and_refuse_other_shapes():
    episode = SimpleNamespace(turns=1)
    env = SimpleNamespace(probes=lambda: {"two": ["first", "second"], "same": lambda ep: "x"})
    probes = declared_probes(env)
    assert probes["two"](episode) == "second" and probes["same"](episode) == "x"
    assert probes["two"](SimpleNamespace(turns=2)) == ""  # past the last reply: an empty one
    assert declared_probes(SimpleNamespace()) == {}
    for bad in (["x"], {"a b": ["x"]}, {"n": 3}, {"model": ["x"]}):
        with pytest.raises(ProbeError):
            declared_probes(SimpleNamespace(probes=lambda bad=bad: bad))


def played(name: str, mean: float):
    return SimpleNamespace(name=name, mean=mean)


def test_the_thresholds_flag_a_probe_near_the_oracle_or_clearly_above_an_empty_reply():
    oracle, empty = played("oracle", 0.6), played("empty", 0.1)
    over = played("over", 0.1 + ABOVE_EMPTY)
    near = played("near", 0.6 - NEAR_ORACLE)  # 0.4 above empty too, but named for the oracle
    low = played("low", 0.1 + ABOVE_EMPTY - 0.01)
    warnings = probe_warnings([over, near, low], played("oracle", 0.9), empty)
    assert [w.split(" probe ")[0] for w in warnings] == ["the over", "the near"]
    assert "within 0.1 of the oracle's" in probe_warnings([near], oracle, empty)[0]
    assert probe_warnings([played("zero", 0.0)], played("oracle", 0.05), played("empty", 0.0)) == []
    assert probe_warnings([over], None, None)  # without an empty reply played, the baseline is 0


# ----------------------------------------------------------------------------------- env check


def test_an_honest_environment_passes_with_every_probe_in_the_table_and_no_warning(aitrain):
    result = aitrain("env", "check", *FIXTURES, "--rl-env-class", "HonestSumEnv", *PLAYED)
    assert result.exit_code == 0, result.stdout + result.stderr
    for probe in ("echo", "repeat", "format", "always-six"):
        assert policy_row(result.stdout, probe)[:3] == ["0.000", "0.000", "0.000"], probe
    assert not any(line.startswith("│ tools ") for line in result.stdout.splitlines())  # no tools to call
    assert "under the line: shortcut probes" in result.stdout
    assert "warning:" not in result.stdout and "env check passed with 0 warning(s)" in result.stdout


@pytest.mark.parametrize("env_class, probe, why", [
    ("FormatPaysEnv", "format", "0.500 above the empty reply's 0.000"),
    ("EchoPaysEnv", "echo", "within 0.1 of the oracle's 1.000"),
    ("LengthPaysEnv", "repeat", "within 0.1 of the oracle's 1.000"),
    ("CallsPayEnv", "tools", "0.800 above the empty reply's 0.000"),
    ("MajorityEnv", "always-seven", "0.875 above the empty reply's 0.000"),  # declared by the environment
])
def test_a_hackable_environment_passes_with_a_warning_naming_the_probe(env_class, probe, why, aitrain):
    result = aitrain("env", "check", *FIXTURES, "--rl-env-class", env_class, *PLAYED)
    assert result.exit_code == 0, result.stdout + result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert any(f"the {probe} probe scores" in line and why in line for line in warnings), warnings
    assert float(policy_row(result.stdout, probe)[0]) >= ABOVE_EMPTY


def test_the_honest_tool_environment_keeps_every_tool_called_blindly_at_zero(aitrain):
    result = aitrain("env", "check", *FIXTURES, "--rl-env-class", "LookupEnv", *PLAYED)
    assert result.exit_code == 0, result.stdout + result.stderr
    tools = policy_row(result.stdout, "tools")
    assert tools[:3] == ["0.000", "0.000", "0.000"] and tools[3] == "3.00"  # lookup, submit, then an empty turn
    assert "warning:" not in result.stdout


def test_a_broken_probes_method_exits_1_naming_it(aitrain):
    result = aitrain("env", "check", *FIXTURES, "--rl-env-class", "BadProbesEnv", *PLAYED)
    assert result.exit_code == 1, result.stdout + result.stderr
    assert "error: BadProbesEnv.probes returned list" in result.stderr


def test_the_probes_are_not_played_unless_asked(aitrain):
    result = aitrain("env", "check", *FIXTURES, "--rl-env-class", "FormatPaysEnv", "--policies", "oracle,empty")
    assert result.exit_code == 0 and "shortcut probes" not in result.stdout and "format" not in result.stdout


def test_letters_declares_the_cut_turn_shortcut_and_env_check_flags_it_only_where_it_pays(monkeypatch):
    """Issue 35's shortcut: " a a a" until the turn is cut. The engine cuts the probe at --rl-max-new-tokens
    as it cuts the model; LetterEnv scores a cut turn 0, its `pay_cut_turns` variant pays for it."""
    monkeypatch.setenv("COLUMNS", "200")
    aitrain = in_process_cli(monkeypatch, REPO)
    letters = ["env", "check", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
               "--policies", "empty,probes", "--episodes", "4", "--rl-max-new-tokens", "16"]
    honest = aitrain(*letters)
    assert honest.exit_code == 0, honest.stdout + honest.stderr
    assert policy_row(honest.stdout, "fill-the-turn")[0] == "0.000"
    assert "fill-the-turn probe" not in honest.stdout
    paying = aitrain(*letters, "--rl-env-config", '{"pay_cut_turns": true}')
    assert paying.exit_code == 0, paying.stdout + paying.stderr
    assert policy_row(paying.stdout, "fill-the-turn")[0] == "0.500"
    assert "warning: the fill-the-turn probe scores 0.500" in paying.stdout
