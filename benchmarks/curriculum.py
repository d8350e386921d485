"""Difficulty curriculum against uniform sampling: held-back success per hour of training (issue 37, part 2).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/curriculum.py all --seeds 1 2 3   # both arms, 3 seeds, then eval and report
    python benchmarks/curriculum.py train --arm pools --seeds 1                      # or one phase at a time
    python benchmarks/curriculum.py eval
    python benchmarks/curriculum.py report                 # prints the table and writes it to <runs-dir>/CURRICULUM.md
    python benchmarks/curriculum.py all --model tiny --steps 2 --episodes 4 --seeds 1 --runs-dir /tmp/cur-smoke  # smoke run
    python benchmarks/curriculum.py all --model START --env reasoning_gym:basic_arithmetic --env reasoning_gym:basic_arithmetic \
        --env-config '[{...easy...}, {...hard...}]' --easy 1 --hard 0 --runs-dir runs/curriculum-rg   # any mixture

Workload: SmolLM2-135M-Instruct on TextArena's GuessTheNumber at two ranges in one mixture, 1-20
(`GuessTheNumber-v0`) and 1-50 (`GuessTheNumber-v0-hardcore`), through `--rl-env` repeated. Cold SmolLM2
solves about 12% of the 1-20 games (SIGNAL.md), fewer of the 1-50 ones: inside the 10-80% where a
curriculum can pay. The game's score is graded (it rewards getting closer; 1 only when solved), so a
group's mean is seldom exactly 1 or 0: the pools arm sets `--rl-curriculum-easy 0.8 --rl-curriculum-hard
0.2` (a group whose mean is at least 0.8 mostly solved; at most 0.2 made no progress).

Arms, the same recipe otherwise (LEARNING.md's SmolLM2 recipe, `--max-steps` steps, the same seeds):
- `uniform`: `--rl-curriculum off` (TRL's order);
- `pools`: `--rl-curriculum pools` with the thresholds above, `--rl-curriculum-revisit 0.1`.

`train` runs each arm and seed one after another (one heavy process at a time) into
<runs-dir>/<arm>-seed<N>, recording its wall seconds; `eval` plays each run's model and the base on the
held-back games of both ranges (`{"split": "held_out"}`: seeds the training split never shows),
`--episodes` greedy episodes; `report` reads them: per run the training hours, held-back mean score and
solved share (score 1) per range and overall, and the gain over the base per hour of training; per arm
the mean over seeds; and the pools' last `curriculum/*` values.

Any other mixture: `--env` repeated (each member a spec `--rl-env` takes), `--env-config` the members'
training configs (a JSON list, one per `--env`; the held-back configs are these with `"split":
"held_out"` added), `--easy`/`--hard` the pools' thresholds (1 and 0 for a 0-1 score), `--model` a
warm start (an `aitrain sft` output) where the cold model scores nothing.

Measured (CURRICULUM.md): a warm-started basic_arithmetic mixture of one- and two-digit sums, where the
pools raised the groups with signal but not held-back success. Left out: curves of held-back success
over time (evaluate saved checkpoints with `aitrain eval --model RUN/checkpoint-N` for that), and
statistical tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENVS = ["textarena:GuessTheNumber-v0", "textarena:GuessTheNumber-v0-hardcore"]
RECIPE = ("--lr 1e-3 --rl-kl-coef 0 --rl-temperature 0.7 --batch-size 16 --rl-num-generations 4 --rl-max-new-tokens 96 "
          "--rl-max-turns 6 --rl-max-completion-length 768")
ARMS = ("uniform", "pools")


def arm_options(args, arm: str) -> list[str]:
    """`uniform`: TRL's order; `pools`: the curriculum with the workload's thresholds."""
    if arm == "uniform":
        return ["--rl-curriculum", "off"]
    return ["--rl-curriculum", "pools", "--rl-curriculum-easy", str(args.easy), "--rl-curriculum-hard",
            str(args.hard), "--rl-curriculum-revisit", "0.1"]


def env_options(args, held_out: bool = False) -> list[str]:
    """The mixture's `--rl-env` options and its configs (training rows, or the held-back ones)."""
    resized = {"size": args.held_out_size} if args.held_out_size else {}
    configs = [dict(c, split="held_out", **resized) if held_out else c for c in args.env_config]
    options = [option for env in args.envs for option in ("--rl-env", env)]
    return options + (["--rl-env-config", json.dumps(configs)] if any(configs) else [])


def recipe_option(recipe: str, name: str) -> list[str]:
    """`[name, value]` as the training recipe sets it (so the base is evaluated under the same reply budget
    as the trained models), else []."""
    words = recipe.split()
    return [name, words[words.index(name) + 1]] if name in words[:-1] else []


def run_logged(command: list[str], log: Path) -> float:
    """Run `python -m aitrain_grpo ...` from the repository root with its output in `log`; its wall seconds."""
    started = time.time()
    with log.open("w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        code = subprocess.run([sys.executable, "-m", "aitrain_grpo", *command], cwd=REPO, stdout=out,
                              stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1")).returncode
    if code:
        sys.exit(f"aitrain {command[0]} failed (exit {code}); see {log}")
    return time.time() - started


def run_dir(args, arm: str, seed: int) -> Path:
    return args.runs_dir / f"{arm}-seed{seed}"


def train(args) -> None:
    for arm in args.arms:
        for seed in args.seeds:
            out = run_dir(args, arm, seed)
            command = ["grpo", "--model", args.model, *env_options(args), *args.recipe.split(), "--save-steps", "10",
                       "--overwrite", *arm_options(args, arm), "--max-steps", str(args.steps), "--seed", str(seed),
                       "--output-dir", str(out)]
            print("training:", " ".join(command), flush=True)
            seconds = run_logged(command, args.runs_dir / f"{out.name}.log")
            (out / "wall.json").write_text(json.dumps({"train_seconds": seconds}))


def evaluate(args) -> None:
    for arm in args.arms:
        for seed in args.seeds:
            out = run_dir(args, arm, seed)
            command = ["eval", "--model", str(out), "--baseline", args.model, *env_options(args, held_out=True),
                       "--episodes", str(args.episodes), "--seed", "0", "--rl-temperature", "0",
                       *recipe_option(args.recipe, "--rl-max-new-tokens"), "--output", str(out / "heldout.jsonl")]
            print("evaluating:", " ".join(command), flush=True)
            run_logged(command, out / "heldout.log")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def figures(records: list[dict]) -> dict[str, float]:
    """Held-back mean score and solved share, overall and per range (the row's environment)."""
    result = {"score": mean(r["score"] for r in records), "solved": mean(r["score"] >= 1 for r in records)}
    for name in sorted({r.get("row", {}).get("aitrain_env", "?") for r in records}):
        mine = [r for r in records if r.get("row", {}).get("aitrain_env", "?") == name]
        result[f"solved {name}"] = mean(r["score"] >= 1 for r in mine)
    return result


def report(args) -> str:
    lines = ["| arm | seed | train hours | held-back score (base) | solved (base) | per range | gain in solved per hour | last pools (easy/normal/hard) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    per_arm: dict[str, list[float]] = {}
    for arm in args.arms:
        for seed in args.seeds:
            out = run_dir(args, arm, seed)
            records = read_jsonl(out / "heldout.jsonl")
            if not records:
                continue
            base = figures([r for r in records if r.get("model") == args.model])
            model = figures([r for r in records if r.get("model") != args.model])
            hours = json.loads((out / "wall.json").read_text())["train_seconds"] / 3600
            gain = (model["solved"] - base["solved"]) / hours if hours else float("nan")
            per_arm.setdefault(arm, []).append(gain)
            ranges = ", ".join(f"{k[7:]} {v:.2f}" for k, v in model.items() if k.startswith("solved "))
            last = (read_jsonl(out / "metrics.jsonl") or [{}])[-1]
            pools = "/".join(str(int(last[k])) for k in ("curriculum/easy", "curriculum/normal", "curriculum/hard")
                             if k in last) or "-"
            lines.append(f"| {arm} | {seed} | {hours:.2f} | {model['score']:.3f} ({base['score']:.3f}) | "
                         f"{model['solved']:.2f} ({base['solved']:.2f}) | {ranges} | {gain:+.2f} | {pools} |")
    lines.append("")
    lines += [f"- {arm}: mean gain in held-back solved share per hour of training {mean(gains):+.2f} over "
              f"{len(gains)} seed(s)" for arm, gains in per_arm.items()]
    text = "\n".join(lines) + "\n"
    (args.runs_dir / "CURRICULUM.md").write_text(text)
    print(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("train", "eval", "report", "all"))
    parser.add_argument("--arm", dest="arms", action="append", choices=ARMS, help="default: both")
    parser.add_argument("--env", dest="envs", action="append", help="a mixture member (repeat); default: GuessTheNumber 1-20 and 1-50")
    parser.add_argument("--env-config", type=json.loads, help="JSON list: each member's training config")
    parser.add_argument("--easy", type=float, default=0.8, help="pools: a group this good is easy (0.8: graded scores)")
    parser.add_argument("--hard", type=float, default=0.2, help="pools: a group at most this good is hard")
    parser.add_argument("--held-out-size", type=int, help="rows of each member's held-back split (default: its "
                        "training config's size), so a small training pool that repeats can be judged on many questions")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--episodes", type=int, default=40, help="held-back games per model in eval")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--recipe", default=RECIPE, help="grpo's training options, the same for both arms (default: "
                        "LEARNING.md's SmolLM2 recipe for GuessTheNumber)")
    parser.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "curriculum")
    args = parser.parse_args()
    args.arms = args.arms or list(ARMS)
    args.envs = args.envs or ENVS
    args.env_config = args.env_config or [{} for _ in args.envs]
    if len(args.env_config) != len(args.envs):
        parser.error(f"--env-config has {len(args.env_config)} configs for {len(args.envs)} --env")
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    if args.phase in ("train", "all"):
        train(args)
    if args.phase in ("eval", "all"):
        evaluate(args)
    if args.phase in ("report", "all"):
        report(args)


if __name__ == "__main__":
    main()
