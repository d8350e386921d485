"""A run given no --output-dir whose default folder holds earlier runs, and whose next numbered folder a
live run holds, goes to the next number after that (outputs/letterenv-4), never to a number of a number
(outputs/letterenv-3-2): training/run/lock.py's `claim_output_dir` numbers from the default folder. Seconds:
nothing loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.training.run import lock as run_lock
from aitrain_grpo.training.run.plan import plan_run

HOLDER = ("import sys, time; from pathlib import Path; from aitrain_grpo.training.run.lock import lock_output_dir; "
          "lock_output_dir(Path(sys.argv[1])); print('locked', flush=True); time.sleep(600)")


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    run_lock.release_all()


def finished(folder: Path) -> None:
    """The files that make `folder` an earlier, finished run as far as the numbering can tell."""
    folder.mkdir(parents=True)
    (folder / "run_config.json").write_text(json.dumps({"rl_env_module": "envs.letters", "rl_env_class": "LetterEnv"}))
    (folder / "run_summary.json").write_text(json.dumps({"global_step": 1}))


def test_a_live_run_in_the_next_numbered_folder_moves_the_run_to_the_number_after(project, capsys):
    finished(project / "outputs" / "letterenv")
    finished(project / "outputs" / "letterenv-2")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(project / "outputs" / "letterenv-3")],
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    try:
        assert holder.stdout.readline().strip() == "locked"  # a live run that has written nothing yet
        plan = plan_run(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv"))
    finally:
        holder.kill()
        holder.wait()
    assert plan.output_dir == Path("outputs/letterenv-4")
    assert not (project / "outputs" / "letterenv-3-2").exists()
    assert "so this run writes to outputs/letterenv-4" in capsys.readouterr().err
