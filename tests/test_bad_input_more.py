"""More bad input, as a user meets it (issue 35): each refused in one `error:` line, exit 2, nothing under
the given folder created or changed (helpers/cli.py `refused`), or accepted with a one-line note.

Absurd sizes, empty paths, output folders that do not exist or cannot be written, LoRA target modules
the model lacks, an environment class's `max_turns` out of range, `--rl-env-config` values of the wrong
type for the constructor's annotations, and `eval --episodes` beyond the rows there are."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.cli import refused

from aitrain_grpo.commands.cli import app

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]

# A two-row environment with annotated constructor parameters and a class-level max_turns (set per test).
ENV_SOURCE = '''
from typing import Literal, Optional
from aitrain_grpo import Environment

class TwoRows(Environment):
    max_turns = MAX_TURNS

    def __init__(self, turns: int = 1, rate: float = 0.5, name: Optional[str] = None, tags: list[str] = (),
                 mode: Literal["a", "b"] = "a", anything=None):
        self.turns = turns

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "user", "content": f"say {w}"}], "word": w} for w in ("a", "b")]

    def score_episode(self, episode):
        return 0.0
'''


def env_module(tmp_path: Path, monkeypatch, max_turns: str = "2") -> list[str]:
    """Write the environment as a module of its own name under tmp_path (the loader imports from the
    current folder), chdir there, and return the flags that name it."""
    name = f"two_rows_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(ENV_SOURCE.replace("MAX_TURNS", max_turns))
    monkeypatch.chdir(tmp_path)
    return ["--rl-env-module", name, "--rl-env-class", "TwoRows"]


@pytest.mark.parametrize("flag, value, message", [
    ("--batch-size", "1000000000000", "--batch-size must be a positive integer up to 65536"),
    ("--gradient-accumulation-steps", "1000000000000", "--gradient-accumulation-steps must be a positive integer up to 65536"),
    ("--rl-num-generations", "10000000", "--rl-num-generations must be a positive integer up to 65536"),
    ("--micro-batch-size", "10000000", "--micro-batch-size must be a positive integer up to 65536"),
    ("--lora-r", "1000000", "--lora-r must be a positive integer up to 4096"),
    ("--agent-port", "70000", "--agent-port must be in [0, 65535] (a TCP port; 0 takes any free one), got 70000"),
    ("--output-dir", "", "--output-dir needs a value"),
])
def test_absurd_sizes_and_empty_paths_are_refused(tmp_path, monkeypatch, flag, value, message):
    monkeypatch.chdir(tmp_path)  # where the default outputs/letterenv would go
    where = [] if flag == "--output-dir" else ["--output-dir", "run"]
    refused(["grpo", *LETTERS, *where, flag, value], tmp_path, message)
    assert list(tmp_path.iterdir()) == []


def test_an_empty_eval_output_is_refused(tmp_path, tiny_model_dir):
    refused(["eval", "--model", tiny_model_dir, *LETTERS, "--output", ""], tmp_path, "--output needs a value")


def test_sft_refuses_an_empty_output_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the default outputs/letterenv-sft would go
    refused(["sft", *LETTERS, "--output-dir", ""], tmp_path, "--output-dir needs a value")


def test_a_report_into_a_folder_that_does_not_exist_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    page = tmp_path / "nowhere" / "page.html"
    refused(["report", str(run), "--output", str(page)], tmp_path, f"the folder {page.parent} does not exist",
            "mkdir -p")
    refused(["report", str(run), "--output", ""], tmp_path, "--output needs a value")


def test_init_somewhere_it_cannot_write_is_refused_and_leaves_nothing(tmp_path):
    refused(["init", "my_task", "--dir", "/proc/no-such-folder/project"], tmp_path, "cannot write",
            "pass a --dir you can write to")
    (tmp_path / "a-file").write_text("x")
    refused(["init", "my_task", "--dir", str(tmp_path / "a-file" / "project")], tmp_path, "a file, not a folder")


def test_target_modules_the_model_lacks_are_refused_naming_its_modules(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    line = refused(["grpo", *LETTERS, "--model", tiny_model_dir, "--output-dir", str(out), "--target-modules",
                    "q_proj,query_key_value"], tmp_path, "--target-modules query_key_value names no module of")
    assert "q_proj" in line.split("its linear modules:")[1] and "lm_head" not in line
    assert not out.exists()


@pytest.mark.parametrize("max_turns", ["-3", "0", "10**12", "2.5", "True"])
def test_a_class_max_turns_out_of_range_is_refused(tmp_path, monkeypatch, max_turns):
    env = env_module(tmp_path, monkeypatch, max_turns)
    shown = {"10**12": "1000000000000"}.get(max_turns, max_turns)
    refused(["env", "check", *env], tmp_path, f"TwoRows.max_turns is {shown}; set it to",
            "an integer from 1 to 10000")


@pytest.mark.parametrize("config, message", [
    ('{"turns": true}', "'turns' is annotated int but got true (bool)"),
    ('{"turns": 2.5}', "'turns' is annotated int but got 2.5 (float)"),
    ('{"turns": 1e308}', "'turns' is annotated int but got 1e+308 (float)"),
    ('{"rate": "fast"}', "'rate' is annotated float but got \"fast\" (str)"),
    ('{"tags": ["a", 3]}', "'tags' is annotated list[str]"),
    ('{"name": 7}', "'name' is annotated Optional[str] but got 7 (int)"),
    ('{"mode": "c"}', "'mode' is annotated Literal['a', 'b'] but got \"c\""),
])
def test_env_config_values_of_the_wrong_type_are_refused(tmp_path, monkeypatch, config, message):
    env = env_module(tmp_path, monkeypatch)
    out = tmp_path / "run"
    refused(["grpo", *env, "--rl-env-config", config, "--output-dir", str(out)], tmp_path,
            f"TwoRows's config key {message}")
    assert not out.exists()


def test_env_config_values_that_fit_are_accepted(tmp_path, monkeypatch):
    """An int for a float, None for an Optional, any value for an unannotated parameter."""
    from aitrain_grpo.env.loading import load_environment

    env_module(tmp_path, monkeypatch)
    name = f"two_rows_{tmp_path.name}"
    env = load_environment(name, "TwoRows", '{"turns": 3, "rate": 1, "name": null, "tags": ["x"], "mode": "b", '
                                            '"anything": {"k": [1, 2.5]}}')
    assert env.turns == 3


def test_eval_says_when_it_plays_fewer_tasks_than_asked(tmp_path, monkeypatch, tiny_model_dir):
    env = env_module(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["eval", "--model", tiny_model_dir, *env, "--episodes", "1000000000",
                                      "--rl-max-new-tokens", "2"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert notes == ["note: --episodes 1000000000 is more than the 2 tasks the environment builds; playing those 2"]


CTRL_C = ["--rl-env-module", "envs_fixtures.workbench", "--rl-env-class", "CtrlCEnv"]


def test_ctrl_c_as_a_command_starts_says_interrupted_and_exits_130(tmp_path, monkeypatch):
    """Before training, Ctrl-C is one line and 130 for every command, never a traceback: `grpo` printed
    one when the Ctrl-C cut an import of torch short (its handler then imported torch again: simulated
    here by a module that cannot be imported), and `sft` exited without a word."""
    from helpers import FIXTURES_DIR, in_process_cli

    monkeypatch.setitem(sys.modules, "aitrain_grpo.training.run.stopping", None)
    cli = in_process_cli(monkeypatch, FIXTURES_DIR.parent)
    for command, line in (("grpo", "interrupted; nothing saved since the last checkpoint"), ("sft", "interrupted")):
        result = cli(command, *CTRL_C, "--output-dir", tmp_path / command)
        assert result.exit_code == 130, (command, result.output, result.exception)
        assert result.output.strip().splitlines()[-1] == line, (command, result.output)
        assert "Traceback" not in result.output
