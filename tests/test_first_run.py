"""README's first run learns the task as README describes it, and says nothing is wrong.

`aitrain grpo --config examples/quickstart.yaml` (the tiny model on envs.letters, 60 steps) then the command
it prints, `aitrain eval --model RUN --baseline tiny --episodes 32`: the trained model solves episodes the
base model does not (success rate above the base's: measured 53-97% against 0% on seeds 42, 0, 1, 2 and 3,
benchmarks/FIRST_RUN.md), and the run prints no warning (before issue 35 it learned to fill its first turn
with " a a a" until cut, and warned of a shortcut and of a low score). The default seed, as a newcomer runs
it; about 20 s of steps on two cores.
"""

from __future__ import annotations

import re

import pytest

from helpers import REPO, run_cli


def _row(table: str, label: str) -> list[str]:
    match = re.search(rf"{label}\s*│\s*(\S+)\s*│\s*(\S+)", table)
    assert match, table
    return list(match.groups())


@pytest.mark.slow
def test_the_first_run_learns_the_task_and_warns_of_nothing(tmp_path):
    out = tmp_path / "letterenv"
    run = run_cli("grpo", "--config", "examples/quickstart.yaml", "--output-dir", str(out), cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "warning" not in run.stdout.lower(), [line for line in run.stdout.splitlines() if "warning" in line.lower()]
    assert f"next: aitrain eval --model {out} --baseline tiny --episodes 32" in run.stdout
    evaluated = run_cli("eval", "--model", str(out), "--baseline", "tiny", "--episodes", "32", cwd=REPO)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    trained, base = (float(v.rstrip("%")) for v in _row(evaluated.stdout, "success rate"))
    assert trained > base + 25, evaluated.stdout  # measured 96.9% against 0.0% on this seed
    turns, _ = (float(v) for v in _row(evaluated.stdout, "mean turns"))
    assert turns == 3.0, evaluated.stdout  # every episode plays its three turns: no turn cut short
    # Not asserted: eval's "the model plays differently: turns per episode 3.00 against the baseline's 2.00"
    # (runlog/shortcuts.py's eval rule): a false alarm, since finishing the three turns the task asks for is
    # what was learned (the base's episodes end early on cut turns); left to that rule's owner.
