"""The fault-injection suite: environments that fail in every way the contract names, run through the
`aitrain` CLI on the tiny model. Each test checks what a user sees: the exit code, the messages, the
metrics, and that the run's files are whole."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import REPO, run_cli

from aitrain_grpo.training.run.checkpoints import complete_checkpoints, is_complete

FAULTS_DIR = REPO / "tests" / "faults"
TINY_RUN = ["--rl-env-module", "fault_envs", "--rl-num-generations", "2", "--batch-size", "8"]

# What each fault of fault_envs.FaultyEnv must be reported as.
FAULT_MESSAGES = {
    "reset_raises": "FaultyEnv.reset raised RuntimeError: reset exploded",
    "step_raises": "FaultyEnv.step raised KeyError: 'no such door'",
    "step_hangs": "FaultyEnv.step timed out after 1s",
    "step_bad_reply": "FaultyEnv.step returned int; return a string, a list of messages, or None",
    "score_raises": "FaultyEnv.score_episode raised ZeroDivisionError: division by zero in the grader",
    "score_hangs": "FaultyEnv.score_episode timed out after 1s",
    "score_nan": "FaultyEnv.score_episode returned nan, outside [0, 1]",
    "score_inf": "FaultyEnv.score_episode returned inf, outside [0, 1]",
    "score_above_one": "FaultyEnv.score_episode returned 1.5, outside [0, 1]",
    "score_not_number": "FaultyEnv.score_episode returned str 'high', not a number in [0, 1]",
}


def records(output_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (output_dir / name).read_text().splitlines()]


def assert_finished_run_files(output_dir: Path, steps: int) -> None:
    summary = json.loads((output_dir / "run_summary.json").read_text())
    assert summary["completed"] and summary["global_step"] == steps
    assert [r["step"] for r in records(output_dir)] == list(range(1, steps + 1))
    assert json.loads((output_dir / "run_config.json").read_text())["rl_env_module"] == "fault_envs"
    from safetensors.torch import load_file

    assert load_file(str(output_dir / "adapter_model.safetensors"))  # the adapter is whole


def test_every_episode_fault_is_reported_and_training_goes_on(tmp_path, tiny_model_dir):
    """One run meets all ten faults (two episodes each) beside healthy episodes. The hung sync call
    sleeps for an hour: the others go on at its timeout, and the finished run exits without it."""
    out = tmp_path / "run"
    faults = ["ok", *FAULT_MESSAGES, "ok"]  # 12 tasks = 3 steps of 4 prompts, each task once
    result = run_cli(
        "grpo", *TINY_RUN, "--rl-env-class", "FaultyEnv", "--rl-env-config", json.dumps({"faults": faults}),
        "--model", tiny_model_dir, "--output-dir", str(out), "--max-steps", "3", "--rl-env-timeout", "1",
        "--rl-max-new-tokens", "96", "--rl-max-error-rate", "1", cwd=FAULTS_DIR, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 3 steps" in result.stdout and "Traceback" not in result.stderr
    for message in FAULT_MESSAGES.values():
        assert f"environment error (episode scored 0): {message}" in result.stderr, message
    # Two episodes hung in `step`: the process ends without waiting an hour for their threads.
    assert re.search(r"note: [12] environment call\(s\) that timed out are still running; exiting without them", result.stderr)
    steps = records(out)
    assert all(r["env/episodes"] == 8 for r in steps)
    assert sum(r["env/errors"] for r in steps) == 2 * len(FAULT_MESSAGES)
    assert_finished_run_files(out, 3)


def test_too_many_failing_episodes_stop_the_run_with_the_common_errors(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    # 10 of 16 tasks fail (62%), in four ways of different frequency; every step plays every task.
    faults = ["score_raises"] * 4 + ["score_nan"] * 3 + ["reset_raises"] * 2 + ["score_inf"] + ["ok"] * 6
    args = [
        "grpo", *TINY_RUN, "--batch-size", "32", "--rl-env-class", "FaultyEnv",
        "--rl-env-config", json.dumps({"faults": faults}), "--model", tiny_model_dir, "--output-dir", str(out),
        "--max-steps", "8", "--rl-max-new-tokens", "16",
    ]
    result = run_cli(*args, cwd=FAULTS_DIR)
    assert result.returncode == 1, result.stderr[-3000:]
    error = next(line for line in result.stderr.splitlines() if line.startswith("error: "))
    assert "80 of 128 episodes failed in steps 1-4 (62%), above --rl-max-error-rate 0.5" in error
    most_common = error.split("most common: ")[1]
    assert most_common.startswith(
        f"(32x) {FAULT_MESSAGES['score_raises']}; (24x) {FAULT_MESSAGES['score_nan']}; "
        f"(16x) {FAULT_MESSAGES['reset_raises']}; fix the environment"
    )
    assert "score_episode returned inf" not in error  # only the three most common
    assert f"checkpoint saved: {out / 'checkpoint-4'}" in result.stderr
    assert "resume with: aitrain grpo" in result.stderr
    assert is_complete(out / "checkpoint-4") and not (out / "run_summary.json").exists()
    assert [r["step"] for r in records(out)] == [1, 2, 3, 4]

    # The error window is part of the checkpoint: a resumed run that still fails stops after one step,
    # not after four new ones.
    again = run_cli(*args, "--resume-from-checkpoint", "auto", cwd=FAULTS_DIR)
    assert again.returncode == 1, again.stderr[-3000:]
    assert "failed in steps 2-5" in again.stderr
    assert [r["step"] for r in records(out)] == [1, 2, 3, 4, 5]
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-4", "checkpoint-5"]


def test_broken_tool_calls_become_error_messages_and_training_goes_on(tmp_path, tiny_model_dir):
    """Truncated JSON, a wrong type, an unknown tool, a tool that raises, a huge argument, arguments
    that are not an object, an unterminated call, and text that would be harmful if evaluated."""
    out = tmp_path / "run"
    result = run_cli(
        "grpo", *TINY_RUN, "--rl-env-class", "BadToolCallsEnv", "--model", tiny_model_dir,
        "--output-dir", str(out), "--max-steps", "2", "--rl-max-new-tokens", "64", cwd=FAULTS_DIR,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = records(out)
    assert all(r["env/errors"] == 0 for r in steps)
    answered = [r for r in steps if "env/bad_calls_misanswered" in r]
    assert answered, "no episode got past its first turn"
    # Every bad call came back as the expected `Error: ...` tool message, seven per episode.
    assert all(r["env/bad_calls_misanswered"] == 0 for r in answered)
    assert all(r["env/tool_errors"] % 7 == 0 for r in steps) and sum(r["env/tool_errors"] for r in steps) > 0
    assert not (FAULTS_DIR / "PWNED").exists() and not (REPO / "PWNED").exists()
    assert_finished_run_files(out, 2)


def test_a_generation_server_that_dies_mid_run_stops_with_a_checkpoint(tmp_path, refused_url):
    """The server answers two steps, then is gone (nothing listens on its port any more): the real
    server client gives up after its bounded retries, the last finished step is saved, and the
    message names the server."""
    from aitrain_grpo.engine.backends.base import GenerationBackend
    from aitrain_grpo.engine.backends.choice import build_backend
    from aitrain_grpo.models.loading import stop_token_ids
    from aitrain_grpo.engine.backends.vllm_server import VLLMServerBackend, VLLMServerClient
    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.engine.rollout import RolloutEngine
    from aitrain_grpo.engine.settings import EpisodeSettings
    from aitrain_grpo.training.run.stopping import TrainingStopped, clean_stops
    from aitrain_grpo.training.trainer import build_trainer
    from aitrain_grpo.training.trl.access import generation_handles
    from envs.letters import LetterEnv

    dead_url = refused_url  # held for the whole test: connection refused, and no other process can take it

    class ServerThatDies(GenerationBackend):
        def __init__(self, alive: GenerationBackend, calls_before_death: int):
            self.alive, self.calls = alive, calls_before_death
            self.dead = VLLMServerBackend(VLLMServerClient(dead_url, retries=2, backoff=0.01), "tiny", alive.stop_ids)
            self.stop_ids = alive.stop_ids

        def generate(self, prompts, max_tokens, sampling):
            self.calls -= 1
            return (self.alive if self.calls >= 0 else self.dead).generate(prompts, max_tokens, sampling)

    out = tmp_path / "run"
    config = RunConfig(
        rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(out), max_steps=6,
        batch_size=8, rl_max_new_tokens=16,
    )
    env = LetterEnv(turns=1, num_tasks=8)
    trainer = build_trainer(config, env=env)
    stop_ids = stop_token_ids(trainer.model, trainer.processing_class)
    backend = ServerThatDies(build_backend("hf", stop_ids, **generation_handles(trainer, "hf")), calls_before_death=2)
    trainer.rollout.engine = RolloutEngine(env, trainer.processing_class, backend, EpisodeSettings(max_new_tokens=16))
    with pytest.raises(TrainingStopped) as caught:
        with clean_stops(trainer):
            trainer.train()
    stop = caught.value
    assert stop.exit_code == 1
    assert f"generation backend failed at step 3: vLLM server at {dead_url}" in stop.reason
    assert stop.checkpoint == out / "checkpoint-2" and is_complete(stop.checkpoint)
    lines = stop.lines(["grpo", "--output-dir", str(out)])
    assert lines[0].startswith("error: generation backend failed")
    assert lines[-1] == f"resume with: aitrain grpo --output-dir {out} --resume-from-checkpoint auto"


def test_a_short_run_whose_episodes_all_fail_ends_with_an_error(tmp_path, tiny_model_dir):
    """Two steps are fewer than the error window (four): the run is judged at its last step, and a run
    where every episode timed out ends with exit 1 and the reason, not 'done'."""
    out = tmp_path / "run"
    result = run_cli(
        "grpo", *TINY_RUN, "--rl-env-class", "FaultyEnv", "--rl-env-config", json.dumps({"faults": ["score_raises"] * 4}),
        "--model", tiny_model_dir, "--output-dir", str(out), "--max-steps", "2", "--rl-max-new-tokens", "8",
        cwd=FAULTS_DIR, timeout=300,
    )
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "done:" not in result.stdout
    error = next(line for line in result.stderr.splitlines() if line.startswith("error: "))
    assert "16 of 16 episodes failed in steps 1-2 (100%)" in error
