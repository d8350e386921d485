"""Tool calls in the forms real models write (`--rl-tool-parser`): each form read from a real model's
kind of output, prose left as prose, malformed calls answered with an error, nothing ever evaluated,
and the forms reaching the environment, the metrics and `env check` the way the Hermes form does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aitrain_grpo.config import TOOL_PARSERS
from aitrain_grpo.engine.runner import play
from aitrain_grpo.engine.stats import episode_stats
from aitrain_grpo.engine.tool_parsers import FORMS, read_tool_calls
from envs.weather import WeatherEnv

TOOLS = ["get_temperature"]
LISBON = {"name": "get_temperature", "arguments": {"city": "Lisbon"}}

# One turn per form, as models write them (the first is Qwen2.5-Coder-0.5B-Instruct's greedy answer to the
# weather question, special token included; the others follow each family's documented format).
TRANSCRIPTS = {
    "json": '{"name": "get_temperature", "arguments": {"city": "Lisbon"}}<|im_end|>',
    "json-block": 'Sure.\n```json\n{"name": "get_temperature", "arguments": {"city": "Lisbon"}}\n```',
    "llama3_json": '<|python_tag|>{"name": "get_temperature", "parameters": {"city": "Lisbon"}}',
    "mistral": '[TOOL_CALLS] [{"name": "get_temperature", "arguments": {"city": "Lisbon"}}]',
    "mistral-named": '[TOOL_CALLS]get_temperature[ARGS]{"city": "Lisbon"}',
    "pythonic": '[get_temperature(city="Lisbon")]',
    "hermes": '<tool_call>\n{"name": "get_temperature", "arguments": {"city": "Lisbon"}}\n</tool_call>',
}


@pytest.mark.parametrize("label, text", TRANSCRIPTS.items())
def test_each_form_is_read_by_auto_and_by_its_own_parser(label, text):
    form = label.split("-")[0]
    for parser in ("auto", form):
        parsed = read_tool_calls(text, parser, TOOLS)
        assert parsed.calls == [LISBON], (parser, parsed)
        assert parsed.problems == [] and parsed.form == form


def test_config_offers_every_form():
    assert TOOL_PARSERS == ("auto", *FORMS)


@pytest.mark.parametrize("text", [
    'The user object is {"name": "Ana", "arguments": {"age": 3}}.',  # JSON inside prose
    '{"name": "Ana", "arguments": {}}',  # a bare object that names no tool of the environment
    '[print(city="Lisbon")]',  # pythonic, but not a tool
    "It is 21 degrees in Lisbon.",
    '[1, 2, 3]',
])
def test_prose_stays_prose_under_auto(text):
    assert read_tool_calls(text, "auto", TOOLS) == ([], [], None)


def test_several_calls_in_one_turn():
    text = '<|python_tag|>{"name": "get_temperature", "parameters": {"city": "Oslo"}}; ' \
           '{"name": "get_temperature", "parameters": {"city": "Rome"}}'
    assert [c["arguments"]["city"] for c in read_tool_calls(text, "auto", TOOLS).calls] == ["Oslo", "Rome"]
    text = '[get_temperature(city="Oslo"), get_temperature(city="Rome")]'
    assert len(read_tool_calls(text, "pythonic", TOOLS).calls) == 2


def test_pythonic_calls_are_read_never_run(tmp_path):
    marker = tmp_path / "ran"
    text = f'[__import__("os").system("touch {marker}")]'
    parsed = read_tool_calls(text, "pythonic", TOOLS)
    assert parsed.calls == [] and "not a plain function name" in parsed.problems[0]
    parsed = read_tool_calls(f'[get_temperature(city=open("{marker}", "w"))]', "pythonic", TOOLS)
    assert parsed.calls == [] and "not a literal" in parsed.problems[0]
    assert not marker.exists()


@pytest.mark.parametrize("parser, text, problem", [
    ("hermes", "<tool_call>{bad json</tool_call>", "not valid JSON"),
    ("mistral", "[TOOL_CALLS] [{bad", "not valid JSON"),
    ("llama3_json", '<|python_tag|>{"parameters": {}}', 'no "name"'),
    ("pythonic", '[get_temperature("Lisbon")]', "by position"),
])
def test_a_malformed_call_is_a_problem_the_model_is_told_about(parser, text, problem):
    parsed = read_tool_calls(text, parser, TOOLS)
    assert parsed.calls == [] and problem in parsed.problems[0]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from(TOOL_PARSERS))
def test_no_parser_raises_on_any_text(text, parser):
    parsed = read_tool_calls(text, parser, TOOLS)
    assert isinstance(parsed.calls, list) and isinstance(parsed.problems, list)


def form_policy(form: str):
    """WeatherEnv's oracle, with its call written in `form` instead of Hermes."""
    env = WeatherEnv(seed=0)

    def policy(episode):
        text = env.solve(episode)
        if "<tool_call>" not in text:
            return text
        call = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])
        city = call["arguments"]["city"]
        return {
            "hermes": text,
            "json": json.dumps(call),
            "pythonic": f'[get_temperature(city="{city}")]',
            "mistral": f"[TOOL_CALLS] [{json.dumps(call)}]",
        }[form]

    return env, policy


@pytest.mark.parametrize("form", ["json", "pythonic", "mistral"])
def test_an_episode_with_another_form_scores_like_hermes(form):
    env, hermes = form_policy("hermes")
    rows = env.build_dataset(None)[:8]
    expected = [ep.score for ep in play(env, rows, hermes)]
    env, policy = form_policy(form)
    episodes = play(env, rows, policy)
    assert [ep.score for ep in episodes] == expected and min(expected) == 1.0
    assert episodes[0].tool_call_forms == [form, None]
    metrics = episode_stats(episodes).env_metrics()
    assert metrics[f"tools/format/{form}"] == 8.0 and "tools/format/hermes" not in metrics
    # Told to read only Hermes blocks, the same turns are prose: no call, a low score.
    hermes_only = play(env, rows, policy, tool_parser="hermes")
    assert max(ep.score for ep in hermes_only) < 0.5


@pytest.mark.integration
def test_env_check_says_which_parser_read_the_models_calls():
    from helpers import run_cli

    result = run_cli("env", "check", "--rl-env-module", "envs.weather", "--rl-env-class", "WeatherEnv",
                     "--policies", "model", "--episodes", "2", "--rl-max-new-tokens", "24", "--rl-tool-parser", "json")
    assert result.returncode in (0, 1), result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("tool calls read with"))
    assert line.startswith("tool calls read with --rl-tool-parser json; the model wrote ")
    assert "no tool call in 2 episodes" in line or " form" in line
