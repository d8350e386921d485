"""Two `aitrain grpo` started together without `--output-dir` (issue 35, item 2) used to both take
`outputs/<env class>`: metrics.jsonl held steps 1,1,2,2 and one adapter overwrote the other, exit 0 for both.
Now the second to plan finds the folder locked (or holding the first's run) and goes to the next numbered
one: each run ends in a folder of its own, with its steps logged once. Real processes on the tiny model,
as a user starts them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import REPO

FAULTS_DIR = REPO / "tests" / "faults"


def test_two_runs_started_together_never_share_a_folder(tmp_path, tiny_model_dir):
    args = [sys.executable, "-m", "aitrain_grpo", "grpo", "--model", tiny_model_dir, "--rl-env-module", "fault_envs",
            "--rl-env-class", "SlowLetters", "--rl-env-config", '{"delay": 0.5, "turns": 1, "num_tasks": 8}',
            "--batch-size", "4", "--rl-max-new-tokens", "8", "--max-steps", "2"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(FAULTS_DIR), str(REPO)]))
    runs = [subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [run.communicate(timeout=600) for run in runs]
    for run, (stdout, stderr) in zip(runs, results):
        assert run.returncode == 0, stderr[-3000:]
    folders = sorted(p.name for p in (tmp_path / "outputs").iterdir())
    assert folders == ["slowletters", "slowletters-2"], folders
    for name in folders:
        steps = [json.loads(line)["step"] for line in (tmp_path / "outputs" / name / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2], (name, steps)
        assert (tmp_path / "outputs" / name / "run_summary.json").is_file()
        assert not (tmp_path / "outputs" / name / ".aitrain.lock").exists()  # a finished run frees its folder
    notes = [line for _, stderr in results for line in stderr.splitlines() if "so this run writes to" in line]
    assert len(notes) == 1 and notes[0].endswith(("(pass --output-dir to choose the folder)",
                                                 "or --overwrite to replace outputs/slowletters)")), notes
