"""`aitrain init NAME`: the environment and test it writes work as written, the three commands it prints
run, and it never overwrites a file or accepts a name that cannot be a module. About a minute (env
check, a short grpo run and eval on the tiny model, the generated test in its own pytest)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli

NAME, CLASS = "sorter", "SorterEnv"


def next_commands(stdout: str) -> list[list[str]]:
    """The printed `aitrain ...` commands, split as the shell would."""
    return [shlex.split(line)[1:] for line in stdout.splitlines() if line.strip().startswith("aitrain ")]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    folder = tmp_path_factory.mktemp("project")
    return folder, run_cli("init", NAME, cwd=folder)


@pytest.fixture(scope="module")
def other_envs_package(tmp_path_factory) -> dict[str, str]:
    """An environment whose PYTHONPATH holds another project's regular `envs` package, the way an
    installed one sits on sys.path: a folder without `envs/__init__.py` would lose to it."""
    other = tmp_path_factory.mktemp("other")
    (other / "envs").mkdir()
    (other / "envs" / "__init__.py").write_text("")
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(other))


def test_init_writes_the_environment_and_its_test(project):
    folder, result = project
    assert result.returncode == 0, result.stderr
    for path in ("envs/__init__.py", f"envs/{NAME}.py", f"tests/test_{NAME}.py"):
        assert (folder / path).is_file()
        assert f"wrote {Path(path)}" in result.stdout
    assert f"class {CLASS}(Environment)" in (folder / f"envs/{NAME}.py").read_text()


def test_init_prints_the_next_three_commands(project):
    _, result = project
    env = f"--rl-env-module envs.{NAME} --rl-env-class {CLASS}"
    assert [" ".join(c) for c in next_commands(result.stdout)] == [
        f"env check {env}",
        f"grpo {env} --max-steps 5",
        f"eval --model outputs/{CLASS.lower()} --baseline tiny --episodes 32",
    ]


def test_generated_environment_passes_env_check_with_the_oracle_at_one(project, other_envs_package):
    folder, result = project
    check = subprocess.run([sys.executable, "-m", "aitrain_grpo", *next_commands(result.stdout)[0]], cwd=folder,
                           env=other_envs_package, capture_output=True, text=True, timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "env check passed" in check.stdout
    assert "oracle (solve) scored below 1.0" not in check.stdout
    oracle = next(line for line in check.stdout.splitlines() if "oracle" in line)
    assert "│ 1.000 │ 1.000 │ 1.000 │" in oracle  # mean, min, max
    empty = next(line for line in check.stdout.splitlines() if "│ empty" in line)
    assert "│ 0.000 │" in empty


def test_generated_test_passes_under_pytest(project, other_envs_package):
    folder, _ = project
    # Run from tests/: the project folder is then on sys.path only because the test puts it there.
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"test_{NAME}.py"],
                            cwd=folder / "tests", env=other_envs_package, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


def test_printed_grpo_and_eval_commands_run(project):
    folder, result = project
    _, grpo, evaluation = next_commands(result.stdout)
    grpo[grpo.index("--max-steps") + 1] = "2"  # the printed 5 steps take ~30 s on the tiny model; 2 show it runs
    trained = run_cli(*grpo, cwd=folder)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert (folder / "outputs" / CLASS.lower() / "adapter_model.safetensors").is_file()
    evaluation[evaluation.index("--episodes") + 1] = "4"
    measured = run_cli(*evaluation, cwd=folder)
    assert measured.returncode == 0, measured.stdout + measured.stderr
    assert "mean score" in measured.stdout


def test_init_refuses_to_overwrite(tmp_path):
    env_file = tmp_path / "envs" / f"{NAME}.py"
    env_file.parent.mkdir()
    env_file.write_text("# mine\n")
    result = run_cli("init", NAME, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {Path('envs') / f'{NAME}.py'} already exists; init never overwrites: pick another name, or move "
        f"the file away"]
    assert env_file.read_text() == "# mine\n"
    assert not (tmp_path / "tests").exists()  # nothing else written either


def test_init_refuses_when_only_the_test_exists(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / f"test_{NAME}.py").write_text("# mine\n")
    result = run_cli("init", NAME, cwd=tmp_path)
    assert result.returncode == 2
    assert f"test_{NAME}.py already exists" in result.stderr
    assert not (tmp_path / "envs").exists()
    assert (tmp_path / "tests" / f"test_{NAME}.py").read_text() == "# mine\n"


@pytest.mark.parametrize("name, problem, suggestion", [
    ("1abc", "is not a Python identifier", "env_1abc"),
    ("my-env", "is not a Python identifier", "my_env"),
    ("class", "is a Python keyword", "env_class"),
])
def test_init_rejects_names_that_cannot_be_modules(tmp_path, name, problem, suggestion):
    from typer.testing import CliRunner

    from aitrain_grpo.commands.cli import app

    result = CliRunner().invoke(app, ["init", name, "--dir", str(tmp_path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: environment name {name!r} {problem}")
    assert f"e.g. {suggestion}" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_init_dir_option_writes_there_and_says_cd(tmp_path):
    from typer.testing import CliRunner

    from aitrain_grpo.commands.cli import app

    result = CliRunner().invoke(app, ["init", "word_game", "--dir", str(tmp_path / "proj")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "proj" / "envs" / "word_game.py").is_file()
    assert f"cd {tmp_path / 'proj'}" in result.stdout
    assert "--rl-env-class WordGameEnv" in result.stdout
