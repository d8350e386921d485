"""The step-limit profile (benchmarks/step_limit.py) runs on the tiny model: real aitrain steps, then
the same work bare, and it prints the ratio per phase and for the whole step, and records it with its
command. No timing is asserted here: timings belong in benchmarks/STEP_LIMIT.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_the_profile_runs_and_prints_its_ratio(tiny_model_dir, tmp_path):
    record = tmp_path / "STEP_LIMIT.md"
    done = subprocess.run(
        [sys.executable, "benchmarks/step_limit.py", "--model", tiny_model_dir, "--vllm", "off",
         "--set", "rl_max_new_tokens=8", "--record", str(record), "--label", "ci"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert re.search(r"^ratio step / bare: \d+\.\d\dx \(training part: \d+\.\d\dx\)$", out, re.M), out
    for phase in ("rollout", "score", "ref_logprobs", "loss_forward_backward", "optimizer_step", "step"):
        assert re.search(rf"^\| {phase} \| \d+\.\d\d \| ", out, re.M), phase  # every phase timed, both sides
    loss = re.search(r"^\| loss_forward_backward \| [\d.]+ \| [\d.]+ \| (\d+\.\d\d)x \|$", out, re.M)
    assert loss and float(loss.group(1)) > 0, out  # the trainer's loss phase was timed, and the bare one
    assert "Bare generation: hf " in out
    text = record.read_text()
    assert text.startswith("\n## ci: ") and "benchmarks/step_limit.py --model" in text and "**" in text
