"""Options that can only end badly are refused in one line, exit 2, before the model or environment
loads: an --output-dir that is a file or cannot be created, and --rl-temperature 0 for training (every
episode of a group would be the same), which `aitrain eval` still takes for greedy decoding.

The output folders run in this process (`in_process_cli`: the same code and exit codes without a
command's start, 9 CPU seconds); the temperature's refusal runs as the command, where nothing else reaches
stderr."""

from __future__ import annotations

import pytest

from helpers import REPO, in_process_cli, run_cli

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--max-steps", "1"]


def assert_refused_in_one_line(result, *fragments: str) -> None:
    code = result.returncode if hasattr(result, "returncode") else result.exit_code  # a process's, or in_process_cli's
    assert code == 2, result.stdout[-2000:] + result.stderr[-2000:] + repr(getattr(result, "exception", None))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("case", ["a file", "inside a file", "under /proc"])
@pytest.mark.integration  # a command, run in this process
@pytest.mark.usefixtures("isolated_imports")
def test_an_output_dir_that_cannot_be_a_folder_is_refused(tmp_path, case, monkeypatch):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder")
    output_dir, fragments = {
        "a file": (a_file, ["is a file, not a folder"]),
        "inside a file": (a_file / "run", ["cannot be created (Not a directory)"]),
        "under /proc": ("/proc/x", ["/proc/x cannot be created", "a folder you can write to"]),
    }[case]
    # A module that does not exist: had the environment been loaded first, the error would name it.
    result = in_process_cli(monkeypatch, REPO)("grpo", "--rl-env-module", "no_such_module", "--rl-env-class", "X",
                                               "--output-dir", output_dir)
    assert_refused_in_one_line(result, f"--output-dir {output_dir}", *fragments)
    assert a_file.read_text() == "not a folder"


def test_temperature_zero_is_refused_for_training_with_the_reason(tmp_path):
    result = run_cli("grpo", *LETTERS, "--rl-temperature", "0", "--output-dir", str(tmp_path / "run"))
    assert_refused_in_one_line(result, "--rl-temperature must be above 0", "every episode of a group is the same")
    assert not (tmp_path / "run").exists()


def test_temperature_zero_is_still_greedy_decoding_for_eval(tiny_model_dir):
    result = run_cli("eval", "--model", tiny_model_dir, *LETTERS[:4], "--rl-env-config", '{"turns": 1}',
                     "--episodes", "2", "--rl-max-new-tokens", "4", "--rl-temperature", "0")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "temperature 0" in result.stdout
