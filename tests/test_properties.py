"""Property tests: whatever text a model writes or a user passes, the parsers answer with a result or
their documented error, and never raise anything else.

- the tool-call parser: (calls, problems), every call a name and an object of arguments;
- argument validation and running a tool call: a message for the model, never an exception;
- the run config loader (`--config` files, then `validate()`): options, or `ConfigError`;
- the environment config parser (`--rl-env-config`): a dict, or `EnvLoadError`.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aitrain_grpo import ToolEnvironment, tool
from aitrain_grpo.engine.tool_parsers import parse_tool_calls
from aitrain_grpo.config import ConfigError, RunConfig
from aitrain_grpo.env.tools import tool_spec, validate_arguments
from aitrain_grpo.env.loading import EnvLoadError, parse_config_json

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Pieces a model's turn is made of, so generated text hits the tag and JSON paths, not only noise.
fragments = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"name"', '"arguments"', ":", ",", "\\", '"']),
    json_values.map(json.dumps),
    st.builds(lambda name, args: json.dumps({"name": name, "arguments": args}), st.text(max_size=10), json_values),
)
model_turns = st.lists(fragments, max_size=12).map("".join)


class Lookup(ToolEnvironment):
    def build_dataset(self, tokenizer):
        return []

    def score_episode(self, episode):
        return 0.0

    @tool
    def lookup(self, key: str, limit: int = 3, exact: bool = False) -> str:
        """Look a key up.

        Args:
            key: The key.
            limit: How many results.
            exact: Exact matches only.
        """
        if key == "boom":
            raise RuntimeError("down")
        return key[:limit]


@SETTINGS
@given(model_turns)
def test_tool_call_parser_never_raises(text):
    calls, problems = parse_tool_calls(text)
    for call in calls:
        assert isinstance(call["name"], str) and call["name"] and isinstance(call["arguments"], dict)
    assert all(isinstance(p, str) and p for p in problems)
    if "<tool_call>" not in text:
        assert calls == [] and problems == []


finite_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@SETTINGS
@given(st.text(max_size=10), finite_json_values.filter(lambda v: not isinstance(v, str)))
def test_a_well_formed_call_is_parsed_back_exactly(name, arguments):
    # (String arguments are read as double-encoded JSON; tests/test_contract.py covers that.)
    text = "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
    calls, problems = parse_tool_calls(text)
    if name and isinstance(arguments, dict):
        assert calls == [{"name": name, "arguments": arguments}] and problems == []
    else:
        assert calls == [] and len(problems) == 1


@SETTINGS
@given(json_values)
def test_argument_validation_never_raises(arguments):
    problem = validate_arguments(tool_spec(Lookup().lookup), arguments)
    assert problem is None or isinstance(problem, str)
    if problem is None:  # what passes is what the schema promises the tool
        assert isinstance(arguments["key"], str)


@SETTINGS
@given(st.one_of(st.text(max_size=10), json_values), json_values)
def test_running_any_call_gives_the_model_a_message(name, arguments):
    from aitrain_grpo.env.base import Episode

    episode = Episode(row={}, messages=[])
    message = asyncio.run(Lookup().run_tool_call(episode, {"name": name, "arguments": arguments}))
    assert message["role"] == "tool" and isinstance(message["content"], str)


# Path-like text, long enough to pass the file-name limit, with prefixes that mean something to paths.
paths = st.builds(
    lambda prefix, rest: prefix + rest,
    st.sampled_from(["", "./", "/", "~/", "~nobody-here/", "@", "@~nobody-here/", "outputs/"]),
    st.text(max_size=20) | st.text(alphabet="ab", min_size=256, max_size=300),
)
options = st.dictionaries(
    st.sampled_from(RunConfig.field_names() + ["batch-size", "rl-env-module", "not_an_option"]),
    json_values | paths, max_size=6,
)
path_options = st.fixed_dictionaries({}, optional={name: paths for name in ("model", "output_dir", "resume_from_checkpoint")})


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("configs")


def load_run_config(path) -> None:
    try:
        RunConfig(**RunConfig.from_file(path)).validate()
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc)


@SETTINGS
@given(st.text(max_size=200), st.sampled_from([".yaml", ".json", ".yml"]))
def test_config_loader_never_raises_on_any_text(config_dir, text, suffix):
    path = config_dir / f"run{suffix}"
    path.write_text(text, encoding="utf-8")
    load_run_config(path)


@SETTINGS
@given(options, path_options, st.booleans())
def test_config_loader_never_raises_on_any_options(config_dir, values, path_values, as_yaml):
    base = {"rl_env_module": "envs.letters", "rl_env_class": "LetterEnv"}
    path = config_dir / ("run.yaml" if as_yaml else "run.json")
    data = {**base, **values, **path_values}
    path.write_text(yaml.safe_dump(data) if as_yaml else json.dumps(data))
    load_run_config(path)


@SETTINGS
@given(st.one_of(st.text(max_size=100), json_values.map(json.dumps), paths.map(lambda t: "@" + t)))
def test_env_config_parser_never_raises(text):
    try:
        value = parse_config_json(text)
    except EnvLoadError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert isinstance(value, dict)
