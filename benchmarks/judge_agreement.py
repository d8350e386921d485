"""Does a judge agree with an environment's own score? (issue 37, part 1)

The judge (`--rl-judge-rubric`, training/rewards/judge.py) sees the rubric and the transcript, never the score.
This measures how far its scores follow the true ones on episodes a model really played:

    python benchmarks/judge_agreement.py play  --model smollm2 --out /work/runs/judge   # aitrain eval, transcripts
    python benchmarks/judge_agreement.py judge --judge smollm2 --out /work/runs/judge   # both modes, the numbers

`play` runs `aitrain eval` on `envs.rewrite` (16 tasks x 4 samples at temperature 1, so groups differ);
`judge` scores the transcripts with an in-process judge in `group` and `episode` mode, with the rubric
below (a plain description of what the environment's score checks, as a user would write it), and
prints, per mode: Pearson and Spearman correlation with the true score over all episodes, the same
within groups (each score less its group's mean: what GRPO's advantage uses), the share of within-group
pairs the judge orders as the true score does (ties in either left out), and failed judge replies.

What it leaves out: training on the judge (that needs the learning runs of LEARNING.md's size), and
judges behind a URL (the same `Judge`, another backend).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path

RUBRIC = ("The assistant is first asked for one short sentence about a topic, then asked to write the same "
          "sentence again under a constraint (for example: in capital letters, or without commas). A good "
          "conversation has a first sentence with several meaningful content words, starting with a capital "
          "letter; a second reply that repeats the same key words; and a second reply that fully meets the "
          "constraint. Score 0 if the first sentence is empty or has no content, or if the second reply is a "
          "different sentence; score low if the constraint is broken.")


def play(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "aitrain_grpo", "eval", "--model", args.model, "--rl-env-module", "envs.rewrite",
               "--rl-env-class", "RewriteEnv", "--episodes", str(args.tasks), "--rl-num-generations", str(args.samples),
               "--rl-temperature", "1.0", "--output", str(out / "episodes.jsonl")]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def pearson(x: list[float], y: list[float]) -> float | None:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sx = sum((a - mx) ** 2 for a in x) ** 0.5
    sy = sum((b - my) ** 2 for b in y) ** 0.5
    return sxy / (sx * sy) if sx > 0 and sy > 0 else None


def agreement(true: list[float], judged: list[float], groups: list[list[int]]) -> dict[str, float | None]:
    centred_true, centred_judge, same, pairs = [], [], 0, 0
    for members in groups:
        mt = sum(true[i] for i in members) / len(members)
        mj = sum(judged[i] for i in members) / len(members)
        centred_true += [true[i] - mt for i in members]
        centred_judge += [judged[i] - mj for i in members]
        for a, b in combinations(members, 2):
            dt, dj = true[a] - true[b], judged[a] - judged[b]
            if dt and dj:
                pairs += 1
                same += (dt > 0) == (dj > 0)
    return {"pearson": pearson(true, judged), "spearman": pearson(_ranks(true), _ranks(judged)),
            "pearson_within_groups": pearson(centred_true, centred_judge),
            "pairs_ordered_alike": same / pairs if pairs else None, "pairs": pairs}


def judge(args) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from aitrain_grpo.training.rewards.judge import Judge, LocalJudge

    out = Path(args.out)
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines() if line.strip()]
    keys = [json.dumps(r["row"], sort_keys=True) for r in records]
    order = sorted(range(len(records)), key=lambda i: keys[i])  # each task's samples together, as TRL lays groups
    records = [records[i] for i in order]
    keys = [keys[i] for i in order]
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    sizes = {len(m) for m in groups.values()}
    if len(sizes) != 1:
        raise SystemExit(f"groups of unequal size {sorted(sizes)}: play every task the same number of times")
    (group_size,) = sizes
    true = [float(r["score"]) for r in records]

    class Played:  # what Judge.score reads of an episode
        def __init__(self, record):
            self.messages = record["messages"]

    backend = LocalJudge(args.judge)
    results = {"judge": args.judge, "episodes": len(records), "groups": len(groups), "true_mean": sum(true) / len(true),
               "modes": {}}
    for mode in args.modes:
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        scorer = Judge(RUBRIC, mode, 0.0, group_size, backend)
        judged = scorer.score([Played(r) for r in records], lambda name, value: metrics.__setitem__(name, value))
        results["modes"][mode] = {**agreement(true, judged, list(groups.values())), "failures": metrics["judge/failures"],
                                  "judge_mean": sum(judged) / len(judged), "seconds": time.perf_counter() - started,
                                  "scores": judged}
        print(mode, {k: v for k, v in results["modes"][mode].items() if k != "scores"}, flush=True)
    results["true"] = true
    (out / "agreement.json").write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("play")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--out", required=True)
    j = sub.add_parser("judge")
    j.add_argument("--judge", default="smollm2")
    j.add_argument("--modes", nargs="+", default=["group", "episode"], choices=["group", "episode"])
    j.add_argument("--out", required=True)
    args = parser.parse_args()
    {"play": play, "judge": judge}[args.command](args)


if __name__ == "__main__":
    main()
