"""No command removes or replaces what it did not create: every command that writes is pointed at an
existing file, a folder of the user's files, `.`, the run it reads and the home folder (HOME set to a
temporary folder), and must refuse with one line and exit 2, leaving every file as it was.

The commands run in-process through typer's runner (the real `aitrain` app, its own error handling);
each refusal happens before a model is loaded, so the whole file takes seconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aitrain_grpo.commands.cli import app
from helpers.cli import refused as refuses
from aitrain_grpo.outputs import publish


@pytest.fixture
def workspace(tmp_path, monkeypatch, tiny_model_dir):
    """A project folder (the current folder) holding the user's files, a finished run, and a home folder."""
    home = tmp_path / "home"
    project = home / "project"
    (project / "notes").mkdir(parents=True)
    (project / "notes" / "todo.txt").write_text("my notes\n")
    (project / "README.md").write_text("my project\n")
    (project / "old.jsonl").write_text('{"kept": true}\n')  # a user's data: a dataset, notes
    (project / "page.html").write_text("<html><title>my page</title></html>\n")
    (home / ".bashrc").write_text("export X=1\n")
    run = project / "outputs" / "run"
    shutil.copytree(tiny_model_dir, run)  # a full model folder, as a --no-peft run leaves
    (run / "run_config.json").write_text(json.dumps({"rl_env_module": "envs.letters", "rl_env_class": "LetterEnv"}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project)
    return home




EVAL = ["eval", "--model", "outputs/run", "--episodes", "1", "--output"]


@pytest.mark.parametrize("target, says", [
    ("notes", "is a folder"), (".", "the current folder"), ("outputs/run", "is a folder"),
    ("README.md", "is not a .jsonl file"), ("outputs/run/metrics.jsonl", "which this command reads"), ("~", "home"),
    ("old.jsonl", "is not a file of episodes `aitrain eval` wrote"),
])
def test_eval_output_never_replaces_what_is_not_an_episode_file(workspace, target, says):
    refuses(EVAL + [target], workspace, "--output", says)


@pytest.mark.parametrize("target, says", [
    ("notes", "is a folder"), (".", "the current folder"), ("README.md", "is not a .html"), ("~", "home"),
    ("page.html", "is not a page `aitrain report` wrote"),
])
def test_report_output_never_replaces_what_is_not_a_page(workspace, target, says):
    refuses(["report", "outputs/run", "--output", target], workspace, "--output", says)


def test_what_the_command_wrote_itself_is_replaced(workspace):
    """A page `report` wrote, or an empty file, is written again; `eval --output`'s own files likewise
    (`is_episode_records`: an episode record, not another run's metrics or a dataset)."""
    from aitrain_grpo.runlog.records import is_episode_records

    page = workspace / "project" / "mine.html"
    for _ in range(2):  # new, then over its own page
        result = CliRunner().invoke(app, ["report", "outputs/run", "--output", str(page)])
        assert result.exit_code == 0 and "report written to" in result.output, result.output
    empty = workspace / "project" / "empty.jsonl"
    empty.touch()
    assert is_episode_records(empty) is False  # empty files are replaced without being recognised
    record = {"model": "m", "task": 0, "sample": 0, "score": 1.0, "turns": 1, "stop_reason": "done", "row": {},
              "messages": []}
    empty.write_text(json.dumps(record) + "\n")
    assert is_episode_records(empty) and not is_episode_records(workspace / "project" / "outputs" / "run" / "metrics.jsonl")


@pytest.mark.parametrize("target, extra, says", [
    ("notes", [], "not empty"), ("notes", ["--overwrite"], "did not write"), (".", [], "the current folder"),
    ("README.md", [], "is a file"), ("~", ["--overwrite"], "home"), ("outputs/run", [], "not empty"),
    ("README.md/sub", [], "cannot be created (Not a directory)"),  # a traceback after the work was done
])
def test_tiny_model_never_replaces_the_users_files(workspace, target, extra, says):
    refuses(["tiny-model", target, *extra], workspace, "OUTPUT_DIR", says)


@pytest.mark.parametrize("target, extra, says", [
    ("notes", ["--overwrite"], "did not write"), (".", ["--overwrite"], "the current folder"),
    ("README.md", [], "is a file"), ("outputs/run", ["--overwrite"], "which this command reads"),
    ("outputs", ["--overwrite"], "which this command reads"), ("~", ["--overwrite"], "home"),
    ("README.md/sub", [], "cannot be created (Not a directory)"),  # a traceback after the model loaded
])
def test_export_never_replaces_the_users_files_or_its_input(workspace, target, extra, says):
    refuses(["export", "outputs/run", "--to", target, *extra], workspace, "--to", says)


@pytest.mark.parametrize("target, extra, says", [
    ("notes", ["--overwrite"], "did not write"), (".", ["--overwrite"], "the current folder"),
    ("~", ["--overwrite"], "home"), ("README.md", [], "is a file"),
])
@pytest.mark.parametrize("command", ["grpo", "sft"])
def test_training_never_writes_into_the_users_folders(workspace, command, target, extra, says):
    refuses([command, "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--output-dir", target,
             *extra], workspace, "--output-dir", says)


@pytest.mark.integration
def test_a_tiny_model_is_replaced_only_by_overwrite(workspace):
    first = CliRunner().invoke(app, ["tiny-model", "tiny"])
    assert first.exit_code == 0, first.output
    refuses(["tiny-model", "tiny"], workspace, "--overwrite")
    again = CliRunner().invoke(app, ["tiny-model", "tiny", "--overwrite"])
    assert again.exit_code == 0, again.output
    assert "replaced tiny: removed a tiny model (" in again.output  # says what it removed
    assert (Path("tiny") / "config.json").is_file() and (Path("tiny") / "aitrain_tiny.json").is_file()


def test_a_file_never_replaces_a_folder(tmp_path):
    folder = tmp_path / "results"
    (folder / "kept").mkdir(parents=True)
    page = tmp_path / ".results.partial"
    page.write_text("<html>")
    with pytest.raises(Exception, match="is a folder"):
        publish(page, folder)
    assert (folder / "kept").is_dir()


def test_a_taken_default_output_folder_gives_the_next_numbered_one(tmp_path, monkeypatch, capsys):
    """README's commands one after another: a second run of the same environment without --output-dir
    goes to outputs/<class>-2 (said on stderr) instead of failing; an explicit --output-dir still refuses."""
    from aitrain_grpo import RunConfig
    from aitrain_grpo.errors import ConfigError
    from aitrain_grpo.training.run.plan import plan_run
    from aitrain_grpo.training.run.lock import release_all

    monkeypatch.chdir(tmp_path)
    finished = tmp_path / "outputs" / "letterenv"
    finished.mkdir(parents=True)
    (finished / "run_config.json").write_text("{}")
    (finished / "run_summary.json").write_text("{}")
    config = RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv")
    plan = plan_run(config)
    assert plan.output_dir == Path("outputs/letterenv-2") and plan.config.output_dir == "outputs/letterenv-2"
    assert config.output_dir is None  # the caller's config is left alone
    assert "outputs/letterenv holds an earlier run, so this run writes to outputs/letterenv-2" in capsys.readouterr().err
    (tmp_path / "outputs" / "letterenv-2").mkdir(exist_ok=True)  # the plan locked it (training/run/lock.py)
    (tmp_path / "outputs" / "letterenv-2" / "run_config.json").write_text("{}")
    assert plan_run(config).output_dir == Path("outputs/letterenv-3")
    with pytest.raises(ConfigError, match="already holds a finished run"):
        plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir="outputs/letterenv"))
    release_all()


def test_errors_raised_to_python_name_keyword_arguments(tmp_path):
    """`aitrain_grpo.train` is called with a RunConfig: its one-line errors say `overwrite=True`, not a flag."""
    from aitrain_grpo import RunConfig, train
    from aitrain_grpo.errors import ConfigError

    finished = tmp_path / "run"
    finished.mkdir()
    (finished / "run_config.json").write_text("{}")
    (finished / "run_summary.json").write_text("{}")
    with pytest.raises(ConfigError) as raised:
        train(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(finished)))
    assert "pass overwrite=True or choose another output_dir=" in str(raised.value)
    assert "--" not in str(raised.value)
    with pytest.raises(ConfigError, match=r"batch_size=6 is not a multiple of rl_num_generations=4"):
        train(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", batch_size=6))
    from aitrain_grpo.training.python_api import as_python_arguments

    # use_vllm is None until a run decides: its flags still read as the keyword (--async-steps' refusal names them).
    assert as_python_arguments("add --use-vllm, or --no-use-vllm") == "add use_vllm=True, or use_vllm=False"
    # The word after a flag is its value only when it can be one: "--lr must be a number" is a sentence.
    with pytest.raises(ConfigError, match=r"^lr must be a number"):
        train(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", lr="abc"))
    assert as_python_arguments("--batch-size 8 is not a multiple of --rl-num-generations 3; --rl-loss-type dapo "
                               "needs --max-steps at least 2") == ("batch_size=8 is not a multiple of "
                               "rl_num_generations=3; rl_loss_type=dapo needs max_steps at least 2")


def test_an_environment_handed_in_from_python_is_recorded_in_run_config(tmp_path):
    """`train(RunConfig(...), env=load_environment(...))`: run_config.json says which module, class and
    keyword arguments built the environment (it said null), and the config may leave them out."""
    from aitrain_grpo import RunConfig, load_environment
    from aitrain_grpo.training.python_api import with_environment_origin
    from envs.letters import LetterEnv

    env = load_environment("envs.letters", "LetterEnv", '{"letter": "b", "turns": 1}')
    config = with_environment_origin(RunConfig(output_dir=str(tmp_path / "run")), env)
    assert (config.rl_env_module, config.rl_env_class, config.rl_env_config) == (
        "envs.letters", "LetterEnv", {"letter": "b", "turns": 1})
    config = with_environment_origin(RunConfig(), LetterEnv())  # built by hand: its class still names it
    assert (config.rl_env_module, config.rl_env_class, config.rl_env_config) == ("envs.letters", "LetterEnv", None)
    given = RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", rl_env_config={"turns": 2})
    assert with_environment_origin(given, env) is given  # what the caller says wins


def test_a_folder_with_another_tools_run_config_is_not_taken_for_a_run(workspace):
    """run_config.json is a common name: a folder holding another tool's (no run options of ours) beside a
    user's README and metrics is a folder of the user's files, not an unfinished run to write into."""
    theirs = workspace / "project" / "their-run"
    theirs.mkdir()
    (theirs / "run_config.json").write_text(json.dumps({"learning_rate": 0.1, "my": "settings"}))
    (theirs / "README.md").write_text("# my notes\n")
    (theirs / "metrics.jsonl").write_text("important\n")
    refuses(["grpo", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--output-dir", str(theirs)],
            workspace, "--output-dir", "holds files this tool did not write")


def test_an_empty_model_is_named_as_empty(workspace):
    # '' is the current folder to a Path: it was refused as " is a directory without a model".
    refuses(["eval", "--model", "", "--episodes", "1"], workspace, "--model needs a value")


def test_python_callers_are_told_what_train_takes(tmp_path):
    from aitrain_grpo import RunConfig, train
    from aitrain_grpo.errors import ConfigError
    from envs.hotel import HotelEnv
    from envs.letters import LetterEnv

    config = RunConfig(output_dir=str(tmp_path / "run"), max_steps=1)
    with pytest.raises(ConfigError, match=r"^env= takes an environment instance, e.g. LetterEnv\(\) .* not the class"):
        train(config, env=LetterEnv)
    with pytest.raises(ConfigError, match=r"^train takes a RunConfig, not a dict"):
        train({"max_steps": 1})
    # The instance wins over nothing, but a config naming another class would record the wrong one.
    named = RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"^env= is a HotelEnv but the config names rl_env_class=LetterEnv"):
        train(named, env=HotelEnv())
    assert not (tmp_path / "run").exists()
