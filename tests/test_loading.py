"""Loading environments by module path: the happy paths, and the one-line message for each mistake."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from aitrain_grpo.env.base import Environment
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import load_environment, parse_config_json
from aitrain_grpo.errors import EnvLoadError
from helpers import FIXTURES_DIR, one_line

pytestmark = pytest.mark.usefixtures("isolated_imports")


def load_error(*args, **kwargs) -> str:
    """The message of the EnvLoadError that load_environment raises, checked to be one line."""
    with pytest.raises(EnvLoadError) as info:
        load_environment(*args, **kwargs)
    return one_line(info)


def write_package(root: Path, package: str, files: dict[str, str]) -> None:
    folder = root / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    for name, source in files.items():
        (folder / name).write_text(textwrap.dedent(source))


# ----------------------------------------------------------------------------------- happy paths


def test_json_string_config_becomes_keyword_arguments():
    env = load_environment("envs_fixtures.good", "GoodEnv", '{"num_tasks": 3, "seed": 7, "prefix": "Q"}')
    assert (env.num_tasks, env.seed, env.prefix) == (3, 7, "Q")
    assert isinstance(env, Environment)


def test_config_from_at_file(tmp_path):
    path = tmp_path / "env.json"
    path.write_text(json.dumps({"num_tasks": 5}))
    env = load_environment("envs_fixtures.good", "GoodEnv", f"@{path}")
    assert env.num_tasks == 5 and env.seed == 0


def test_config_from_relative_at_file_resolves_from_cwd(tmp_path, monkeypatch):
    (tmp_path / "cfg.json").write_text('{"num_tasks": 2}')
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(FIXTURES_DIR.parent))
    assert load_environment("envs_fixtures.good", "GoodEnv", "@cfg.json").num_tasks == 2


def test_config_as_dict_is_not_mutated():
    config = {"num_tasks": 4}
    env = load_environment("envs_fixtures.good", "GoodEnv", config)
    assert env.num_tasks == 4 and config == {"num_tasks": 4}


@pytest.mark.parametrize("config", [None, "", "   "])
def test_empty_config_means_no_arguments(config):
    assert load_environment("envs_fixtures.duck", "DuckEnv", config).size == 2


def test_module_resolves_from_the_current_directory_first(tmp_path, monkeypatch):
    # `envs` is also the name of the library's example package: the user's own folder must win.
    write_package(tmp_path, "envs", {"hotel.py": """
        from aitrain_grpo import env as base

        class HotelEnv(base.Environment):
            def __init__(self, rooms: int = 1):
                self.rooms = rooms
            def build_dataset(self, tokenizer):
                return [{"prompt": "Book a room."}]
            def score_episode(self, episode):
                return 1.0
    """})
    monkeypatch.chdir(tmp_path)
    env = load_environment("envs.hotel", "HotelEnv", '{"rooms": 3}')
    assert env.rooms == 3
    assert Path(sys.modules["envs.hotel"].__file__).parent == tmp_path / "envs"
    assert sys.path[0] == str(tmp_path)


def test_async_methods_are_allowed_and_var_keyword_accepts_any_key():
    env = load_environment("envs_fixtures.async_env", "AsyncEnv", '{"anything": [1, 2]}')
    assert env.options == {"anything": [1, 2]}
    assert build_rows(env, tokenizer=None) == [{"prompt": "Say hi."}]


def test_duck_typed_class_without_the_base_class_is_accepted():
    env = load_environment("envs_fixtures.duck", "DuckEnv", '{"size": 3}')
    assert len(build_rows(env, tokenizer=None)) == 3


# ------------------------------------------------------------------------------- module errors


def test_missing_top_level_module_names_it_and_the_cwd():
    message = load_error("no_such_envs_pkg.hotel", "HotelEnv")
    assert "'no_such_envs_pkg.hotel' not found" in message
    assert "'no_such_envs_pkg'" in message and str(FIXTURES_DIR.parent) in message


def test_missing_submodule_lists_siblings_and_suggests_closest():
    message = load_error("envs_fixtures.godo", "GoodEnv")
    assert "package 'envs_fixtures'" in message and "no module 'godo'" in message
    assert str(FIXTURES_DIR) in message  # where that package was found
    assert message.endswith("did you mean 'envs_fixtures.good'?")


def test_class_name_inside_module_path_is_pointed_out():
    message = load_error("envs_fixtures.good.GoodEnv", "GoodEnv")
    assert "'envs_fixtures.good' is a module, not a package" in message
    assert message.endswith("pass module 'envs_fixtures.good' and class 'GoodEnv'")


def test_file_path_instead_of_module_suggests_dotted_name():
    message = load_error("envs_fixtures/good.py", "GoodEnv")
    assert "not a file path" in message and "use 'envs_fixtures.good'" in message


@pytest.mark.parametrize("module", ["", ".good"])
def test_empty_or_relative_module_is_rejected(module):
    assert "envs.hotel" in load_error(module, "GoodEnv")


def test_failed_import_inside_module_names_the_import_and_the_file():
    message = load_error("envs_fixtures.broken_import", "BrokenEnv")
    assert message.startswith("module 'envs_fixtures.broken_import' failed to import: "
                              "No module named 'nonexistent_pkg_for_aitrain_tests'")
    assert f"(imported from {FIXTURES_DIR / 'broken_import.py'}:3)" in message
    assert message.endswith("install it or fix the import")


def test_import_of_missing_name_is_reported_with_file():
    message = load_error("envs_fixtures.bad_name_import", "X")
    assert "cannot import name 'no_such_function'" in message
    assert str(FIXTURES_DIR / "bad_name_import.py") in message


def test_syntax_error_reports_file_and_line(tmp_path, monkeypatch):
    # Written at test time: a broken .py file in the repository would trip linters and compileall.
    write_package(tmp_path, "proj_envs", {"syntax_error.py": """
        from aitrain_grpo.env.base import Environment

        class Env(Environment)
            pass
    """})
    monkeypatch.chdir(tmp_path)
    message = load_error("proj_envs.syntax_error", "Env")
    assert "has a syntax error at" in message
    assert f"{tmp_path / 'proj_envs' / 'syntax_error.py'}:4" in message
    assert message.endswith("fix the code there")


def test_exception_at_import_gives_type_message_and_location():
    message = load_error("envs_fixtures.raises_at_import", "X")
    assert "raised RuntimeError: database not reachable: retry later while importing" in message
    assert f"{FIXTURES_DIR / 'raises_at_import.py'}:3" in message


# -------------------------------------------------------------------------------- class errors


def test_missing_class_lists_defined_classes_and_suggests_closest():
    message = load_error("envs_fixtures.good", "GodEnv", '{"num_tasks": 1}')
    assert "has no class 'GodEnv'" in message
    assert "classes defined there: GoodEnv, Helper;" in message  # imported Environment/Episode not listed
    assert message.endswith("did you mean 'GoodEnv'?")


def test_missing_class_suggestion_ignores_case():
    assert load_error("envs_fixtures.good", "goodenv").endswith("did you mean 'GoodEnv'?")


def test_function_is_not_a_class():
    message = load_error("envs_fixtures.good", "make_env")
    assert "envs_fixtures.good.make_env is a function, not a class" in message and "GoodEnv" in message


def test_instance_is_not_a_class_and_names_its_class():
    message = load_error("envs_fixtures.good", "default_env")
    assert "is an instance of GoodEnv, not a class" in message and "'GoodEnv'" in message


@pytest.mark.parametrize("cls, missing", [("Helper", "build_dataset, score_episode"),
                                          ("NotAnEnv", "score_episode")])
def test_class_without_required_methods_is_not_an_environment(cls, missing):
    module = "envs_fixtures.good" if cls == "Helper" else "envs_fixtures.duck"
    message = load_error(module, cls)
    assert f"class {cls} in '{module}' is not an environment: it has no {missing};" in message
    assert "subclass aitrain_grpo.Environment" in message


@pytest.mark.parametrize("cls, missing", [("NoScoreEnv", "score_episode"), ("NoDatasetToolEnv", "build_dataset")])
def test_subclass_that_keeps_the_base_placeholder_names_the_method(cls, missing):
    message = load_error("envs_fixtures.no_score", cls)
    assert f"class {cls} in 'envs_fixtures.no_score' does not implement {missing};" in message


AGENT_CODE = """
    from aitrain_grpo import Environment

    class Agent:
        def build_dataset(self, tokenizer):
            return [{"prompt": "hi"}]

        async def rollout(self, client, row):
            return 1.0

    class AgentOnEnvironment(Environment):
        async def rollout(self, client, row):
            return 1.0
    """


@pytest.mark.parametrize("cls", ["Agent", "AgentOnEnvironment"])
def test_agent_code_outside_agent_environment_is_told_to_subclass_it(tmp_path, monkeypatch, cls):
    write_package(tmp_path, "proj_envs", {"agent.py": AGENT_CODE})
    monkeypatch.chdir(tmp_path)
    message = load_error("proj_envs.agent", cls)
    assert f"class {cls} in 'proj_envs.agent' has rollout but is not an AgentEnvironment" in message
    assert "subclass aitrain_grpo.AgentEnvironment" in message


def test_as_environment_wraps_aitraining_instances_only():
    from aitrain_grpo.env.loading import as_environment, describe_interface

    class AITrainingStyle:
        def build_dataset(self, tokenizer):
            return [{"prompt": "hi"}]

        def score_episode(self, model, tokenizer, completion, case_idx):
            return 1.0

    ours = load_environment("envs_fixtures.good", "GoodEnv", {"num_tasks": 2})
    assert as_environment(ours) is ours
    wrapped = as_environment(AITrainingStyle())
    assert isinstance(wrapped, Environment) and type(wrapped).__name__ == "AITrainingStyle"
    assert as_environment(wrapped) is wrapped
    assert describe_interface(wrapped).startswith("AITraining interface")
    assert describe_interface(ours).startswith("aitrain-grpo interface")


def test_has_solve_is_an_override_or_a_duck_typed_method():
    from aitrain_grpo.env.base import has_solve

    class Plain(Environment):
        pass

    class Oracle(Environment):
        def solve(self, episode):
            return "x"

    class Duck:
        def solve(self, episode):
            return "x"

    assert [has_solve(e) for e in (Plain(), Oracle(), Duck(), object())] == [False, True, True, False]


def test_abstract_class_names_unimplemented_methods():
    message = load_error("envs_fixtures.duck", "AbstractEnv")
    assert "is abstract (unimplemented: grade)" in message


# ------------------------------------------------------------------------------- config errors


def test_invalid_json_gives_line_column_and_shell_quoting_hint():
    message = load_error("envs_fixtures.good", "GoodEnv", "{num_tasks: 3}")
    assert "--rl-env-config is not valid JSON" in message and "line 1, column 2" in message
    assert "'{num_tasks: 3}'" in message  # what actually arrived after the shell
    assert "double quotes" in message and "single quotes" in message


def test_invalid_json_file_gives_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "num_tasks": 3,\n  "seed": 1,\n}\n')
    message = load_error("envs_fixtures.good", "GoodEnv", f"@{path}")
    assert f"config file '{path}' is not valid JSON" in message and "line 4, column 1" in message


def test_missing_config_file_names_the_path(tmp_path):
    message = load_error("envs_fixtures.good", "GoodEnv", f"@{tmp_path / 'nope.json'}")
    assert f"'{tmp_path / 'nope.json'}' not found" in message


@pytest.mark.parametrize("text, kind", [("[1, 2]", "an array"), ("3", "a number"), ('"x"', "a string"),
                                        ("null", "null")])
def test_json_that_is_not_an_object_says_what_it_was(text, kind):
    message = load_error("envs_fixtures.good", "GoodEnv", text)
    assert f"must be a JSON object of keyword arguments, got {kind}" in message


def test_unknown_key_lists_accepted_keywords_and_suggests():
    message = load_error("envs_fixtures.good", "GoodEnv", '{"num_task": 3}')
    assert "GoodEnv does not accept config key(s) 'num_task'" in message
    assert "accepted keywords: num_tasks, seed, prefix" in message
    assert message.endswith("did you mean 'num_tasks'?")


def test_unknown_key_for_constructor_without_arguments():
    message = load_error("envs_fixtures.duck", "NoKeywordsEnv", '{"x": 1}')
    assert "NoKeywordsEnv takes no config keywords but the config has 'x'" in message


def test_missing_required_argument_is_named():
    message = load_error("envs_fixtures.good", "GoodEnv", "{}")
    assert "GoodEnv requires config key(s) 'num_tasks'" in message and '"num_tasks": ...' in message


def test_constructor_exception_is_one_line_with_type_and_location():
    message = load_error("envs_fixtures.ctor_raises", "CtorRaisesEnv", '{"num_tasks": 0}')
    assert message.startswith("CtorRaisesEnv(**config) raised ValueError: num_tasks must be positive, got 0")
    assert f"{FIXTURES_DIR / 'ctor_raises.py'}:9" in message


def test_parse_config_json_rejects_non_string_keys_and_other_types():
    assert parse_config_json('{"a": 1}') == {"a": 1}
    with pytest.raises(EnvLoadError, match="keys must be strings"):
        parse_config_json({1: 2})
    with pytest.raises(EnvLoadError, match="got list"):
        parse_config_json([("a", 1)])


@pytest.mark.parametrize(
    "tool_source, expected",
    [
        ("""
            @tool
            def book(self, when: tuple[str]) -> str:
                \"\"\"Book a stay.

                Args:
                    when: The dates.
                \"\"\"
         """, "tool ToolEnv.book: a type hint has no JSON schema"),
    ],
)
def test_a_tool_without_a_schema_is_a_load_error_naming_the_tool(tmp_path, monkeypatch, tool_source, expected):
    source = """
        from aitrain_grpo import ToolEnvironment, tool

        class ToolEnv(ToolEnvironment):
            def build_dataset(self, tokenizer):
                return [{"prompt": "hi"}]

            def score_episode(self, episode):
                return 0.0
    """ + textwrap.indent(textwrap.dedent(tool_source), " " * 12)
    write_package(tmp_path, "proj_envs", {"tools_env.py": source})
    monkeypatch.chdir(tmp_path)
    message = load_error("proj_envs.tools_env", "ToolEnv")
    assert message.startswith(expected), message


def test_a_tool_with_an_undocumented_parameter_or_no_docstring_still_loads(tmp_path, monkeypatch):
    # transformers' get_json_schema refuses both; tools written that way worked before it was used.
    source = """
        from aitrain_grpo import ToolEnvironment, tool

        class ToolEnv(ToolEnvironment):
            @tool
            def book(self, hotel_id: str, nights: int) -> str:
                \"\"\"Book a stay.

                Args:
                    hotel_id: The hotel.
                \"\"\"

            @tool
            def cancel(self, booking: str):
                pass

            def build_dataset(self, tokenizer):
                return [{"prompt": "hi"}]

            def score_episode(self, episode):
                return 0.0
    """
    write_package(tmp_path, "proj_envs", {"tools_env.py": source})
    monkeypatch.chdir(tmp_path)
    env = load_environment("proj_envs.tools_env", "ToolEnv")
    book, cancel = (spec["function"] for spec in env.tools)
    assert book["description"] == "Book a stay."
    assert book["parameters"]["properties"] == {"hotel_id": {"type": "string", "description": "The hotel."},
                                                "nights": {"type": "integer"}}
    assert cancel["description"] == "" and cancel["parameters"]["properties"] == {"booking": {"type": "string"}}
