"""The report of benchmarks/head_to_head.py: the results block of HEAD_TO_HEAD.md and its figure.

Read from each run's folder, the same way for both trainers (nothing from either trainer's own metrics
but the step count and TRL's `step_time`, which both log, aitrain's trainer being TRL's):
- minutes of a checkpoint: the modification time of its trainer_state.json less the process's start
  (run.json), so model loading counts, as it does in the budget;
- steps: the last checkpoint's `global_step`; episodes: steps x the recipe's 16; episodes per hour:
  episodes over the minutes of the last checkpoint;
- held-back success: the share of the held-back episodes (128 by default, eval/step-<N>.jsonl) that scored
  1.0, for the start (start-eval.jsonl, minute 0) and every checkpoint; "final" is the last checkpoint's;
- peak memory: run.json's peak resident set of the training process;
- TRL's loop: the same for head_to_head_trl.py --evaluate's episodes (eval-trl/step-<N>.jsonl), beside;
- the settled difference, aitrain - TRL at the budget with its 95% interval: head_to_head_stats.py;
- where the held-back episodes end: the share at each of envs.stations' score levels (no tool result, a
  tool result only, the station found, the reading shown, answered), per loop, for the start and each
  trainer's final checkpoints pooled over seeds;
- the learning curves: each run's in-training evaluations (eval-ledger.jsonl, head_to_head_ledger.py) at
  their CPU minutes of training, listed and drawn (<md stem>_cpu.png); with such evaluations a step's CPU
  leaves their CPU out.

A resumed run (head_to_head.py train --resume) spans processes, so it has no wall minutes: its checkpoint
minutes and episodes per hour are n/a; its CPU numbers count on across processes (a step's CPU includes its
reloading), and its name says where it was resumed.

Left out: runs that have no run.json (never started by the harness).
"""

from __future__ import annotations

import datetime
import json
import shlex
import statistics
from pathlib import Path

from head_to_head_ledger import curve as curve_of
from head_to_head_ledger import read_ledger
from head_to_head_record import add_runs, record_path, settled_lines, weights_digest
from head_to_head_stats import SUCCESS, count, curve_figure, describe, difference, success_figure
from head_to_head_trl import RECIPE  # puts the repository on sys.path, for envs below
from envs.stations_trl import FOUND, READ, TRIED  # noqa: I001
from learning import write_block
from results_table import machine as describe_machine

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- head-to-head -->", "<!-- /head-to-head -->"
STYLE = {"aitrain": ("tab:blue", "-"), "trl": ("tab:orange", "--")}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def success(path: Path) -> float | None:
    records = read_jsonl(path)
    return sum(r["score"] >= SUCCESS for r in records) / len(records) if records else None


def checkpoints(run: Path) -> list[tuple[int, Path]]:
    """(step, folder) of each checkpoint the trainer wrote into <run>/train, by step."""
    found = [(int(c.name.rsplit("-", 1)[1]), c) for c in (run / "train").glob("checkpoint-*")
             if c.name.rsplit("-", 1)[1].isdigit()]
    return sorted(found)


def cpu_at(timeline: list, seconds: float) -> float | None:
    """CPU seconds a run had used `seconds` after its start, interpolated from run.json's cpu_timeline."""
    if not timeline:
        return None
    before = [p for p in timeline if p[0] <= seconds] or timeline[:1]
    after = [p for p in timeline if p[0] >= seconds] or timeline[-1:]
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (seconds - t0) / (t1 - t0)


def read_run(run: Path, start_success: float | None) -> dict:
    """One run's numbers (see the module docstring); `curve` is [(minutes, step, success or None)]."""
    info = json.loads((run / "run.json").read_text())
    trainer, seed = run.name.rsplit("-seed", 1)
    resumed = info.get("resumed_from_step")
    curve = [(0.0, 0, start_success)]
    step_times: list[float] = []
    minutes = 0.0  # of the last checkpoint, since its process started
    for step, checkpoint in checkpoints(run):
        state = checkpoint / "trainer_state.json"
        minutes = (state.stat().st_mtime - info["launched"]) / 60
        curve.append((None if resumed is not None else minutes, step, success(run / "eval" / f"step-{step}.jsonl")))
        history = json.loads(state.read_text()).get("log_history", [])
        step_times = [h["step_time"] for h in history if "step_time" in h] or step_times
    steps = curve[-1][1]
    episodes = steps * RECIPE["batch_size"]
    # CPU per step: what the process used from the start of training (the last checkpoint less the steps'
    # own seconds) to the last checkpoint, per step; the CPU used before is loading.
    trained_s = sum(step_times[:steps]) if len(step_times) >= steps else None
    timeline = info.get("cpu_timeline") or []
    load_cpu = step_cpu = None
    ledger = curve_of(read_ledger(run / "eval-ledger.jsonl"))
    if steps and ledger and timeline:  # evaluations between the steps: their CPU is left out
        end = cpu_at(timeline, minutes * 60)
        evaluated = sum(e["eval_cpu_s"] for e in ledger if e["time"] <= info["launched"] + minutes * 60)
        load_cpu = ledger[0]["train_cpu_s"]  # the first evaluation comes before step 1
        step_cpu = (end - evaluated - load_cpu) / steps
    elif steps and trained_s is not None and timeline:
        end, begin = cpu_at(timeline, minutes * 60), cpu_at(timeline, minutes * 60 - trained_s)
        load_cpu, step_cpu = begin, (end - begin) / steps
    last = checkpoints(run)[-1][0] if steps else None
    scores = {loop: [r["score"] for r in read_jsonl(run / folder / f"step-{last}.jsonl")] if last else []
              for loop, folder in (("aitrain", "eval"), ("trl", "eval-trl"))}
    wall = None if resumed is not None else minutes
    return {"name": run.name if resumed is None else f"{run.name} (resumed at step {resumed})", "trainer": trainer,
            "seed": int(seed), "curve": curve, "steps": steps, "episodes": episodes, "minutes": wall,
            "per_hour": (episodes / (wall / 60) if wall else 0.0) if wall is not None else None,
            "final": curve[-1][2] if steps else None, "peak_mib": info["peak_rss_mib"],
            "budget_min": info["budget_s"] / 60 if info["budget_s"] else None, "wall_min": info["wall_seconds"] / 60,
            "step_s": statistics.median(step_times) if step_times else None, "command": info["command"],
            "step_cpu_s": step_cpu, "load_cpu_s": load_cpu, "cpu_s": info.get("cpu_seconds"),
            "load_average": info.get("load_average"), "ledger": ledger, "scores": scores,
            "final_trl": success(run / "eval-trl" / f"step-{last}.jsonl") if last else None,
            "cpu_budget_min": info["cpu_budget_s"] / 60 if info.get("cpu_budget_s") else None,
            "train_cpu_min": (info.get("signal_train_cpu_s") or 0) / 60 or None, "code": info.get("code")}


def cell(value: float | None, fmt: str = ".3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def summary_lines(rows: list[dict]) -> list[str]:
    """Per trainer means, the episodes-per-hour ratio, and the seeds where aitrain's final success is ahead."""
    by = {t: [r for r in rows if r["trainer"] == t] for t in ("aitrain", "trl")}
    if not by["aitrain"] or not by["trl"]:
        return []

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.mean(values) if values else None

    out = ["", "| trainer | runs | held-back success at the budget (mean) | episodes/hour (mean) | steps (mean) | "
           "peak memory (mean) |", "| --- | --- | --- | --- | --- | --- |"]
    for trainer, group in by.items():
        out.append(f"| {trainer} | {len(group)} | {cell(mean(r['final'] for r in group))} | "
                   f"{cell(mean(r['per_hour'] for r in group), '.0f')} | {cell(mean(r['steps'] for r in group), '.1f')} | "
                   f"{cell(mean(r['peak_mib'] for r in group) / 1024, '.2f')} GiB |")
    hourly = [mean(r["per_hour"] for r in by[t]) for t in ("aitrain", "trl")]
    ratio = f"**{hourly[0] / hourly[1]:.2f}x**" if all(hourly) else "n/a (resumed runs have no wall minutes)"
    final = {(r["trainer"], r["seed"]): r["final"] for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    both = [s for s in seeds if final.get(("aitrain", s)) is not None and final.get(("trl", s)) is not None]
    ahead = [s for s in both if final[("aitrain", s)] > final[("trl", s)]]
    behind = [s for s in both if final[("aitrain", s)] < final[("trl", s)]]
    out += ["", f"Episodes trained per hour, aitrain / TRL: {ratio} (goal: 1.5x). Held-back success at the "
                f"budget: aitrain ahead on seed(s) {', '.join(map(str, ahead)) or 'none'}, TRL ahead on seed(s) "
                f"{', '.join(map(str, behind)) or 'none'}, of {len(seeds)} (goal: aitrain ahead on every seed)."]
    per_cpu = {t: mean(RECIPE["batch_size"] * 3600 / r["step_cpu_s"] for r in group if r["step_cpu_s"])
               for t, group in by.items()}
    if per_cpu["aitrain"] and per_cpu["trl"]:
        out += ["", f"Episodes per CPU hour of training (16 episodes over a step's CPU seconds), aitrain / TRL: "
                    f"{per_cpu['aitrain']:.0f} / {per_cpu['trl']:.0f} = **{per_cpu['aitrain'] / per_cpu['trl']:.2f}x**."]
    out += ["", "Held-back success at the budget, aitrain - TRL, final checkpoints (head_to_head_stats.py: seeds "
                "paired, a t-interval over the seeds' differences; 'tie' when it holds 0):", ""]
    for loop, name in (("aitrain", "aitrain's loop (`aitrain eval`)"), ("trl", "TRL's loop (`GRPOTrainer.evaluate`)")):
        pairs = {s: (count(next((r["scores"][loop] for r in by["aitrain"] if r["seed"] == s), [])),
                     count(next((r["scores"][loop] for r in by["trl"] if r["seed"] == s), []))) for s in seeds}
        out.append(describe(difference(pairs), name))
    return out


# Where an envs.stations episode ends, by its score (envs/stations_trl.py `episode_score`: each part adds).
OUTCOMES = {0.0: "no tool result", TRIED: "a tool result only", TRIED + FOUND: "the station found",
            TRIED + FOUND + READ: "the reading shown, not answered", 1.0: "answered (success)"}


def outcome_lines(rows: list[dict], start: dict[str, list[float]]) -> list[str]:
    """The share of held-back episodes ending at each stage, per loop: the start's, and each trainer's
    final checkpoints pooled over seeds, so a difference in success says where it comes from (a wrong
    station looked up, a reading never answered...)."""
    table = []
    for loop, name in (("aitrain", "aitrain's"), ("trl", "TRL's")):
        table.append((f"start, {name} loop", start[loop]))
        for trainer in ("aitrain", "trl"):
            table.append((f"{trainer} final, {name} loop",
                           [x for r in rows if r["trainer"] == trainer for x in r["scores"][loop]]))
    table = [(label, scores) for label, scores in table if scores]
    if not table:
        return []
    out = ["", "Where the held-back episodes end (share of episodes by score; final checkpoints pooled over seeds):",
           "", "| checkpoints | episodes | " + " | ".join(OUTCOMES.values()) + " | other |",
           "| --- " * (len(OUTCOMES) + 3) + "|"]
    for label, scores in table:
        counts = [sum(abs(x - level) < 1e-6 for x in scores) for level in OUTCOMES]
        shares = [c / len(scores) for c in counts] + [1 - sum(counts) / len(scores)]
        out.append(f"| {label} | {len(scores)} | " + " | ".join(f"{v:.2f}" for v in shares) + " |")
    return out


def figure(rows: list[dict], path: Path) -> bool:
    """Held-back success against minutes, every run; False when matplotlib is missing."""
    series = [(r["name"], r["trainer"], [(m, s) for m, _, s in r["curve"] if s is not None and m is not None])
              for r in rows]
    return success_figure(series, path, STYLE, "minutes since the process started (model loading included)",
                          "held-back success (aitrain eval)")


def read_rows(runs_dir: Path) -> list[dict]:
    """Every run of the runs folder that the harness started (run.json), by seed then trainer."""
    start = success(runs_dir / "start-eval.jsonl")
    rows = [read_run(p, start) for p in sorted(runs_dir.glob("*-seed*")) if (p / "run.json").is_file()]
    return sorted(rows, key=lambda r: (r["seed"], r["trainer"]))


def results_block(runs_dir: Path, figure_path: Path | None, settled: list[str] = ()) -> str:
    """The runs folder's block; `settled`, the difference over every recorded seed (head_to_head_record.py),
    after the folder's own."""
    start = success(runs_dir / "start-eval.jsonl")
    rows = read_rows(runs_dir)
    made = json.loads((runs_dir / "start.json").read_text()) if (runs_dir / "start.json").exists() else {}
    origin = (f"{made['model']} after `aitrain sft` ({made['demos']} demonstrations, {made['sft_steps']} steps)"
              if made.get("model") else "made elsewhere")
    out = [f"Machine: {describe_machine()}; OMP_NUM_THREADS=1 per process. Start: {origin}, held-back success "
           f"{cell(start)}. Written by `python benchmarks/head_to_head.py report`.", ""]
    if not rows:
        return "\n".join(out + ["No runs in this runs folder yet.", *settled])
    out += ["| run | budget | trained | steps | episodes | episodes/hour | step: wall (median) | step: CPU | "
            "loading: CPU | peak memory | held-back success: start -> final | TRL's loop: start -> final |",
            "| --- " * 12 + "|"]
    start_trl = success(runs_dir / "start-eval-trl.jsonl")
    for r in rows:
        budget = (f"{r['cpu_budget_min']:.1f} CPU min" if r["cpu_budget_min"] else
                  f"{r['budget_min']:.1f} min" if r["budget_min"] else "--max-steps")
        out.append(f"| {r['name']} | {budget} | {cell(r['minutes'], '.1f')} min | {r['steps']} | "
                   f"{r['episodes']} | {cell(r['per_hour'], '.0f')} | {cell(r['step_s'], '.1f')} s | "
                   f"{cell(r['step_cpu_s'], '.1f')} s | {cell(r['load_cpu_s'], '.0f')} s | "
                   f"{r['peak_mib'] / 1024:.2f} GiB | {cell(start)} -> {cell(r['final'])} | "
                   f"{cell(start_trl)} -> {cell(r['final_trl'])} |")
    loads = [r["load_average"][0] for r in rows if r.get("load_average")]
    if loads:
        out += ["", "Step wall time is TRL's `step_time` (both trainers log it: aitrain's trainer is TRL's); step CPU "
                    "is the process's CPU seconds over its training steps, what a step takes on a core of its own. "
                    f"Load average when the runs ended: {', '.join(f'{v:.1f}' for v in loads)} (2 cores)."]
    out += summary_lines(rows)
    out += list(settled)
    out += outcome_lines(rows, {loop: [r["score"] for r in read_jsonl(runs_dir / f"start-eval{suffix}.jsonl")]
                                for loop, suffix in (("aitrain", ""), ("trl", "-trl"))})
    out += ["", "Held-back success at each checkpoint (step, minutes since the start of the process):", ""]
    for r in rows:
        points = ", ".join(f"step {s} ({cell(m, '.1f')} min): {cell(v)}" for m, s, v in r["curve"][1:])
        out.append(f"- {r['name']}: start {cell(start)}; {points or 'no checkpoint'}")
    if any(r["ledger"] for r in rows):
        out += ["", "In-training held-back evaluation (each trainer's own: aitrain's `--eval-every`, TRL's "
                    "`eval_strategy=\"steps\"`; success at CPU minutes of training, evaluation left out):", ""]
        for r in rows:
            points = ", ".join(f"step {e['step']} ({e['train_cpu_s'] / 60:.1f} CPU min): {cell(e['success'])}"
                               for e in r["ledger"])
            out.append(f"- {r['name']}: {points}")
    cpu_runs = [r for r in rows if r["cpu_budget_min"]]
    if cpu_runs:
        out += ["", f"Budget: {cpu_runs[0]['cpu_budget_min']:.1f} CPU minutes of training a run (the process tree's "
                    "CPU less its in-training evaluations'); training CPU when stopped: "
                    + ", ".join(f"{r['name']} {cell(r['train_cpu_min'], '.1f')}" for r in cpu_runs) + " min."]
    if figure_path is not None and figure(rows, figure_path):
        out += ["", f"![held-back success against minutes]({figure_path.name})"]
    curves = figure_path.with_name(figure_path.stem + "_cpu.png") if figure_path is not None else None
    if curves is not None and curve_figure(rows, curves, STYLE):
        out += ["", f"![in-training held-back success against CPU minutes]({curves.name})"]
    codes = sorted({r["code"] for r in rows if r.get("code")})
    if codes:
        out += ["", "Code (the commit each run's last process started on): " + "; ".join(
            f"{code}: {', '.join(r['name'] for r in rows if r.get('code') == code)}" for code in codes) + "."]
    shown_seed = min(r["seed"] for r in rows)  # each trainer's first row is of the folder's lowest seed
    out += ["", f"Each run's command (seed {shown_seed}'s; the other seeds change `--seed` and the folder):", ""]
    for trainer in ("aitrain", "trl"):
        first = next((r for r in rows if r["trainer"] == trainer), None)
        if first:
            shown = [a.replace(str(REPO) + "/", "") for a in first["command"]]
            out += ["```bash", shlex.join(["python", *shown[1:]]), "```"]
    return "\n".join(out)


def write_report(runs_dir: Path, md: Path, argv: list[str]) -> str:
    """The results block into `md`, after adding the folder's evaluated runs to the record beside it."""
    starts = {loop: [r["score"] for r in read_jsonl(runs_dir / f"start-eval{suffix}.jsonl")]
              for loop, suffix in (("aitrain", ""), ("trl", "-trl"))}
    starts = {loop: list(count(scores)) if scores else None for loop, scores in starts.items()}
    source = f"trained on {describe_machine()}, recorded {datetime.date.today().isoformat()}"
    record = add_runs(record_path(md), read_rows(runs_dir), starts, weights_digest(runs_dir / "start"), source)
    block = results_block(runs_dir, md.parent / f"{md.stem.lower()}.png", settled_lines(record))
    if not md.exists():
        md.write_text("# Head to head with TRL\n")
    write_block(block, BEGIN, END, md)
    return block
