"""Crash, kill and resume: checkpoints are written then renamed, `--resume-from-checkpoint auto` takes
the newest complete one, and a resumed run continues its step count, its logs and its data order."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import REPO, run_cli

from aitrain_grpo.training.run.checkpoints import checkpoint_step, complete_checkpoints, is_complete
from aitrain_grpo.config import ConfigError
from helpers.letters import letters_config
from envs.letters import LetterEnv

FAULTS_DIR = REPO / "tests" / "faults"
SLOW_RUN = [
    "--rl-env-module", "fault_envs", "--rl-env-class", "SlowLetters",
    "--rl-env-config", '{"delay": 0.4, "turns": 1, "num_tasks": 16}',
    "--batch-size", "8", "--rl-max-new-tokens", "16", "--save-steps", "2", "--save-total-limit", "2", "--max-steps", "6",
]


def steps_logged(output_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def test_sigkill_after_a_checkpoint_then_resume_auto_continues_the_run(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    args = [*SLOW_RUN, "--model", tiny_model_dir, "--output-dir", str(out)]
    log = (tmp_path / "killed.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "aitrain_grpo", "grpo", *args], cwd=FAULTS_DIR, stdout=log, stderr=log,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    deadline = time.monotonic() + 300
    try:
        while not complete_checkpoints(out):
            assert process.poll() is None, (tmp_path / "killed.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (out / "run_summary.json").exists(), "the run finished before it was killed; slow it down"
    newest = checkpoint_step(complete_checkpoints(out)[-1])
    # What a kill during a save would leave: a half-written folder under the final name (a writer
    # that does not rename), and one of ours still being staged. Neither may be resumed from.
    (out / "checkpoint-50").mkdir()
    (out / "checkpoint-50" / "adapter_config.json").write_text("{}")
    (out / ".partial-checkpoint-60" / "checkpoint-60").mkdir(parents=True)

    again = run_cli("grpo", *args, "--resume-from-checkpoint", "auto", cwd=FAULTS_DIR)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {out / f'checkpoint-{newest}'} (step {newest})" in again.stdout
    first_step = next(line for line in again.stdout.splitlines() if line.startswith("step "))
    assert first_step.startswith(f"step {newest + 1}/6"), first_step
    assert steps_logged(out) == list(range(1, 7))  # every step exactly once, across the kill
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["global_step"] == 6
    assert (out / "adapter_model.safetensors").exists() and (out / "adapter_config.json").exists()
    # --save-total-limit 2 keeps the two newest complete checkpoints; the broken folder is not ours to count.
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-4", "checkpoint-6"]
    assert json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6
    assert not (out / ".partial-checkpoint-60").exists()


class RecordingLetters(LetterEnv):
    """envs.letters that records which task each episode plays, in the order steps play them."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tasks: list[int] = []
        self.lock = threading.Lock()

    def reset(self, episode):
        with self.lock:
            self.tasks.append(episode.row["task"])

    def per_step(self, batch: int = 8) -> list[list[int]]:
        return [sorted(self.tasks[i:i + batch]) for i in range(0, len(self.tasks), batch)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Five steps over four tasks (two per step, so a new shuffle every two steps), checkpoint at 3."""
    from aitrain_grpo.training.trainer import train

    out = tmp_path_factory.mktemp("uninterrupted")
    env = RecordingLetters(turns=1, num_tasks=4)
    train(letters_config(out), env=env)
    return out, env


def test_resuming_mid_epoch_replays_the_same_prompts_and_numbers(uninterrupted, tmp_path):
    from aitrain_grpo.training.trainer import train

    first_out, first_env = uninterrupted
    out = tmp_path / "resumed"
    env = RecordingLetters(turns=1, num_tasks=4)
    train(letters_config(out, resume_from_checkpoint=str(first_out / "checkpoint-3")), env=env)
    # Steps 4 and 5 (the rest of epoch 1, then epoch 2) see the tasks the uninterrupted run saw.
    assert env.per_step() == first_env.per_step()[3:5]
    assert first_env.per_step()[2:4] != first_env.per_step()[0:2]  # epochs really are shuffled differently
    # Same weights, optimizer, RNG and data: the same rewards and losses.
    before = {r["step"]: r for r in map(json.loads, (first_out / "metrics.jsonl").read_text().splitlines())}
    after = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert sorted(after) == [4, 5]
    for step in (4, 5):
        assert after[step]["reward"] == pytest.approx(before[step]["reward"], abs=1e-6)
        assert after[step]["loss"] == pytest.approx(before[step]["loss"], abs=1e-6)


def test_a_save_that_fails_midway_leaves_no_checkpoint_behind(tmp_path):
    """A save cut short (here: the disk fills up after the weights are written) leaves only the
    staging folder; `auto` goes on taking the last complete checkpoint."""
    from aitrain_grpo.training.run.checkpoints import resume_checkpoint
    from aitrain_grpo.training.trainer import build_trainer

    out = tmp_path / "run"
    config = letters_config(out, max_steps=4, save_steps=2)
    trainer = build_trainer(config, env=RecordingLetters(turns=1, num_tasks=4))
    real_save_rng = trainer._save_rng_state

    def disk_full_at_step_4(output_dir):
        if trainer.state.global_step == 4:
            raise OSError(28, "No space left on device")
        real_save_rng(output_dir)

    trainer._save_rng_state = disk_full_at_step_4
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    assert is_complete(out / "checkpoint-2")
    assert not (out / "checkpoint-4").exists()
    assert (out / ".partial-checkpoint-4" / "checkpoint-4" / "adapter_model.safetensors").exists()
    assert resume_checkpoint(letters_config(out, resume_from_checkpoint="auto")) == out / "checkpoint-2"


def test_run_state_is_saved_with_the_checkpoint(uninterrupted):
    out, _ = uninterrupted
    state = json.loads((out / "checkpoint-3" / "aitrain_state.json").read_text())
    assert state["global_step"] == 3
    assert state["settings"] == {"batch_size": 8, "rl_num_generations": 4, "gradient_accumulation_steps": 1, "seed": 7}
    errors = state["parts"]["error_rate"]
    assert errors["episodes_total"] == 24 and errors["errors_total"] == 0 and len(errors["window"]) == 3


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (dict(resume_from_checkpoint="{out}/nope"), ["does not exist", "auto"]),
        (dict(resume_from_checkpoint="{out}"), ["is a run folder, not a checkpoint", "checkpoint-5"]),
        (dict(resume_from_checkpoint="{out}/checkpoint-3", batch_size=12, rl_num_generations=4),
         ["was trained with --batch-size 8", "resume with --batch-size 8"]),
        (dict(resume_from_checkpoint="{out}/checkpoint-3", seed=1), ["--seed 7"]),
        (dict(resume_from_checkpoint="{out}/checkpoint-3", rl_context="summarize"),
         ["was trained without --rl-context", "this run has --rl-context summarize", "resume without --rl-context"]),
        (dict(resume_from_checkpoint="{out}/checkpoint-3", rl_curriculum="pools"),
         ["was trained with --rl-curriculum off", "resume with --rl-curriculum off"]),
    ],
)
def test_bad_resume_targets_are_refused_before_loading(uninterrupted, overrides, fragments):
    from aitrain_grpo.training.run.folder import check_output_dir_for_run

    out, _ = uninterrupted
    overrides = {k: v.format(out=out) if isinstance(v, str) else v for k, v in overrides.items()}
    config = letters_config(out / "elsewhere", **overrides).validate()
    with pytest.raises(ConfigError) as caught:
        check_output_dir_for_run(config)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_a_finished_run_is_refused_without_resume_or_overwrite(uninterrupted):
    from aitrain_grpo.training.run.folder import check_output_dir_for_run

    out, _ = uninterrupted
    assert (out / "run_summary.json").exists()
    with pytest.raises(ConfigError, match="already holds a finished run"):
        check_output_dir_for_run(letters_config(out, max_steps=8))


LOG_FILES = ("metrics.jsonl", "scores.jsonl", "episodes.jsonl")


def steps_in(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """A finished 4-step run with checkpoints at 2 and 4, one episode logged per step in every log file."""
    from aitrain_grpo.training.trainer import train

    out = tmp_path_factory.mktemp("four") / "run"
    train(letters_config(out, max_steps=4, save_steps=2, log_episodes_every=1, log_episodes_count=1),
          env=LetterEnv(turns=1, num_tasks=4))
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]
    for name in LOG_FILES:
        assert steps_in(out / name) == [1, 2, 3, 4], name
    return out


def test_resuming_behind_the_logs_cuts_them_back_so_each_step_is_logged_once(four_steps, tmp_path):
    """The logs reach step 4 but the newest checkpoint is 2 (as after a crash between a log line and the
    next save): the resumed run redoes steps 3 and 4, and their first records must go."""
    from aitrain_grpo.training.trainer import train

    out = tmp_path / "run"
    shutil.copytree(four_steps, out)
    shutil.rmtree(out / "checkpoint-4")
    env = RecordingLetters(turns=1, num_tasks=4)
    summary = train(letters_config(out, max_steps=4, save_steps=2, log_episodes_every=1, log_episodes_count=1,
                                   resume_from_checkpoint="auto"), env=env)
    assert summary["global_step"] == 4 and len(env.per_step()) == 2  # it played steps 3 and 4 only
    for name in LOG_FILES:
        assert steps_in(out / name) == [1, 2, 3, 4], name


def test_a_finished_run_resumed_with_more_steps_trains_them_and_logs_steps_1_to_8(four_steps, tmp_path):
    from aitrain_grpo.training.trainer import train

    out = tmp_path / "run"
    shutil.copytree(four_steps, out)
    env = RecordingLetters(turns=1, num_tasks=4)
    summary = train(letters_config(out, max_steps=8, save_steps=2, log_episodes_every=1, log_episodes_count=1,
                                   resume_from_checkpoint="auto"), env=env)
    assert summary["global_step"] == 8 and len(env.per_step()) == 4  # steps 5 to 8, not a fresh start
    for name in LOG_FILES:
        assert steps_in(out / name) == list(range(1, 9)), name
    assert complete_checkpoints(out)[-1].name == "checkpoint-8"


def test_an_incomplete_checkpoint_path_is_refused(tmp_path):
    from aitrain_grpo.training.run.folder import check_output_dir_for_run

    broken = tmp_path / "checkpoint-9"
    broken.mkdir()
    (broken / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        check_output_dir_for_run(letters_config(tmp_path / "o", resume_from_checkpoint=str(broken)))
    # Both state files, but no weights (transformers' traceback) or no optimizer state (Adam restarted, unsaid).
    for name in ("trainer_state.json", "aitrain_state.json"):
        (broken / name).write_text("{}")
    (broken / "adapter_model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"lacks its weights and its optimizer state \(optimizer.pt\), so it cannot "
                                          r"be resumed as it was saved; pass an earlier checkpoint-N"):
        check_output_dir_for_run(letters_config(tmp_path / "o", resume_from_checkpoint=str(broken)))
    (broken / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"lacks its optimizer state \(optimizer.pt\)"):
        check_output_dir_for_run(letters_config(tmp_path / "o", resume_from_checkpoint=str(broken)))
    # best/ (what --save-best keeps) is a model to start from, not a checkpoint that was cut off.
    best = tmp_path / "run" / "best"
    best.mkdir(parents=True)
    (best / "adapter_model.safetensors").write_bytes(b"")
    (best / "best.json").write_text('{"metric": "eval/success", "value": 0.5, "step": 4}')
    with pytest.raises(ConfigError, match=rf"is the best model --save-best kept .*; train on from it with --model {best} "
                                          r"in a new --output-dir, or resume from a checkpoint-N folder"):
        check_output_dir_for_run(letters_config(tmp_path / "o", resume_from_checkpoint=str(best)))


def test_a_fresh_start_over_an_unfinished_run_needs_overwrite(tmp_path):
    from aitrain_grpo.training.run.folder import check_output_dir_for_run
    from aitrain_grpo.training.trainer import train

    out = tmp_path / "run"
    checkpoint = out / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / "aitrain_state.json").write_text("{}")
    with pytest.raises(ConfigError) as caught:
        check_output_dir_for_run(letters_config(out))
    assert "unfinished run (newest: checkpoint-2)" in str(caught.value)
    assert "--resume-from-checkpoint auto" in str(caught.value) and "--overwrite" in str(caught.value)
    # --overwrite starts over, and the old run's checkpoints go (a later `auto` must not find them).
    train(letters_config(out, overwrite=True, max_steps=1, save_steps=None), env=RecordingLetters(turns=1, num_tasks=4))
    assert not checkpoint.exists() and steps_logged(out) == [1]


@pytest.mark.parametrize("change, flag", [
    ({"rl_env_class": "HotelEnv", "rl_env_module": "envs.hotel"}, "--rl-env-module envs.letters"),
    ({"rl_env_config": {"letter": "b"}}, "--rl-env-config"),
    ({"model": "smollm2"}, "--model tiny"),
    ({"lora_r": 4}, "--lora-r 16"),
    ({"batch_size": 4}, "--batch-size 8"),
    ({"use_dora": True}, "--use-dora False"),
    # the optimizer whose state the checkpoint holds: SGD failed reading AdamW's (a KeyError), and a changed
    # beta would have been replaced by the checkpoint's without a word
    ({"optim": "sgd"}, "--optim"),
    ({"adam_beta2": 0.95}, "--adam-beta2"),
])
def test_a_resume_that_would_cross_runs_is_refused_naming_what_differs(uninterrupted, change, flag):
    """Checkpoints of a LetterEnv run continue only that run: another environment, environment config,
    model or adapter shape is a one-line error, before anything is loaded or written."""
    from aitrain_grpo.errors import ConfigError
    from aitrain_grpo.training.run.checkpoints import resume_checkpoint

    out, _ = uninterrupted
    written = (out / "run_config.json").read_text()
    with pytest.raises(ConfigError, match=f"was trained with(out)? {flag}") as raised:
        resume_checkpoint(letters_config(out, resume_from_checkpoint="auto", **change))
    assert "\n" not in str(raised.value)
    assert resume_checkpoint(letters_config(out, resume_from_checkpoint="auto")) == out / "checkpoint-5"  # same run: fine
    assert (out / "run_config.json").read_text() == written
