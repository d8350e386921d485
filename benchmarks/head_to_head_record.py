"""The head to head's durable record (benchmarks/head_to_head_seeds.json, committed): what the settled
difference needs of each seed, kept in the repository so that a seed's result outlives the machine that
trained it.

A run's checkpoints and episode files live in the runs folder, which is not committed, and a session's
machine is not kept: seeds trained on one machine and seeds trained on the next would never meet in one
runs folder. The difference needs, of each trainer and seed, only its final checkpoint's held-back
successes in each loop, so `head_to_head.py report` adds every run of the runs folder that has them to the
record (one entry a trainer and seed; recorded again, it is replaced) and gives the difference over every
seed the record holds, whichever machine trained it.

Pairing: a seed's two trainers must start from the same model. Each entry keeps its start's weights
digest (sha256 of its safetensors files); a seed whose trainers' digests differ is left out of the
difference, and said so. Seeds may start from different rebuilds of the start (`head_to_head.py sft` on
another CPU rounds differently): that adds to the seed-to-seed spread, which the t-interval holds.

Entries recovered from the write-up of a lost machine say so in `source` and have no digest; their counts
are exact (success out of 128 episodes given to three decimals tells k/128 apart).

Left out: the episode files themselves (the outcome table and the curves are per runs folder).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from head_to_head_stats import count, describe, difference

LOOPS = {"aitrain": "aitrain's loop (`aitrain eval`)", "trl": "TRL's loop (`GRPOTrainer.evaluate`)"}


def record_path(md: Path) -> Path:
    """HEAD_TO_HEAD.md's record: head_to_head_seeds.json beside it."""
    return md.with_name(f"{md.stem.lower()}_seeds.json")


def read_record(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"runs": []}


def weights_digest(folder: Path) -> str | None:
    """sha256 over a model folder's safetensors files, in name order; None when it has none."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def entry(row: dict, start: dict, digest: str | None, source: str) -> dict | None:
    """A run's record entry from head_to_head_report.read_run's row; None until both loops evaluated it."""
    if not (row["scores"]["aitrain"] and row["scores"]["trl"]):
        return None
    return {"trainer": row["trainer"], "seed": row["seed"], "steps": row["steps"],
            "aitrain_loop": list(count(row["scores"]["aitrain"])), "trl_loop": list(count(row["scores"]["trl"])),
            "start_aitrain_loop": start.get("aitrain"), "start_trl_loop": start.get("trl"),
            "step_cpu_s": row["step_cpu_s"], "peak_gib": round(row["peak_mib"] / 1024, 2),
            "train_cpu_min": row["train_cpu_min"], "code": row["code"], "start_sha256": digest, "source": source}


def add_runs(path: Path, rows: list[dict], start: dict, digest: str | None, source: str) -> dict:
    """Write every evaluated run of `rows` into the record at `path` (replacing its earlier entry)."""
    record = read_record(path)
    for row in rows:
        new = entry(row, start, digest, source)
        if new is not None:
            record["runs"] = [r for r in record["runs"] if (r["trainer"], r["seed"]) != (row["trainer"], row["seed"])]
            record["runs"].append(new)
    record["runs"].sort(key=lambda r: (r["seed"], r["trainer"]))
    write_record(path, record)
    return record


def write_record(path: Path, record: dict) -> None:
    """One entry a line, so a seed's change is one line of the diff."""
    path.write_text('{"runs": [\n' + ",\n".join(json.dumps(r) for r in record["runs"]) + "\n]}\n")


def settled_lines(record: dict) -> list[str]:
    """The difference over every seed the record pairs, per loop, and the seeds it leaves out."""
    by_seed: dict[int, dict[str, dict]] = {}
    for run in record["runs"]:
        by_seed.setdefault(run["seed"], {})[run["trainer"]] = run
    paired, unpaired = {}, []
    for seed, runs in sorted(by_seed.items()):
        if set(runs) != {"aitrain", "trl"}:
            unpaired.append(f"seed {seed} (only {', '.join(runs)})")
        elif runs["aitrain"]["start_sha256"] != runs["trl"]["start_sha256"]:
            unpaired.append(f"seed {seed} (its trainers started from different weights)")
        else:
            paired[seed] = runs
    if not paired:
        return []
    n = len(paired)
    out = ["", f"Held-back success at the budget over the {n} seed{'s' if n > 1 else ''} recorded in head_to_head_seeds.json "
               f"(final checkpoints, both loops; {sources_note(paired)}):", ""]
    for loop, name in LOOPS.items():
        pairs = {s: (tuple(r["aitrain"][f"{loop}_loop"]), tuple(r["trl"][f"{loop}_loop"])) for s, r in paired.items()}
        out.append(describe(difference(pairs), name))
    out += ["", "| seed | trainer | steps | held-back success, aitrain's loop | TRL's loop | start (aitrain's / TRL's loop) "
                "| code |", "| --- " * 7 + "|"]
    for run in record["runs"]:
        start = " / ".join(share(run.get(f"start_{loop}_loop")) for loop in LOOPS)
        out.append(f"| {run['seed']} | {run['trainer']} | {run['steps']} | {share(run['aitrain_loop'])} | "
                   f"{share(run['trl_loop'])} | {start} | {run.get('code') or 'n/a'} |")
    if unpaired:
        out += ["", "Left out: " + "; ".join(unpaired) + "."]
    return out


def share(counts: list[int] | None) -> str:
    """'0.789 (101/128)'; 'n/a' when not recorded."""
    return f"{counts[0] / counts[1]:.3f} ({counts[0]}/{counts[1]})" if counts and counts[1] else "n/a"


def sources_note(paired: dict[int, dict]) -> str:
    """Where each seed comes from: 'seeds 1, 2 recovered from ...; seed 4 trained on <machine>, recorded <date>'."""
    sources: dict[str, list[int]] = {}
    for seed, runs in paired.items():
        sources.setdefault(runs["aitrain"]["source"], []).append(seed)
    return "; ".join(f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} {source}"
                     for source, seeds in sources.items())
