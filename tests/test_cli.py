"""`aitrain grpo` as a user runs it: bad input gets one line and exit 2; a short hotel run leaves a
usable output directory.

The many bad inputs run in this process (`in_process_cli`: the same code and exit codes, without the 9 CPU
seconds a command's start costs); one environment that does not load and one bad option also run as the
command in a process of its own, where nothing else, a warning of an import or a traceback, reaches stderr."""

from __future__ import annotations

import json

import pytest

from helpers import REPO, command_options, in_process_cli, run_cli

FIXTURES = REPO / "tests"
HOTEL = ["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv"]


def assert_one_line_error(result, *fragments: str) -> str:
    code = result.returncode if hasattr(result, "returncode") else result.exit_code  # a process's, or in_process_cli's
    assert code == 2, result.stdout + result.stderr + repr(getattr(result, "exception", None))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--rl-env-module", "envs_fixtures.nope", "--rl-env-class", "X"], ["module 'envs_fixtures.nope' not found"]),
        (["--rl-env-module", "envs_fixtures.broken_import", "--rl-env-class", "BrokenEnv"], ["failed to import", "nonexistent"]),
        (["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnvv"], ["has no class 'HotelEnvv'", "did you mean 'HotelEnv'"]),
        (["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv", "--rl-env-config", "{num_tasks: 3}"], ["not valid JSON", "line 1, column 2"]),
        (["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv", "--rl-env-config", "[1, 2]"], ["must be a JSON object", "array"]),
        (["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv", "--rl-env-config", '{"num_task": 3}'], ["does not accept config key(s) 'num_task'", "num_tasks"]),
        (["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv", "--rl-env-config", '{"num_tasks": 0}'], ["raised ValueError"]),
        (["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv", "--rl-env-config", "@missing.json"], ["config file 'missing.json' not found"]),
        (["--rl-env-module", "envs_fixtures.no_score", "--rl-env-class", "NoScoreEnv"], ["score_episode"]),
    ],
)
@pytest.mark.integration  # a command, run in this process
@pytest.mark.usefixtures("isolated_imports")
def test_environment_load_errors(args, fragments, monkeypatch):
    assert_one_line_error(in_process_cli(monkeypatch, FIXTURES)("grpo", *args), *fragments)


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--rl-num-generations", "1"], ["--rl-num-generations must be at least 2"]),
        (["--batch-size", "6"], ["--batch-size 6 is not a multiple of --rl-num-generations 4", "4, 8, 12, 16"]),
        (["--vllm-mode", "foo"], ["--vllm-mode 'foo' is not one of colocate, server"]),
        (["--use-vllm", "--vllm-mode", "server"], ["--vllm-mode server needs --vllm-server-url"]),
        (["--rl-max-new-tokens", "0"], ["--rl-max-new-tokens must be a positive integer"]),
        (["--lr", "-1"], ["--lr must be positive"]),
        (["--rl-entropy-coef", "-0.1"], ["--rl-entropy-coef must be >= 0"]),
    ],
)
@pytest.mark.integration  # a command, run in this process
@pytest.mark.usefixtures("isolated_imports")
def test_bad_options(extra, fragments, monkeypatch):
    assert_one_line_error(in_process_cli(monkeypatch, REPO)("grpo", *HOTEL, *extra), *fragments)


def test_a_load_error_and_a_bad_option_are_one_line_from_the_command():
    assert_one_line_error(run_cli("grpo", "--rl-env-module", "envs_fixtures.broken_import", "--rl-env-class",
                                  "BrokenEnv", cwd=FIXTURES), "failed to import", "nonexistent")
    assert_one_line_error(run_cli("grpo", *HOTEL, "--batch-size", "6"), "--batch-size 6 is not a multiple")


def test_config_file_with_unknown_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rl-env-module: envs.hotel\nrl-env-class: HotelEnv\nlearning_rate: 0.1\n")
    assert_one_line_error(run_cli("grpo", "--config", str(path)),
                          "unknown option(s): learning_rate (TRL's and axolotl's name; aitrain's is lr)")


@pytest.mark.parametrize("argv, said", [
    (["grpo", "--learning-rate", "1e-4"], "No such option: --learning-rate (TRL's and axolotl's name; aitrain's is --lr)"),
    (["grpo", "--per-device-train-batch-size", "2"],
     "aitrain's is --micro-batch-size, counting episodes a forward/backward pass, where TRL counts completions"),
    (["env", "check", "--max-tool-calling-iterations", "3"], "(TRL's name; aitrain's is --rl-max-turns, counting model turns)"),
    (["eval", "--temperature", "0"], "(TRL's name; aitrain's is --rl-temperature)"),
    # a peer's name for a flag this command does not have, and a name no peer uses: click's own message
    (["eval", "--beta", "0.1"], "No such option: --beta\n"),
    (["grpo", "--frobnicate", "1"], "No such option: --frobnicate\n"),
])
def test_another_trainers_flag_is_answered_with_ours(monkeypatch, tmp_path, argv, said):
    result = in_process_cli(monkeypatch, tmp_path)(*argv)
    assert result.exit_code == 2, result.output
    assert said in result.stderr + "\n", result.stderr


def test_debug_shows_the_traceback():
    result = run_cli("grpo", "--rl-env-module", "envs.hotel", "--rl-env-class", "Nope", "--debug")
    assert result.returncode != 0 and "Traceback" in result.stderr and "EnvLoadError" in result.stderr


def test_hotel_run_writes_model_config_and_metrics(tiny_model_dir, tmp_path):
    out = tmp_path / "hotel"
    result = run_cli(
        "grpo", *HOTEL, "--model", tiny_model_dir, "--output-dir", str(out), "--max-steps", "2",
        "--rl-env-config", '{"num_tasks": 8, "seed": 3}', "--rl-max-new-tokens", "32",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "step 2/2" in result.stdout
    config = json.loads((out / "run_config.json").read_text())
    assert config["rl_env_module"] == "envs.hotel" and config["rl_env_class"] == "HotelEnv"
    assert config["rl_env_config"] == '{"num_tasks": 8, "seed": 3}'
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for key in ("reward", "reward_std", "env/score_mean", "env/turns_mean", "env/errors", "env/tool_calls_mean"):
        assert key in records[0], key
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    assert (out / "tokenizer_config.json").exists()
    # The saved adapter loads on top of its base model.
    from peft import AutoPeftModelForCausalLM

    AutoPeftModelForCausalLM.from_pretrained(str(out))

    again = run_cli("grpo", *HOTEL, "--model", tiny_model_dir, "--output-dir", str(out), "--max-steps", "1")
    assert_one_line_error(again, "already holds a finished run", "--overwrite")


def test_default_model_is_announced(tmp_path):
    result = run_cli("grpo", "--rl-env-module", "envs.hotel", "--rl-env-class", "Nope", cwd=tmp_path)
    assert "built-in tiny model" in result.stdout and "--model Qwen/Qwen2.5-0.5B-Instruct" in result.stdout


def test_eval_and_env_check_state_the_defaults_grpo_uses():
    from aitrain_grpo.config import RunConfig

    defaults = RunConfig()
    evaluation, check = command_options("eval"), command_options("env", "check")
    for flag in ("--rl-max-new-tokens", "--rl-max-completion-length", "--rl-temperature", "--rl-top-k", "--rl-top-p",
                 "--rl-env-timeout"):
        default = getattr(defaults, flag[2:].replace("-", "_"))
        assert evaluation[flag][0].endswith(f"Default: the training run's, else {default}."), (flag, evaluation[flag])
        assert evaluation[flag][1] is None  # not given: the run's value comes first
    for flag in ("--rl-max-new-tokens", "--rl-max-turns", "--rl-temperature", "--rl-env-timeout"):
        name = flag[2:].replace("-", "_")
        assert check[flag] == (RunConfig.help_for(name), getattr(defaults, name)), flag


@pytest.mark.parametrize("command", [["grpo"], ["eval"], ["env", "check"]])
@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--rl-env-timeout", "0", "--rl-env-timeout must be positive seconds, got 0.0"),
        ("--rl-max-new-tokens", "0", "--rl-max-new-tokens must be a positive integer, got 0"),
        ("--rl-max-turns", "0", "--rl-max-turns must be a positive integer, got 0"),
    ],
)
def test_a_bad_episode_option_gets_the_same_message_from_every_command(command, flag, value, message):
    from typer.testing import CliRunner

    from aitrain_grpo.commands.cli import app

    result = CliRunner().invoke(app, [*command, *HOTEL, flag, value])
    assert result.exit_code == 2 and result.stderr.strip() == f"error: {message}", result.stderr


@pytest.mark.parametrize("command", [["grpo"], ["eval"], ["env", "check"], ["sft"], ["export"]])
def test_help_shows_every_flag_whole_at_80_columns(command):
    """At 80 columns no flag name is cut short (rich's option table cut six, e.g. --rl-max-completion-le…)."""
    import os
    import subprocess
    import sys

    from aitrain_grpo.config import RunConfig

    result = subprocess.run([sys.executable, "-m", "aitrain_grpo", *command, "--help"], capture_output=True,
                            text=True, env=dict(os.environ, COLUMNS="80"), cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    if command == ["grpo"]:
        for name in RunConfig.field_names():
            assert "--" + name.replace("_", "-") in result.stdout, name


def test_every_peer_name_points_at_an_option_of_ours():
    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.peer_options import PEER_NAMES

    ours = set(RunConfig.field_names())
    assert {target for target, _, _ in PEER_NAMES.values()} <= ours
    assert not set(PEER_NAMES) & ours  # a name of ours is never refused as a peer's


def test_the_command_line_starts_without_torch_or_the_training_stack():
    """`aitrain --help`, a typo's error and every refusal made before a model loads answer in under a
    second (0.7 s measured) because the command line imports none of these; with TRL's GRPOTrainer
    loaded it took 7.9 s. A module-level import of the training layer anywhere under commands/ breaks it."""
    import subprocess
    import sys

    heavy = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "vllm")
    probe = f"import sys, aitrain_grpo.commands.cli; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=str(REPO), timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr[-2000:]
