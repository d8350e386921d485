"""The step's numbers before and after a change to the training step, on fixed seeds: a few short runs
over the step's paths (turn credit, KL against the reference, dropped groups, several micro-batches,
history rewritten mid-episode), each writing its per-step loss, gradient norm, reward, KL and entropy.

    OMP_NUM_THREADS=1 python benchmarks/step_equivalence.py --out before.json          # on the old code
    OMP_NUM_THREADS=1 python benchmarks/step_equivalence.py --out after.json --compare before.json

`--compare` prints each run's largest relative difference per metric and exits 1 when one exceeds
`--tolerance` (float summation order may move the last digits; a changed batch moves the first).
`--model smollm2 --cases turn-credit,kl-drop` runs on SmolLM2-135M (minutes a case; its summaries do not fit the
`rewritten` case's 16-token turns, which the run's error-rate stop then ends).

Recorded (issue 47's step against 8741e36, TRL's): tiny model, all four cases, 3 steps: identical to the last
digit but `rewritten` (1.1e-6 relative on the loss, float summation order); SmolLM2, turn-credit and kl-drop,
2 steps: identical.

Left out: vLLM engines (their sampling is not bitwise repeatable on a CPU) and several processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = {
    "turn-credit": ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--rl-advantage", "turn",
                    "--rl-cut-turn", "end"],
    "kl-drop": ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--rl-kl-coef", "0.1",
                "--rl-zero-std-groups", "drop"],
    "micro-batches": ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--micro-batch-size", "2",
                      "--rl-kl-coef", "0.05", "--rl-loss-type", "grpo"],
    "rewritten": ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--rl-context", "summarize",
                  "--rl-context-threshold", "60", "--rl-kl-coef", "0.05", "--rl-advantage", "turn"],
}
KEYS = ("loss", "grad_norm", "reward", "kl", "entropy", "sequences/per_episode")


def run_case(name: str, flags: list[str], model: str, steps: int) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run"
        command = [sys.executable, "-m", "aitrain_grpo", "grpo", "--model", model, "--output-dir", str(out),
                   "--max-steps", str(steps), "--batch-size", "8", "--rl-num-generations", "4",
                   "--rl-max-new-tokens", "16", "--seed", "0", "--lr", "3e-3", *flags]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [{key: line[key] for key in KEYS if key in line} for line in lines if "loss" in line]


def compare(after: dict, before: dict, tolerance: float) -> bool:
    ok = True
    for case, steps in before.items():
        worst: dict[str, float] = {}
        for old, new in zip(steps, after.get(case, [])):
            for key, value in old.items():
                diff = abs(new.get(key, float("nan")) - value) / max(abs(value), 1e-6)
                worst[key] = max(worst.get(key, 0.0), diff)
        bad = {k: v for k, v in worst.items() if not v <= tolerance}
        ok &= not bad
        print(f"{case:14s} {'ok ' if not bad else 'DIFF'} " + " ".join(f"{k}={v:.2e}" for k, v in worst.items()))
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    results = {name: run_case(name, CASES[name], args.model, args.steps) for name in args.cases.split(",")}
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if args.compare:
        sys.exit(0 if compare(results, json.loads(Path(args.compare).read_text()), args.tolerance) else 1)


if __name__ == "__main__":
    main()
