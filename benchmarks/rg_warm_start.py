"""What a warm start changes on a reasoning-gym family: SmolLM2 before and after `aitrain sft` on the oracle.

A cold SmolLM2 never writes reasoning-gym's `<answer>...</answer>` tags (SIGNAL.md), so every episode
scores 0 and GRPO has nothing to learn from. The adapter's oracle writes each entry's stored answer in
that format, so `aitrain sft` can teach it. Two phases, every step through the CLI:

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/rg_warm_start.py start    # sft, then eval base and sft
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/rg_warm_start.py grpo --steps 10 --seeds 1 2 3

- `start`: `aitrain sft --model smollm2 --rl-env reasoning_gym:FAMILY` on the oracle's episodes of the
  first `--demos` training rows (`{"size": 400, "seed": 0}` plus the family's own options from
  `--family-config`: rows of the train split), then `aitrain eval` of the base model (unless `--no-base`)
  and of the sft output on the held-back rows (`"split": "held_out"`, entries the train split never
  shows): greedy on `--episodes` rows, and sampled at `--temperature` in groups of 4 on `--groups` rows.
  Figures: the share of replies in the format (a tag was there: `env/answered`), the mean score, the share
  solved, and the share of groups with a signal (not every episode of the group scored the same: what
  GRPO learns from). The start's figures and evaluation settings go to OUT/start.json.
- `grpo`: for each of `--seeds`, `aitrain grpo --model <sft output>` on the train split with
  `--grpo-options` (LEARNING.md's SmolLM2 recipe by default; SIGNAL.md's `basic_arithmetic` runs add
  `benchmarks/rg_exact.py`'s exact-answer reward) and a checkpoint every step, stopped after
  `--minutes` if given; the mean score of each finished step (metrics.jsonl), so a run stopped early still
  reports what it did; then the trained model (the newest whole checkpoint of a stopped run) evaluated
  exactly as the start was (OUT/start.json: the same held-back rows, seed, sampling and token limit), and
  the start's figures against the trained ones, seed by seed.
Each phase prints a Markdown section (and writes it to OUT/<phase>.md) for benchmarks/SIGNAL.md.

Left out: held-back evaluation of every GRPO checkpoint (run `aitrain eval --model OUT/grpo-seedN/
checkpoint-K` with the held-out config), families without stored answers (no oracle), several sft seeds.
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
ROWS = {"size": 400, "seed": 0}
# LEARNING.md's SmolLM2 recipe: LoRA, lr 1e-3, no KL, temperature 0.7, 16 episodes a step in groups of 4.
GRPO = ("--lr 1e-3 --rl-kl-coef 0 --rl-temperature 0.7 --batch-size 16 --rl-num-generations 4 "
        "--rl-max-new-tokens 96")


def rows(args, split: str = "train") -> str:
    """The `--rl-env-config` of the train or held-back rows: ROWS, the split, the family's own options."""
    config = {**ROWS, **({"split": split} if split != "train" else {})}
    family = json.loads(args.family_config)
    return json.dumps({**config, "config": family} if family else config)


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


def evaluate(model: str, settings: dict, out: Path, name: str, greedy: bool) -> dict:
    """`aitrain eval` of `model` on the held-back rows as `settings` say (start.json's); its table row's figures."""
    records_file = out / f"eval-{name}-{'greedy' if greedy else 'sampled'}.jsonl"
    sampling = (("--episodes", str(settings["episodes"]), "--rl-temperature", "0") if greedy else
                ("--episodes", str(settings["groups"]), "--rl-num-generations", "4",
                 "--rl-temperature", str(settings["temperature"])))
    seconds = aitrain("eval", "--model", model, "--rl-env", f"reasoning_gym:{settings['family']}", "--rl-env-config",
                      settings["rows"], *sampling, "--seed", "0", "--rl-max-new-tokens",
                      str(settings["max_new_tokens"]), "--output", str(records_file), log=records_file.with_suffix(".log"))
    records = [json.loads(line) for line in records_file.read_text().splitlines() if line.strip()]
    scores = [float(r.get("score") or 0.0) for r in records]
    groups: dict[int, set[float]] = {}
    for record, score in zip(records, scores):
        groups.setdefault(record["task"], set()).add(score)
    return {"episodes": len(records), "format": sum(r["metrics"].get("answered", 0.0) for r in records) / len(records),
            "mean": sum(scores) / len(scores), "solved": sum(s >= 1.0 for s in scores) / len(scores),
            "signal": sum(len(g) > 1 for g in groups.values()) / len(groups), "seconds": seconds}


def row(name: str, greedy: bool, figures: dict, temperature: float) -> str:
    return (f"| {name} | {'greedy' if greedy else f't={temperature:g}, groups of 4'} | {figures['episodes']} | "
            f"{figures['format']:.0%} | {figures['mean']:.3f} | {figures['solved']:.0%} | "
            + (f"{figures['signal']:.0%}" if not greedy else "") + f" | {figures['seconds']:.0f} |")


HEADER = ("| model | sampling | episodes | in the format | mean score | solved | groups with a signal | seconds |",
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")


def start(args, out: Path) -> list[str]:
    sft_options = tuple(shlex.split(args.sft_options))
    sft_seconds = aitrain("sft", "--model", args.model, "--rl-env", f"reasoning_gym:{args.family}", "--rl-env-config",
                          rows(args), "--episodes", str(args.demos), "--max-steps", str(args.sft_steps),
                          *sft_options, "--overwrite", "--output-dir", str(out / "sft"), log=out / "sft.log")
    losses = json.loads((out / "sft" / "run_summary.json").read_text())["losses"]
    settings = {"family": args.family, "rows": rows(args, "held_out"), "episodes": args.episodes, "groups": args.groups,
                "temperature": args.temperature, "max_new_tokens": args.max_new_tokens}
    lines, figures = [], {}
    models = ((f"base {args.model}", args.model),) * (not args.no_base) + (("sft start", str(out / "sft")),)
    for name, model in models:
        for greedy in (True, False):
            figures[name, greedy] = evaluate(model, settings, out, name.split()[0].lower(), greedy)
            lines.append(row(name, greedy, figures[name, greedy], args.temperature))
    (out / "start.json").write_text(json.dumps({"settings": settings, "greedy": figures["sft start", True],
                                                "sampled": figures["sft start", False]}, indent=1))
    return [f"`reasoning_gym:{args.family}`; sft: `--episodes {args.demos} --max-steps {args.sft_steps} "
            f"{args.sft_options}` on `{rows(args)}` (loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
            f"{sft_seconds:.0f} s); evaluation on `{settings['rows']}`, `--seed 0`, at most "
            f"{args.max_new_tokens} new tokens.", "", *HEADER, *lines]


def train_seed(args, out: Path, seed: int) -> tuple[list[float], str, float, Path | None]:
    """One GRPO run from the start: its step means, how it ended, its seconds, the model to evaluate."""
    run = out / f"grpo-seed{seed}"
    started = time.perf_counter()
    try:
        aitrain("grpo", "--model", str(out / "sft"), "--rl-env", f"reasoning_gym:{args.family}", "--rl-env-config",
                rows(args), *shlex.split(args.grpo_options), "--save-steps", "1", "--max-steps", str(args.steps),
                "--seed", str(seed), "--overwrite", "--output-dir", str(run), log=out / f"grpo-seed{seed}.log",
                minutes=args.minutes)
        ending, model = "finished", run
    except subprocess.TimeoutExpired:
        checkpoints = sorted((p for p in run.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                             key=lambda p: int(p.name.split("-")[1]))  # whole ones
        ending, model = f"stopped at the {args.minutes:g}-minute budget", (checkpoints[-1] if checkpoints else None)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    means = [float(m["env/score_mean"]) for m in metrics if "env/score_mean" in m]
    return means, ending, time.perf_counter() - started, model


def grpo(args, out: Path) -> list[str]:
    if not (out / "start.json").is_file():
        sys.exit(f"no start in {out}: run the start phase with the same --out first")
    begin = json.loads((out / "start.json").read_text())
    settings = begin["settings"]
    if settings["family"] != args.family or settings["rows"] != rows(args, "held_out"):
        sys.exit(f"{out}/start.json was made for {settings['family']} {settings['rows']}; pass the same "
                 "--family and --family-config")
    lines = [f"`aitrain grpo --model <sft start> {args.grpo_options} --save-steps 1 --max-steps {args.steps} "
             f"--seed S` on `{rows(args)}`, from the start of OUT/start.json; each trained model evaluated as the "
             "start was.", ""]
    table = [*HEADER, row("sft start", True, begin["greedy"], settings["temperature"]),
             row("sft start", False, begin["sampled"], settings["temperature"])]
    gains = []
    for seed in args.seeds:
        means, ending, seconds, model = train_seed(args, out, seed)
        lines += [f"Seed {seed}: {ending} after {len(means)} steps, {seconds:.0f} s. Mean score of each step's "
                  "episodes: " + " ".join(f"{m:.2f}" for m in means), ""]
        if model is None:
            continue
        for greedy in (True, False):
            figures = evaluate(str(model), settings, out, f"seed{seed}-{model.name}", greedy)
            table.append(row(f"GRPO seed {seed} ({model.name})", greedy, figures, settings["temperature"]))
            if greedy:
                gains.append(figures["solved"] - begin["greedy"]["solved"])
    return lines + ["Held-back rows:", "", *table, "",
                    "Held-back greedy success, trained minus start, per seed: " + " ".join(f"{g:+.3f}" for g in gains)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("phase", choices=("start", "grpo"))
    parser.add_argument("--model", default="smollm2", help="the base model (tiny: a smoke test)")
    parser.add_argument("--family", default="syllogism", help="a reasoning-gym family with stored answers")
    parser.add_argument("--family-config", default="{}", help="the family's own options (JSON), e.g. "
                        '\'{"max_digits": 2, "operators": ["+"]}\' for basic_arithmetic')
    parser.add_argument("--demos", type=int, default=64, help="oracle episodes for sft")
    parser.add_argument("--sft-steps", type=int, default=16)
    parser.add_argument("--sft-options", default="--lr 1e-3 --batch-size 8", help="extra options of aitrain sft")
    parser.add_argument("--no-base", action="store_true", help="skip the base model's evaluation (phase start)")
    parser.add_argument("--episodes", type=int, default=80, help="held-back rows evaluated greedily")
    parser.add_argument("--groups", type=int, default=20, help="held-back rows sampled 4 times each")
    parser.add_argument("--temperature", type=float, default=0.7, help="of the sampled evaluation")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="of the evaluation")
    parser.add_argument("--grpo-options", default=GRPO, help="options of aitrain grpo (phase grpo)")
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps (phase grpo)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="one GRPO run per seed (phase grpo)")
    parser.add_argument("--minutes", type=float, default=0, help="stop each GRPO run after this long (0: never)")
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
