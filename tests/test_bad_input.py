"""Bad input before training: one line, `error: ...`, naming the problem and the fix, exit code 2, no
traceback, and nothing loaded or written. (tests/test_cli.py covers environment load errors and
--rl-num-generations 1, a batch size that is not a multiple of the group, --vllm-mode foo,
--vllm-mode server without a URL and a finished run in the output directory; test_bad_input_more.py
absurd sizes, empty paths, and environment classes and configs that do not fit; this file the rest.)

The CLI runs in-process here (typer's runner) to keep the many cases quick; one case runs as a real
process to show the same holds for the installed entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import REPO, run_cli

from aitrain_grpo.commands.cli import app

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]


def grpo(*args: str, cwd: Path | None = None):
    import os

    previous = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        return CliRunner().invoke(app, ["grpo", *args])
    finally:
        os.chdir(previous)


def assert_one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--report-to", "mlflow"], ["--report-to 'mlflow' is not one of none, tensorboard, wandb, trackio"]),
        (["--rl-loss-type", "ppo"], ["--rl-loss-type 'ppo' is not one of grpo"]),
        (["--rl-advantage", "turns"], ["--rl-advantage 'turns' is not one of outcome, turn"]),
        (["--batch-size", "0"], ["--batch-size must be a positive integer up to 65536", "got 0"]),
        (["--batch-size", "-8"], ["--batch-size must be a positive integer up to 65536", "got -8"]),
        (["--max-steps", "0"], ["--max-steps must be a positive integer, got 0"]),
        (["--save-steps", "-1"], ["--save-steps must be a positive integer, got -1"]),
        (["--save-total-limit", "0"], ["--save-total-limit must be a positive integer, got 0"]),
        (["--rl-max-turns", "0"], ["--rl-max-turns must be a positive integer"]),
        (["--gradient-accumulation-steps", "0"], ["--gradient-accumulation-steps must be a positive integer up to 65536"]),
        (["--lora-r", "-2"], ["--lora-r must be a positive integer up to 4096"]),
        (["--rl-env-timeout", "0"], ["--rl-env-timeout must be positive seconds"]),
        (["--epochs", "0"], ["--epochs must be positive"]),
        (["--rl-max-error-rate", "1.5"], ["--rl-max-error-rate must be in [0, 1]", "1 never stops"]),
        (["--rl-max-error-rate", "-0.1"], ["--rl-max-error-rate must be in [0, 1]"]),
        (["--rl-top-p", "0"], ["--rl-top-p must be in (0, 1]"]),
        (["--rl-max-new-tokens", "64", "--rl-max-completion-length", "32"], ["exceeds --rl-max-completion-length 32"]),
        (["--resume-from-checkpoint", "/nonexistent/checkpoint-4"], ["--resume-from-checkpoint /nonexistent/checkpoint-4 does not exist", "auto"]),
        (["--resume-from-checkpoint", str(REPO / "README.md")], ["README.md is a file; pass auto"]),
    ],
)
def test_bad_option_values(extra, fragments):
    assert_one_line_error(grpo(*LETTERS, *extra), *fragments)


def test_model_path_that_does_not_exist(tmp_path):
    assert_one_line_error(grpo(*LETTERS, "--model", str(tmp_path / "nope")), "does not exist", "config.json")
    assert_one_line_error(grpo(*LETTERS, "--model", "./nope"), "--model ./nope does not exist")
    assert_one_line_error(grpo(*LETTERS, "--model", "~/no-such-model-here"), "does not exist")


def test_model_path_with_a_typo_suggests_the_folder_that_exists(tmp_path):
    (tmp_path / "models" / "qwen-small").mkdir(parents=True)
    line = assert_one_line_error(grpo(*LETTERS, "--model", "models/qwen-smal", cwd=tmp_path), "does not exist")
    assert "did you mean models/qwen-small?" in line


def test_model_folder_that_is_not_a_model(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    assert_one_line_error(grpo(*LETTERS, "--model", str(tmp_path / "notes")), "is not a model", "no config.json")
    assert_one_line_error(grpo(*LETTERS, "--model", str(tmp_path / "notes" / "todo.txt")), "is a file, not a model folder")


def test_model_folder_with_a_broken_config_fails_to_load_in_one_line(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    result = grpo(*LETTERS, "--model", str(broken))
    # transformers may warn first; the error is still the one line at the end.
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: --model {broken} could not be loaded: ")


@pytest.mark.parametrize(
    "name, text, fragments",
    [
        ("run.yaml", "rl-env-module: envs.letters\nbatch-size: [8\n", ["is not valid YAML"]),
        ("run.json", '{"rl_env_module": "envs.letters",}', ["is not valid JSON", "line 1"]),
        ("run.json", '["rl_env_module"]', ["must hold a mapping of option names to values, not list"]),
        ("run.yaml", "rl-env-module: envs.letters\nrl-env-class: LetterEnv\nbatch_szie: 8\n", ["unknown option(s): batch_szie (did you mean batch_size?)"]),
        ("run.yaml", "rl-env-module: envs.letters\nrl-env-class: LetterEnv\nlr: fast\n", ["--lr must be a number, got 'fast' (str)"]),
        ("run.yaml", "rl-env-module: envs.letters\nrl-env-class: LetterEnv\nbatch-size: '8'\n", ["--batch-size must be an integer, got '8' (str)"]),
        ("run.yaml", "rl-env-module: envs.letters\nrl-env-class: LetterEnv\npeft: maybe\n", ["--peft must be true or false"]),
        ("run.yaml", "rl-env-module: envs.letters\nrl-env-class: LetterEnv\nlr: .nan\n", ["--lr must be a finite number"]),
        ("run.yaml", "rl-env-module: envs.letters\nrl-env-class: LetterEnv\nmodel: 7\n", ["--model must be a string"]),
        ("run.toml", 'rl_env_module = "envs.letters"\n', ["extension '.toml', which is not read", "YAML (.yaml, .yml) or JSON"]),
    ],
)
def test_bad_config_files(tmp_path, name, text, fragments):
    path = tmp_path / name
    path.write_text(text)
    assert_one_line_error(grpo("--config", str(path)), *fragments)


def test_a_config_file_named_in_capitals_and_a_folder_are_read_as_what_they_are(tmp_path):
    (tmp_path / "RUN.YAML").write_text("rl-env-module: envs.letters\nrl-env-class: LetterEnv\nmodel: ./missing\n")
    assert_one_line_error(grpo("--config", str(tmp_path / "RUN.YAML")), "--model ./missing does not exist")  # YAML
    (tmp_path / "folder.yaml").mkdir()
    assert_one_line_error(grpo("--config", str(tmp_path / "folder.yaml")), "folder.yaml is a folder")


def test_a_config_file_may_list_what_a_flag_takes_comma_separated(tmp_path):
    """axolotl's and TRL's files write LoRA targets as a YAML list; the flag's form is q_proj,v_proj."""
    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.config_file import read_options_file

    path = tmp_path / "run.yaml"
    path.write_text("target_modules: [q_proj, v_proj]\nlora_modules_to_save: [lm_head]\nrl_env_weights: [0.7, 0.3]\n")
    options = read_options_file(path, list(RunConfig.__dataclass_fields__))
    assert options == {"target_modules": "q_proj,v_proj", "lora_modules_to_save": "lm_head", "rl_env_weights": "0.7,0.3"}
    path.write_text("rl-env-module: envs.letters\nrl-env-class: LetterEnv\ntarget_modules: [[q_proj], v_proj]\n")
    assert_one_line_error(grpo("--config", str(path)), "target_modules is a list of [['q_proj'], 'v_proj']; give names "
                                                        "or numbers, e.g. [q_proj, v_proj] or \"q_proj,v_proj\"")


def test_config_file_that_is_not_text(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"\xff\xfe\x00binary")
    assert_one_line_error(grpo("--config", str(path)), "is not UTF-8 text")


def test_config_file_reads_yaml_exponents_as_numbers(tmp_path):
    """YAML 1.1 reads `1e-5` as a string; it is a learning rate, so it is read as one (the run then
    stops at the next problem, the missing model, which shows the rate passed)."""
    path = tmp_path / "run.yaml"
    path.write_text("rl-env-module: envs.letters\nrl-env-class: LetterEnv\nlr: 1e-5\nmodel: ./missing\n")
    assert_one_line_error(grpo("--config", str(path)), "--model ./missing does not exist")


def test_output_dir_with_an_unfinished_run_is_not_started_over(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    for name in ("trainer_state.json", "aitrain_state.json"):
        (out / "checkpoint-3").mkdir(parents=True, exist_ok=True)
        (out / "checkpoint-3" / name).write_text("{}")
    # As a real process: the installed entry point behaves the same.
    result = run_cli("grpo", *LETTERS, "--model", tiny_model_dir, "--output-dir", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: output directory {out} holds checkpoints of an unfinished run (newest: checkpoint-3); pass "
        "--resume-from-checkpoint auto to continue it, --overwrite to start over, or choose another --output-dir"
    )
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-3"]  # nothing written


def test_run_config_json_round_trips_through_config(tmp_path):
    """`run_config.json` is a valid `--config` file (the way to repeat a run)."""
    from aitrain_grpo.config import RunConfig

    written = RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", lr=3e-4).to_dict()
    path = tmp_path / "run_config.json"
    path.write_text(json.dumps(written))
    again = RunConfig(**RunConfig.from_file(path)).validate()
    assert again.to_dict() == written


def test_local_vllm_server_gpus_are_hidden_from_training(monkeypatch, tmp_path):
    """`--vllm-server-gpus N`: training keeps the GPUs after the server's first N (no GPU here, so the
    GPU listing is faked; the environment variable it sets is what CUDA reads)."""
    import subprocess as sp

    from aitrain_grpo import RunConfig
    from aitrain_grpo.training.rollout import generation as generation

    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(sp, "run", lambda *a, **k: sp.CompletedProcess(a, 0, stdout="0\n1\n2\n3\n", stderr=""))
    config = RunConfig(rl_env_module="envs.hotel", rl_env_class="HotelEnv", use_vllm=True, vllm_mode="server",
                       vllm_server_url="http://127.0.0.1:8000", vllm_server_gpus=1)
    environ: dict[str, str] = {}
    assert generation.reserve_server_gpus(config, environ) == "1,2,3"
    assert environ["CUDA_VISIBLE_DEVICES"] == "1,2,3"
    assert generation.reserve_server_gpus(config, {"CUDA_VISIBLE_DEVICES": "5"}) is None  # the user's choice wins
    remote = RunConfig(**{**config.to_dict(), "vllm_server_url": "http://gpu-node-2:8000"})
    assert generation.reserve_server_gpus(remote, {}) is None
    assert generation.training_devices(["0"], 1) == ["0"]  # never leaves training without a GPU


def test_two_colocated_runs_started_at_once_get_their_own_rendezvous_ports():
    """TRL would give both 29500 (its first choice when it looks free), and the second engine's start
    fails with EADDRINUSE; each single-process colocated run now takes a port the OS hands out."""
    from aitrain_grpo.training.rollout.generation import GenerationPlan, colocate_rendezvous_port

    colocate = GenerationPlan("vllm_colocate", "reload")
    first, second = {}, {}
    assert colocate_rendezvous_port(colocate, first) and colocate_rendezvous_port(colocate, second)
    ports = {int(first["MASTER_PORT"]), int(second["MASTER_PORT"])}
    assert 29500 not in ports and all(0 < port < 65536 for port in ports)  # the OS's pick, not a fixed list
    assert colocate_rendezvous_port(colocate, {"MASTER_PORT": "1234"}) is None  # the user's or launcher's port stands
    assert colocate_rendezvous_port(colocate, {"WORLD_SIZE": "2"}) is None
    assert colocate_rendezvous_port(GenerationPlan("hf", None), {}) is None


def test_a_missing_tracker_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    result = grpo(*LETTERS, "--report-to", "wandb", "--output-dir", str(out))
    assert_one_line_error(result, "--report-to wandb needs the wandb package")
    assert not out.exists()  # no run_config.json left behind for a run that never started


def test_a_budget_beyond_the_models_context_is_refused_before_training(tmp_path):
    out = tmp_path / "run"
    result = grpo(*LETTERS, "--rl-max-new-tokens", "100000", "--rl-max-completion-length", "200000",
                  "--output-dir", str(out))
    error = assert_one_line_error(result, "--rl-max-completion-length 200000 does not fit", "context of 4096 tokens")
    assert "--rl-max-completion-length 2048" in error
    assert not (out / "run_summary.json").exists() and not list(out.glob("checkpoint-*"))


@pytest.mark.parametrize("command", ["grpo", "eval"])
def test_an_uncached_hub_model_without_network_is_one_line_at_once(command, tmp_path, monkeypatch):
    """Offline, a hub id used to print ten download retries over about a minute before its error. The hub's
    host is made unresolvable (.invalid never resolves) and the cache empty, so the test holds anywhere."""
    import time

    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    started = time.monotonic()
    where = ["--output-dir", str(tmp_path / "run")] if command == "grpo" else []
    result = run_cli(command, *LETTERS, "--model", "Qwen/Qwen2.5-0.5B-Instruct", *where)
    assert result.returncode == 2 and "Retrying" not in result.stderr, result.stderr[-1500:]
    assert result.stderr.strip().splitlines()[-1].endswith(
        "Qwen/Qwen2.5-0.5B-Instruct is neither a folder here nor in the local Hugging Face cache, and hub.invalid "
        "cannot be reached (no network); download it where there is one (huggingface-cli download "
        "Qwen/Qwen2.5-0.5B-Instruct) or pass a local model folder")
    assert time.monotonic() - started < 30
