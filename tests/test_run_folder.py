"""What a training run may do to its output folder (issue 35, items 1, 2 and 6): a resume with nothing
left to train is refused before it rewrites a finished run, `auto` with no checkpoint says it starts
fresh, a live run's folder is locked against a second run (a dead run's lock is taken over, a default
folder moves to the next number), and `--overwrite` replaces only a folder of its own kind, saying what
it removes. Every refusal is one line, exit 2, nothing on disk changed.

The commands run in-process through typer's runner, the lock holder in a subprocess of its own (a lock is
per process); every refusal comes before a model loads, so the file takes seconds."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.outputs import LOCK_NAME
from aitrain_grpo.training.run import lock as run_lock
from aitrain_grpo.training.run.checkpoints import STEP_SHAPE
from aitrain_grpo.training.run.plan import plan_run
from helpers.cli import refused

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]




def finished_run(folder: Path, *, steps: int = 2, env: tuple[str, str] = ("envs.letters", "LetterEnv"),
                 by_epochs: bool = False) -> Path:
    """A finished run's files as `grpo` leaves them: checkpoint-N with both state files, run_config.json
    (the default options, so a resume with them passes the same-run check), summary and metrics. A run
    `by_epochs` had no --max-steps: its length is HF Trainer's `max_steps` in trainer_state.json."""
    config = RunConfig(rl_env_module=env[0], rl_env_class=env[1], output_dir=str(folder),
                       max_steps=None if by_epochs else steps)
    checkpoint = folder / f"checkpoint-{steps}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": steps, "max_steps": steps}))
    settings = {name: getattr(config, name) for name in STEP_SHAPE}
    (checkpoint / "aitrain_state.json").write_text(json.dumps({"global_step": steps, "settings": settings}))
    for part in ("adapter_model.safetensors", "optimizer.pt"):  # what a resume checks is there
        (checkpoint / part).write_bytes(b"")
    (folder / "run_config.json").write_text(json.dumps(dataclasses.asdict(config), default=str))
    (folder / "run_summary.json").write_text(json.dumps({"global_step": steps}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, steps + 1)))
    return folder


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    run_lock.release_all()


# ------------------------------------------------------------------------------------------ 1: resume


@pytest.mark.parametrize("max_steps", ["1", "2"])
def test_a_resume_with_no_steps_left_is_refused_before_it_rewrites_the_run(project, max_steps):
    run = finished_run(project / "run", steps=2)
    refused(["grpo", *LETTERS, "--output-dir", str(run), "--resume-from-checkpoint", "auto", "--max-steps", max_steps],
            project, "already at step 2", f"--max-steps {max_steps} leaves nothing to train", "--max-steps above 2")
    assert not (run / LOCK_NAME).exists()


def test_a_resume_of_a_run_that_finished_its_epochs_is_refused_unless_they_grow(project):
    run = finished_run(project / "run", steps=2, by_epochs=True)
    refused(["grpo", *LETTERS, "--output-dir", str(run), "--resume-from-checkpoint", "auto"], project,
            "already at step 2, the last of its --epochs 1", "pass --epochs above 1 or --max-steps above 2")
    plan = plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(run),
                              resume_from_checkpoint="auto", epochs=2.0))
    assert plan.resume == run / "checkpoint-2"


def test_a_resume_with_steps_left_is_planned(project):
    run = finished_run(project / "run", steps=2)
    plan = plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(run),
                              resume_from_checkpoint="auto", max_steps=3))
    assert plan.resume == run / "checkpoint-2"


@pytest.mark.parametrize("schedule, noted", [("linear", True), ("cosine", True), ("constant_with_warmup", False)])
def test_a_resume_that_moves_the_last_step_says_the_learning_rate_jumps(project, capsys, schedule, noted):
    run = finished_run(project / "run", steps=2)  # planned for 2 steps
    plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(run),
                       resume_from_checkpoint="auto", max_steps=4, lr_scheduler=schedule))
    notes = [line for line in capsys.readouterr().err.splitlines() if "jumps" in line]
    assert notes == ([f"note: checkpoint-2 comes from a run planned for 2 steps and this one has 4: --lr-scheduler "
                      f"{schedule} is laid out anew over 4 steps, so the learning rate jumps at step 2; --lr-scheduler "
                      f"constant_with_warmup extends a run evenly"] if noted else [])


def test_auto_with_no_checkpoint_starts_fresh_and_says_so(project, capsys):
    plan = plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir="new",
                              resume_from_checkpoint="auto"))
    assert plan.resume is None
    notes = [line for line in capsys.readouterr().err.splitlines() if "found no checkpoint" in line]
    assert notes == ["note: --resume-from-checkpoint auto found no checkpoint in new, so this run starts fresh there"]


# ------------------------------------------------------------------------------------------ 2: the lock


HOLDER = ("import sys, time; from pathlib import Path; from aitrain_grpo.training.run.lock import lock_output_dir; "
          "lock_output_dir(Path(sys.argv[1])); print('locked', flush=True); time.sleep(600)")


def hold_lock(folder: Path) -> subprocess.Popen:
    """Another process (a live run, as far as the lock can tell) holding `folder`'s lock."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_run_into_a_live_runs_folder_is_refused_naming_its_pid(project):
    holder = hold_lock(project / "busy")
    try:
        error = refused(["grpo", *LETTERS, "--output-dir", "busy"], project,
                        f"in use by a live run (pid {holder.pid})", "another --output-dir")
        assert "\n" not in error
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_runs_lock_is_taken_over(project):
    holder = hold_lock(project / "left")
    holder.send_signal(signal.SIGKILL)  # no clean-up: the lock file stays, the kernel drops the lock
    holder.wait()
    assert (project / "left" / LOCK_NAME).read_text().strip() == str(holder.pid)
    plan = plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir="left"))
    assert plan.output_dir == Path("left")
    assert (project / "left" / LOCK_NAME).read_text().strip() == str(os.getpid())
    run_lock.release_all()
    assert not (project / "left" / LOCK_NAME).exists()


def test_a_busy_default_folder_moves_the_run_to_the_next_number(project, capsys):
    holder = hold_lock(project / "outputs" / "letterenv")
    try:
        plan = plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv"))
    finally:
        holder.kill()
        holder.wait()
    assert plan.output_dir == Path("outputs/letterenv-2")
    assert f"outputs/letterenv is in use by a live run (pid {holder.pid}), so this run writes to " \
           f"outputs/letterenv-2" in capsys.readouterr().err


def test_the_lock_leaves_nothing_behind_when_the_run_ends(project):
    plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir="a/b"))
    assert (project / "a" / "b" / LOCK_NAME).is_file()
    plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir="a/b"))  # same process
    run_lock.release_all()
    assert not (project / "a").exists()


def test_a_folder_that_cannot_be_written_is_refused_in_one_line(project, monkeypatch):
    """A resume into a run folder of someone else's (read-only to this user; root writes anywhere, so the
    refusal of the lock file is simulated)."""
    run = finished_run(project / "run", steps=2)
    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(LOCK_NAME):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(run_lock.os, "open", read_only)
    refused(["grpo", *LETTERS, "--output-dir", str(run), "--resume-from-checkpoint", "auto", "--max-steps", "4"],
            project, f"--output-dir {run} cannot be written (Permission denied)", "pass a folder you can write to")


# ------------------------------------------------------------------------------------------ 6: overwrite


def test_grpo_overwrite_replaces_only_a_run_of_the_same_environment(project, capsys):
    other = finished_run(project / "hotel", env=("envs.hotel", "HotelEnv"))
    refused(["grpo", *LETTERS, "--output-dir", str(other), "--overwrite"], project,
            "holds a run of envs.hotel.HotelEnv, not envs.letters.LetterEnv", "new --output-dir")
    export = project / "export"
    export.mkdir()
    (export / "export_info.json").write_text("{}")
    (export / "run_config.json").write_text("{}")
    refused(["grpo", *LETTERS, "--output-dir", str(export), "--overwrite"], project, "holds an exported model")
    same = finished_run(project / "letters", steps=2)
    plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(same), overwrite=True))
    assert f"--overwrite replaces the earlier run in {same}: removes checkpoint-2, run_summary.json" \
           in capsys.readouterr().err


def test_sft_overwrite_replaces_only_a_run_of_the_same_environment(project):
    other = finished_run(project / "hotel", env=("envs.hotel", "HotelEnv"))
    refused(["sft", *LETTERS, "--output-dir", str(other), "--overwrite"], project,
            "holds a run of envs.hotel.HotelEnv, not envs.letters.LetterEnv")


def test_tiny_model_and_export_overwrite_never_replace_a_training_run(project, tiny_model_dir):
    run = finished_run(project / "run")
    (run / "aitrain_tiny.json").write_text("{}")  # a --no-peft run of the tiny model copies its files
    refused(["tiny-model", str(run), "--overwrite"], project, "holds a training run, not a tiny model")
    source = project / "source"
    shutil.copytree(tiny_model_dir, source)  # a full model folder, as a --no-peft run leaves
    (source / "run_config.json").write_text(json.dumps({"rl_env_module": "envs.letters", "rl_env_class": "LetterEnv"}))
    refused(["export", str(source), "--to", str(run), "--overwrite"], project,
            "holds a training run, not an exported model")


def test_the_kind_rule_is_what_every_folder_output_checks(tmp_path):
    from aitrain_grpo.outputs import check_folder_output

    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "aitrain_tiny.json").write_text("{}")
    assert check_folder_output(tiny, flag="OUTPUT_DIR", overwrite=True, kind="tiny") == tiny
    with pytest.raises(ConfigError, match="holds a tiny model, not an exported model"):
        check_folder_output(tiny, flag="--to", overwrite=True, kind="export")
