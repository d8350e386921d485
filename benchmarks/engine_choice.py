"""Which generation engine makes the fastest training step on this machine: the same run (model,
environment, seed, batch) trained with each engine, steps timed by the run's own `time/*` metrics.

    OMP_NUM_THREADS=1 python benchmarks/engine_choice.py                                  # tiny model
    OMP_NUM_THREADS=1 python benchmarks/engine_choice.py --model smollm2 --env envs.rewrite:RewriteEnv \\
        --steps 4 --record benchmarks/ENGINE_CHOICE.md

Engines: Hugging Face `generate` under the lockstep schedule (every running episode's turn in one call)
and under the continuous one (a finished episode's slot refilled: engine/turn_batcher.py), and vLLM
colocated in the trainer where vLLM is installed (`--use-vllm --vllm-mode colocate`). Each engine runs in
its own process, one after another; the first step warms up and is left out. Reported per engine: the
mean step, rollout, training and scoring-forward time (wall seconds; `--clock cpu` is not available across processes) and
each as a ratio to Hugging Face lockstep in the same invocation, with the spread of the steps.

Left out: vLLM servers (another process's CPU time is not the trainer's), several processes, GPUs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ENGINES = {
    "hf-lockstep": ["--no-use-vllm", "--rl-rollout-schedule", "lockstep"],
    "hf-continuous": ["--no-use-vllm", "--rl-rollout-schedule", "continuous"],
    "vllm-colocate": ["--use-vllm", "--vllm-mode", "colocate"],
}


def run(engine: str, args) -> list[dict]:
    module, _, cls = args.env.partition(":")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run"
        command = [sys.executable, "-m", "aitrain_grpo", "grpo", "--model", args.model, "--output-dir", str(out),
                   "--rl-env-module", module, "--rl-env-class", cls, "--max-steps", str(args.steps),
                   "--batch-size", str(args.batch_size), "--rl-num-generations", "4", "--seed", "0",
                   *ENGINES[engine], *args.flags]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode:
            raise SystemExit(f"{engine} failed:\n{done.stderr[-2000:]}")
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]


def summary(records: list[dict]) -> dict[str, tuple[float, float]]:
    """Mean and standard deviation (0 for one step) of the step, rollout and training seconds."""
    series = {"step": [r["time/step_s"] for r in records], "rollout": [r["time/rollout_s"] for r in records],
              "training": [r["time/step_s"] - r["time/rollout_s"] for r in records],
              "scoring": [r["time/ref_logprobs_s"] for r in records]}
    return {k: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0) for k, v in series.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--env", default="envs.letters:LetterEnv")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--flags", nargs="*", default=[], help="more grpo flags, every engine alike")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, from " + ", ".join(ENGINES))
    parser.add_argument("--record", help="append the table to this Markdown file")
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",")
               if e != "vllm-colocate" or importlib.util.find_spec("vllm") is not None]
    results = {engine: summary(run(engine, args)) for engine in engines}
    base = results.get("hf-lockstep", next(iter(results.values())))
    lines = [f"`{' '.join(sys.argv[1:]) or '(defaults)'}`: {args.steps - 1} timed steps an engine, wall seconds "
             f"(mean ± sd), ratio to {'hf-lockstep' if 'hf-lockstep' in results else engines[0]}", "",
             "| engine | step | rollout | training | of which scoring forwards | step ratio | rollout ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for engine, r in results.items():
        lines.append(f"| {engine} | {r['step'][0]:.2f} ± {r['step'][1]:.2f} | {r['rollout'][0]:.2f} ± {r['rollout'][1]:.2f} "
                     f"| {r['training'][0]:.2f} ± {r['training'][1]:.2f} | {r['scoring'][0]:.2f} ± {r['scoring'][1]:.2f} "
                     f"| {r['step'][0] / base['step'][0]:.2f}x "
                     f"| {r['rollout'][0] / base['rollout'][0]:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.record:
        with open(args.record, "a") as handle:
            handle.write("\n" + text + "\n")


if __name__ == "__main__":
    main()
