"""Warm start benchmark: does `aitrain sft` (the oracle's demonstrations) before `grpo` beat `grpo` alone?

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/warm_start.py          # about 15 minutes on one core

HotelEnv, the built-in tiny model, every step through the CLI as a user would type it:
- (A) `aitrain grpo --model tiny` for K steps;
- (B) `aitrain sft --model tiny` on the oracle's demonstrations of other tasks (the environment built
  with `{"seed": 1}`: another hotel catalogue, other requests, so nothing of the evaluation tasks is
  shown), then `aitrain grpo --model <sft output>` for the same K steps with the same options;
- `aitrain eval` of the cold model, the SFT model, (A) and (B) on the same 32 tasks (`{"seed": 0}`,
  the tasks both GRPO runs trained on), the same seed, twice: greedy (`--rl-temperature 0`, what the
  policy has learned to do) and sampled at temperature 1 (what GRPO sees while it trains).
The score is HotelEnv's graded one (1.0 a correct booking; 0.1-0.4 for a well-formed tool call, a
search of the right city, a check of the right hotel). The means are read from each eval's
per-episode output; the table goes to benchmarks/WARM_START.md with the machine and the wall times.

Left out: several seeds (one run of each arm; the per-episode files are kept for a closer look),
real models (see LEARNING.md for SmolLM2), and GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from results_table import machine as describe_machine  # the benchmarks' one machine description

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "WARM_START.md"
HOTEL = ("--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv")
TRAIN_TASKS = '{"seed": 0}'
DEMO_TASKS = '{"seed": 1}'
# The same GRPO options for both arms: 16 episodes a step in groups of 4 at lr 1e-3 (LEARNING.md's
# recipe, scaled to the tiny model), turns capped at 4 so that CPU time goes to steps, not to salad.
GRPO = ("--batch-size", "16", "--rl-num-generations", "4", "--lr", "1e-3", "--rl-kl-coef", "0",
        "--rl-max-turns", "4", "--rl-max-new-tokens", "96")


def aitrain(*args: str, log: Path) -> float:
    """Run `python -m aitrain_grpo ARGS` with its output in `log`; the seconds it took."""
    command = [sys.executable, "-m", "aitrain_grpo", *args]
    print("$ aitrain " + " ".join(shlex.quote(a) for a in args), flush=True)
    started = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                              env=dict(os.environ, OMP_NUM_THREADS="1")).returncode
    if code:
        sys.exit(f"aitrain {args[0]} failed (exit {code}); see {log}")
    return time.perf_counter() - started


def evaluate(model: str, out: Path, name: str, episodes: int, temperature: str) -> tuple[dict, float]:
    episodes_file = out / f"eval-{name}-t{temperature}.jsonl"
    seconds = aitrain("eval", "--model", model, *HOTEL, "--rl-env-config", TRAIN_TASKS, "--episodes", str(episodes),
                      "--seed", "0", "--rl-temperature", temperature, "--rl-max-turns", "4", "--rl-max-new-tokens", "96",
                      "--output", str(episodes_file), log=out / f"eval-{name}-t{temperature}.log")
    records = [json.loads(line) for line in episodes_file.read_text().splitlines() if line.strip()]
    scores = [float(r.get("score") or 0.0) for r in records]
    tool_errors = sum(sum(1 for m in r["messages"] if m.get("role") == "tool" and str(m.get("content", "")).startswith("Error"))
                      for r in records)
    return {"mean": sum(scores) / len(scores), "success": sum(s >= 1.0 for s in scores) / len(scores),
            "nonzero": sum(s > 0 for s in scores) / len(scores), "tool_errors": tool_errors / len(records)}, seconds


def machine() -> str:
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{describe_machine()} (load average {load} at the end; one torch thread per process)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps of each arm (K)")
    parser.add_argument("--sft-steps", type=int, default=40, help="SFT optimizer steps")
    parser.add_argument("--demos", type=int, default=64, help="oracle episodes for SFT")
    parser.add_argument("--sft-options", default="--lr 1e-2", help="extra options of aitrain sft (LoRA, the default)")
    parser.add_argument("--episodes", type=int, default=32, help="evaluation tasks")
    parser.add_argument("--out", default="benchmarks/runs/warm_start", help="where the runs go")
    parser.add_argument("--results", default=str(RESULTS), help="the Markdown file to write ('-': print only)")
    args = parser.parse_args()
    out = (REPO / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    steps = ("--max-steps", str(args.steps), "--overwrite")
    seconds: dict[str, float] = {}
    seconds["grpo alone"] = aitrain("grpo", "--model", "tiny", *HOTEL, "--rl-env-config", TRAIN_TASKS, *GRPO, *steps,
                                    "--output-dir", str(out / "grpo"), log=out / "grpo.log")
    sft_options = tuple(shlex.split(args.sft_options))
    seconds["sft"] = aitrain("sft", "--model", "tiny", *HOTEL, "--rl-env-config", DEMO_TASKS, "--episodes", str(args.demos),
                             "--max-steps", str(args.sft_steps), *sft_options, "--overwrite", "--output-dir", str(out / "sft"),
                             log=out / "sft.log")
    seconds["grpo after sft"] = aitrain("grpo", "--model", str(out / "sft"), *HOTEL, "--rl-env-config", TRAIN_TASKS, *GRPO,
                                        *steps, "--output-dir", str(out / "sft-grpo"), log=out / "sft-grpo.log")
    greedy, sampled = {}, {}
    for name, model in (("cold tiny", "tiny"), ("sft only", str(out / "sft")), ("A: grpo alone", str(out / "grpo")),
                        ("B: sft + grpo", str(out / "sft-grpo"))):
        short = name.split(":")[0].replace(" ", "-").lower()
        greedy[name], seconds[f"eval {name} t=0"] = evaluate(model, out, short, args.episodes, "0")
        sampled[name], seconds[f"eval {name} t=1"] = evaluate(model, out, short, args.episodes, "1")
    losses = json.loads((out / "sft" / "run_summary.json").read_text())["losses"]

    def versus(scores: dict) -> str:
        a, b = scores["A: grpo alone"]["mean"], scores["B: sft + grpo"]["mean"]
        return f"B - A = {b - a:+.3f}, B / A = " + (f"{b / a:.1f} x" if a > 0 else "n/a (A scored 0)")

    command = (f"OMP_NUM_THREADS=1 nice -n 10 python benchmarks/warm_start.py --steps {args.steps} --sft-steps "
               f"{args.sft_steps} --demos {args.demos} --sft-options '{args.sft_options}' --episodes {args.episodes}")
    lines = [
        "# Warm start with the oracle: `sft` then `grpo` vs `grpo` alone",
        "",
        "Written by `benchmarks/warm_start.py` (its docstring says what each arm runs). Reproduce with:",
        "",
        f"    {command}",
        "",
        f"HotelEnv, tiny model; GRPO options of both arms: `{' '.join(GRPO)} --max-steps {args.steps}`; SFT: "
        f"`--episodes {args.demos} --max-steps {args.sft_steps} {args.sft_options}` on the tasks of "
        f"`--rl-env-config '{DEMO_TASKS}'` (loss {losses[0]:.3f} -> {losses[-1]:.3f}); evaluation: the first "
        f"{args.episodes} tasks of `'{TRAIN_TASKS}'`, `--seed 0`, at most 4 turns of 96 tokens, greedy and sampled.",
        "",
        "| model | mean score, greedy | episodes > 0, greedy | mean score, t=1 | episodes > 0, t=1 "
        "| successes (1.0), t=1 | tool errors per episode, greedy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *[f"| {name} | {g['mean']:.3f} | {g['nonzero']:.0%} | {sampled[name]['mean']:.3f} | {sampled[name]['nonzero']:.0%} "
          f"| {sampled[name]['success']:.0%} | {g['tool_errors']:.2f} |" for name, g in greedy.items()],
        "",
        f"After the same {args.steps} GRPO steps: greedy **{versus(greedy)}**; sampled at t=1: {versus(sampled)}.",
        "",
        f"Machine: {machine()}. Wall time: {time.perf_counter() - started:.0f} s in all ("
        + ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items()) + ").",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.results != "-":
        Path(args.results).write_text(text)


if __name__ == "__main__":
    main()
