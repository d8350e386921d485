"""What a warm start changes on a reasoning-gym family: SmolLM2 before and after `aitrain sft` on the oracle.

A cold SmolLM2 never writes reasoning-gym's `<answer>...</answer>` tags (SIGNAL.md), so every episode
scores 0 and GRPO has nothing to learn from. The adapter's oracle writes each entry's stored answer in
that format, so `aitrain sft` can teach it. Two phases, every step through the CLI:

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/rg_warm_start.py start    # sft, then eval base and sft
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/rg_warm_start.py grpo --steps 10   # GRPO from the start

- `start`: `aitrain sft --model smollm2 --rl-env reasoning_gym:FAMILY` on the oracle's episodes of the
  first `--demos` training rows (`{"size": 400, "seed": 0}`: rows of the train split), then `aitrain eval`
  of the base model and of the sft output on the held-back rows (`"split": "held_out"`, entries the
  train split never shows): greedy on `--episodes` rows, and sampled at the training temperature (0.7)
  in groups of 4 on `--groups` rows. Figures: the share of replies in the format (a tag was there:
  `env/answered`), the mean score, the share solved, and the share of groups with a signal (not every
  episode of the group scored the same: what GRPO learns from).
- `grpo`: `aitrain grpo --model <sft output>` on the train split with LEARNING.md's SmolLM2 recipe and a
  checkpoint every step, stopped after `--minutes` if given; prints the mean score of each finished step
  (metrics.jsonl), so a run stopped early still reports what it did, and evaluates its newest checkpoint
  greedily on the held-back rows.
Each phase prints a Markdown section (and writes it to OUT/<phase>.md) for benchmarks/SIGNAL.md.

Left out: several seeds, held-back evaluation of every GRPO checkpoint (run `aitrain eval --model
OUT/grpo/checkpoint-N` with the held-out config), families without stored answers (no oracle).
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
TRAIN = {"size": 400, "seed": 0}
HELD_OUT = {**TRAIN, "split": "held_out"}
# LEARNING.md's SmolLM2 recipe: LoRA, lr 1e-3, no KL, temperature 0.7, 16 episodes a step in groups of 4.
GRPO = ("--lr", "1e-3", "--rl-kl-coef", "0", "--rl-temperature", "0.7", "--batch-size", "16",
        "--rl-num-generations", "4", "--rl-max-new-tokens", "96", "--save-steps", "1")


def aitrain(*args: str, log: Path, minutes: float = 0) -> float:
    """Run `python -m aitrain_grpo ARGS` with its output in `log` (stopped after `minutes`, if given:
    `subprocess.TimeoutExpired`); the seconds it took."""
    print("$ aitrain " + " ".join(shlex.quote(a) for a in args), flush=True)
    started = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run([sys.executable, "-m", "aitrain_grpo", *args], cwd=REPO, stdout=handle,
                              stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                              timeout=minutes * 60 or None).returncode
    if code:
        sys.exit(f"aitrain {args[0]} failed (exit {code}); see {log}")
    return time.perf_counter() - started


def evaluate(model: str, args, out: Path, name: str, greedy: bool) -> dict:
    """`aitrain eval` of `model` on the held-back rows; the figures of its table row."""
    records_file = out / f"eval-{name}-{'greedy' if greedy else 'sampled'}.jsonl"
    sampling = (("--episodes", str(args.episodes), "--rl-temperature", "0") if greedy else
                ("--episodes", str(args.groups), "--rl-num-generations", "4", "--rl-temperature", "0.7"))
    seconds = aitrain("eval", "--model", model, "--rl-env", f"reasoning_gym:{args.family}", "--rl-env-config",
                      json.dumps(HELD_OUT), *sampling, "--seed", "0", "--rl-max-new-tokens", str(args.max_new_tokens),
                      "--output", str(records_file), log=records_file.with_suffix(".log"))
    records = [json.loads(line) for line in records_file.read_text().splitlines() if line.strip()]
    scores = [float(r.get("score") or 0.0) for r in records]
    groups: dict[int, set[float]] = {}
    for record, score in zip(records, scores):
        groups.setdefault(record["task"], set()).add(score)
    return {"episodes": len(records), "format": sum(r["metrics"].get("answered", 0.0) for r in records) / len(records),
            "mean": sum(scores) / len(scores), "solved": sum(s >= 1.0 for s in scores) / len(scores),
            "signal": sum(len(g) > 1 for g in groups.values()) / len(groups), "seconds": seconds}


def start(args, out: Path) -> list[str]:
    sft_options = tuple(shlex.split(args.sft_options))
    sft_seconds = aitrain("sft", "--model", args.model, "--rl-env", f"reasoning_gym:{args.family}", "--rl-env-config",
                          json.dumps(TRAIN), "--episodes", str(args.demos), "--max-steps", str(args.sft_steps),
                          *sft_options, "--overwrite", "--output-dir", str(out / "sft"), log=out / "sft.log")
    losses = json.loads((out / "sft" / "run_summary.json").read_text())["losses"]
    rows = []
    for name, model in ((f"base {args.model}", args.model), ("sft start", str(out / "sft"))):
        short = name.split()[0].lower()
        for greedy in (True, False):
            figures = evaluate(model, args, out, short, greedy)
            rows.append(f"| {name} | {'greedy' if greedy else 't=0.7, groups of 4'} | {figures['episodes']} | "
                        f"{figures['format']:.0%} | {figures['mean']:.3f} | {figures['solved']:.0%} | "
                        + (f"{figures['signal']:.0%}" if not greedy else "") + f" | {figures['seconds']:.0f} |")
    return [f"`reasoning_gym:{args.family}`; sft: `--episodes {args.demos} --max-steps {args.sft_steps} "
            f"{args.sft_options}` on `{json.dumps(TRAIN)}` (loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
            f"{sft_seconds:.0f} s); evaluation on `{json.dumps(HELD_OUT)}`, `--seed 0`, at most "
            f"{args.max_new_tokens} new tokens.", "",
            "| model | sampling | episodes | in the format | mean score | solved | groups with a signal | seconds |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |", *rows]


def grpo(args, out: Path) -> list[str]:
    run = out / "grpo"
    started = time.perf_counter()
    try:
        aitrain("grpo", "--model", str(out / "sft"), "--rl-env", f"reasoning_gym:{args.family}", "--rl-env-config",
                json.dumps(TRAIN), *GRPO, "--max-steps", str(args.steps), "--seed", "1", "--overwrite",
                "--output-dir", str(run), log=out / "grpo.log", minutes=args.minutes)
        ending = "finished"
    except subprocess.TimeoutExpired:
        ending = f"stopped at the {args.minutes:g}-minute budget"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    means = [float(m["env/score_mean"]) for m in metrics if "env/score_mean" in m]
    lines = [f"`aitrain grpo --model <sft start> {' '.join(GRPO)} --max-steps {args.steps} --seed 1` on "
             f"`{json.dumps(TRAIN)}`: {ending} after {len(means)} steps, {time.perf_counter() - started:.0f} s.", "",
             "Mean score of each step's 16 episodes: " + " ".join(f"{m:.2f}" for m in means)]
    checkpoints = sorted((p for p in run.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),  # whole ones
                         key=lambda p: int(p.name.split("-")[1]))
    if checkpoints:  # the newest checkpoint on the held-back rows, as the start's greedy row
        figures = evaluate(str(checkpoints[-1]), args, out, checkpoints[-1].name, greedy=True)
        lines += ["", f"Held-back rows, greedy, {checkpoints[-1].name}: {figures['format']:.0%} in the format, "
                      f"mean score {figures['mean']:.3f}, {figures['solved']:.0%} solved ({figures['episodes']} episodes)."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("phase", choices=("start", "grpo"))
    parser.add_argument("--model", default="smollm2", help="the base model (tiny: a smoke test)")
    parser.add_argument("--family", default="syllogism", help="a reasoning-gym family with stored answers")
    parser.add_argument("--demos", type=int, default=64, help="oracle episodes for sft")
    parser.add_argument("--sft-steps", type=int, default=16)
    parser.add_argument("--sft-options", default="--lr 1e-3 --batch-size 8", help="extra options of aitrain sft")
    parser.add_argument("--episodes", type=int, default=80, help="held-back rows evaluated greedily")
    parser.add_argument("--groups", type=int, default=20, help="held-back rows sampled 4 times each")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps (phase grpo)")
    parser.add_argument("--minutes", type=float, default=0, help="stop GRPO after this long (0: never)")
    parser.add_argument("--out", default="/work/runs/warmstart", help="where the runs go")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    body = (start if args.phase == "start" else grpo)(args, out)
    command = " ".join(shlex.quote(a) for a in sys.argv[1:])
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = "\n".join([f"### {args.phase}, {time.strftime('%Y-%m-%d %H:%M')}", "",
                      f"`OMP_NUM_THREADS=1 nice -n 10 python benchmarks/rg_warm_start.py {command}`", "", *body, "",
                      f"Machine: {describe_machine()} (load average {load} at the end).", ""])
    print(text)
    (out / f"{args.phase}.md").write_text(text)


if __name__ == "__main__":
    main()
