"""The evaluation ledger of a head-to-head run: when each in-training held-back evaluation began and ended,
in the process's CPU seconds, and what it measured. Both runners write it (head_to_head_aitrain.py around
aitrain's HeldBackEvaluation, head_to_head_trl.py around TRL's `evaluate`) to the file named by
`H2H_EVAL_LEDGER`; the harness reads it to leave evaluation out of a CPU budget (head_to_head_jobs.py),
the report to draw held-back success against training CPU minutes.

A record is a JSON line: `{"event": "begin", "step", "time", "cpu"}` as an evaluation starts,
`{"event": "end", "step", "time", "cpu", "success", "mean_score", "episodes"}` as it ends, and
`{"event": "save", "step", "time", "cpu"}` once checkpoint-<step> is written. `cpu` is the run's CPU
seconds: the process's user + system seconds with its waited-for children (`resource.getrusage`), what the
harness counts of a process that has no live children, which neither trainer keeps here, plus
`H2H_CPU_OFFSET` (a resumed run: what its earlier processes had used when the checkpoint it goes on from
was saved), so one run's ledger counts on across its processes.

Resuming (`head_to_head.py train --resume`): `resume_point` is a checkpoint's CPU, `until` the ledger as
it stood then; what came after (work the stopped process did past its last checkpoint) is dropped.

Left out: several processes (one writer a run), and the episodes themselves (their share scoring 1.0 is
`success`; the settled comparison evaluates the final checkpoints apart, episode by episode).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

LEDGER_ENV = "H2H_EVAL_LEDGER"
CPU_OFFSET_ENV = "H2H_CPU_OFFSET"


def process_cpu() -> float:
    """The run's CPU seconds so far: this process's (and its waited-for children's) plus the offset."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    offset = float(os.environ.get(CPU_OFFSET_ENV) or 0.0)
    return offset + own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Ledger:
    """Appends begin/end records to the file `H2H_EVAL_LEDGER` names (or to `path`); a no-op without one."""

    def __init__(self, path: str | Path | None = None):
        path = path or os.environ.get(LEDGER_ENV)
        self.path = Path(path) if path else None

    def _write(self, record: dict) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as out:
                out.write(json.dumps(record) + "\n")

    def begin(self, step: int) -> None:
        self._write({"event": "begin", "step": step, "time": time.time(), "cpu": process_cpu()})

    def end(self, step: int, success: float | None, mean_score: float | None, episodes: int) -> None:
        self._write({"event": "end", "step": step, "time": time.time(), "cpu": process_cpu(), "success": success,
                     "mean_score": mean_score, "episodes": episodes})

    def save(self, step: int) -> None:
        self._write({"event": "save", "step": step, "time": time.time(), "cpu": process_cpu()})


def read_ledger(path: Path | None) -> list[dict]:
    if path is None or not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            pass
    return out


def spent(records: list[dict], now_cpu: float | None = None) -> float:
    """CPU seconds of the finished evaluations, and of one under way up to `now_cpu` when given."""
    total, begun = 0.0, None
    for record in records:
        if record["event"] == "begin":
            begun = record["cpu"]
        elif record["event"] == "end" and begun is not None:
            total, begun = total + record["cpu"] - begun, None
    if begun is not None and now_cpu is not None:
        total += max(0.0, now_cpu - begun)
    return total


def curve(records: list[dict]) -> list[dict]:
    """Each finished evaluation with `train_cpu_s`: the process's CPU seconds when it began, less the
    evaluations before it (model loading included, as in the budget)."""
    out, before, begun = [], 0.0, None
    for record in records:
        if record["event"] == "begin":
            begun = record
        elif record["event"] == "end" and begun is not None:
            out.append({**record, "train_cpu_s": begun["cpu"] - before, "eval_cpu_s": record["cpu"] - begun["cpu"]})
            before += record["cpu"] - begun["cpu"]
            begun = None
    return out


def _resume_record(records: list[dict], step: int) -> int | None:
    """The index of the record that marks checkpoint `step` as saved: its save record, or, in a ledger
    written before save records, the end of that step's evaluation (both trainers save a step's checkpoint
    right after its evaluation); None when neither is there."""
    saves = [i for i, r in enumerate(records) if r["event"] == "save" and r["step"] == step]
    if saves:
        return saves[-1]
    if any(r["event"] == "save" for r in records):
        return None
    ends = [i for i, r in enumerate(records) if r["event"] == "end" and r["step"] == step]
    return ends[-1] if ends else None


def resume_point(records: list[dict], step: int) -> float | None:
    """The run's CPU seconds when checkpoint `step` was saved, or None when the ledger cannot tell."""
    index = _resume_record(records, step)
    return None if index is None else records[index]["cpu"]


def until(records: list[dict], step: int) -> list[dict]:
    """The ledger as it stood when checkpoint `step` was saved (resume_point must know the step)."""
    index = _resume_record(records, step)
    if index is None:
        raise ValueError(f"the ledger does not say when checkpoint-{step} was saved")
    return records[: index + 1]


def write_ledger(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
