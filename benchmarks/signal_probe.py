"""Which environments give SmolLM2 a learning signal before training? A probe through `aitrain eval`.

GRPO learns only from groups whose episodes scored differently. Before spending 30 steps on an
environment from another ecosystem (reasoning-gym families, TextArena games), this plays each one with
the base model as training would (groups of `--samples` episodes per task, the training temperature)
and reports the share of groups with a signal (not every episode of the group scored the same), beside
the mean score and the share solved. Everything goes through the CLI:

    OMP_NUM_THREADS=1 python benchmarks/signal_probe.py                       # the default specs
    python benchmarks/signal_probe.py --spec reasoning_gym:leg_counting --results -   # one, printed

Each spec is `aitrain eval --model smollm2 --rl-env SPEC --episodes TASKS --rl-num-generations SAMPLES
--rl-temperature 0.7 --output <tmp>/probe.jsonl`; the table is appended to the results file
(benchmarks/SIGNAL.md by default) with the machine and the command.

Left out: training (benchmarks/learning.py does that on the environments this picks) and any
statistics beyond counts: 8 groups tell a signal from none, not its size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_table import machine as describe_machine  # the benchmarks' one machine description

REPO = Path(__file__).resolve().parent.parent
SPECS = ["reasoning_gym:leg_counting", "reasoning_gym:letter_counting", "reasoning_gym:spell_backward",
         "reasoning_gym:basic_arithmetic", "reasoning_gym:syllogism", "reasoning_gym:coin_flip",
         "reasoning_gym:word_sequence_reversal", "textarena:GuessTheNumber-v0", "textarena:TowerOfHanoi-v0"]


def probe(spec: str, args) -> dict:
    """Play `spec` with the base model; the figures of its table row."""
    with tempfile.TemporaryDirectory() as tmp:
        records = Path(tmp) / "probe.jsonl"
        command = [sys.executable, "-m", "aitrain_grpo", "eval", "--model", args.model, "--rl-env", spec,
                   "--episodes", str(args.tasks), "--rl-num-generations", str(args.samples), "--rl-temperature",
                   str(args.temperature), "--rl-max-new-tokens", str(args.max_new_tokens), "--rl-max-turns",
                   str(args.max_turns), "--seed", "0", "--output", str(records)]
        started = time.time()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        seconds = time.time() - started
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            return {"spec": spec, "error": last[0], "seconds": seconds}
        episodes = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    groups: dict[int, list[float]] = {}
    for episode in episodes:
        groups.setdefault(episode["task"], []).append(float(episode["score"]))
    scores = [s for group in groups.values() for s in group]
    return {"spec": spec, "episodes": len(scores), "mean": sum(scores) / len(scores),
            "solved": sum(s >= 1.0 for s in scores) / len(scores),
            "signal": sum(len(set(g)) > 1 for g in groups.values()) / len(groups), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--spec", action="append", help="an --rl-env spec (repeat it); default: a set of families and games")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tasks", type=int, default=8, help="tasks (groups) per spec")
    parser.add_argument("--samples", type=int, default=4, help="episodes per task (the GRPO group)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--results", default=str(Path(__file__).with_name("SIGNAL.md")), help="file to append to, or -")
    args = parser.parse_args()
    rows = []
    for spec in args.spec or SPECS:
        row = probe(spec, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = [f"\n## {time.strftime('%Y-%m-%d %H:%M')} ({describe_machine()})\n",
             f"`python benchmarks/signal_probe.py --model {args.model} --tasks {args.tasks} --samples {args.samples} "
             f"--temperature {args.temperature} --max-new-tokens {args.max_new_tokens} --max-turns {args.max_turns}`"
             f" (each spec: `aitrain eval`, the base model, groups of {args.samples}).\n",
             "| environment | episodes | mean score | solved | groups with a signal | seconds |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if "error" in row:
            lines.append(f"| `{row['spec']}` | failed: {row['error'][:120]} | | | | {row['seconds']:.0f} |")
        else:
            lines.append(f"| `{row['spec']}` | {row['episodes']} | {row['mean']:.3f} | {row['solved']:.0%} | "
                         f"{row['signal']:.0%} | {row['seconds']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results != "-":
        path = Path(args.results)
        if not path.exists():
            path.write_text("# Learning signal before training: the base model on environments from outside\n\n"
                            "Written by `benchmarks/signal_probe.py` (its docstring says what each figure is).\n")
        with path.open("a") as out:
            out.write(text)


if __name__ == "__main__":
    main()
