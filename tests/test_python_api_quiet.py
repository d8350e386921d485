"""A run started from Python (`aitrain_grpo.train`, README's "From Python") on a fresh machine prints
neither transformers' FutureWarning about `is_gradient_checkpointing` (silenced by training/trainer.py, as
commands/quiet.py does for the command line) nor its "Writing model shards" bar while the built-in tiny
model is built into an empty cache (models/tiny.py). One step of envs.letters in a subprocess, with its own
cache: about 20 seconds."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import REPO

SCRIPT = """
from aitrain_grpo import RunConfig, train
train(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", rl_env_config={"turns": 1, "num_tasks": 8},
                max_steps=1, batch_size=4, rl_num_generations=2, rl_max_new_tokens=16, output_dir=OUT))
"""


def test_a_python_run_on_a_fresh_cache_prints_neither_the_warning_nor_the_shards_bar(tmp_path):
    script = SCRIPT.replace("OUT", repr(str(tmp_path / "out")))
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, OMP_NUM_THREADS="1", AITRAIN_CACHE_DIR=str(tmp_path / "cache")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "cache").is_dir() and (tmp_path / "out" / "run_summary.json").is_file()  # built, trained
    assert "is_gradient_checkpointing" not in result.stderr, result.stderr[-3000:]
    assert "Writing model shards" not in result.stderr, result.stderr[-3000:]
