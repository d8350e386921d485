"""The formats of a run's files and the few ways they are written and read, each said once.

- `episode_record`: one episode as a JSON-ready dict, the line format of `episodes.jsonl` (training)
  and of `aitrain eval --output`; it carries the stop reason, and secrets are redacted from it. Callers add
  their own keys (step, group, an async run's `weight_version` and `staleness`: runlog/files.py).
- `json_safe`: non-finite floats become None anywhere inside a value (JSON has no NaN).
- `append_jsonl`, `write_jsonl`, `read_jsonl`, `drop_records_after`: JSONL files written a line per
  record (appended, or whole and atomically), read back skipping a torn last line, and cut back to a
  step when a run resumes.

Left out: when each file is written (runlog/files.py) and what the page does with them (report.py), and
write-then-rename itself (`written_atomically`, `publish`: outputs.py, below every layer that writes).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aitrain_grpo.engine.stats import EpisodeSummary
from aitrain_grpo.env.base import Episode
from aitrain_grpo.outputs import written_atomically
from aitrain_grpo.runlog.redaction import redact_strings

# A training run's per-step logs, by name: what each step appends (runlog/files.py), what the report and
# the held-back evaluation read and add to.
METRICS_FILE = "metrics.jsonl"
SCORES_FILE = "scores.jsonl"
EPISODES_FILE = "episodes.jsonl"
STEP_LOGS = (METRICS_FILE, SCORES_FILE, EPISODES_FILE)
ROW_TEXT_LIMIT = 200  # longer string columns of a dataset row are left out of records


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float (anywhere inside it) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _shown(messages: list) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if isinstance(v, (str, int, float, bool, type(None)))} for m in messages]


def episode_record(episode: Episode, **extra: Any) -> dict[str, Any]:
    """One episode as a JSON-ready dict: the whole conversation, score, turns, why it stopped, error,
    metrics, and the dataset row's short scalar columns (task ids, answers) so a transcript can be
    traced to its task. Where a context strategy rewrote its history (engine/context.py), `messages` is
    the last sequence's and `earlier_messages` each earlier sequence's, with the turns it was cut after."""
    row = {
        k: v for k, v in episode.row.items()
        if k != "prompt" and (isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= ROW_TEXT_LIMIT))
    }
    return redact_strings(json_safe({  # transcripts never hold the values of secret environment variables
        **extra,
        **asdict(EpisodeSummary.of(episode)),  # score, turns, stop_reason, error, tool use, metrics
        "row": row,
        "tool_call_forms": list(episode.tool_call_forms),  # per model turn: the form its calls were read in
        "turn_rewards": list(episode.turn_rewards),  # per model turn: the environment's reward (episode.reward_turn)
        "messages": _shown(episode.messages),
        **({"earlier_messages": [_shown(seen) for seen in episode.log.earlier_messages],
            "rewrite_turns": list(episode.log.rewrite_turns)} if episode.log.rewrite_turns else {}),
    }))


# ----------------------------------------------------------------------------------------- JSONL


def _lines(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(json_safe(record), default=str) + "\n" for record in records)


def append_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Append one line per record (non-finite floats written as null)."""
    with path.open("a") as f:
        f.write(_lines(records))


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Write the file afresh, one line per record; a reader sees the old file or the whole new one."""
    with written_atomically(path) as partial:
        partial.write_text(_lines(records))


# What every episode record holds (`episode_record`): how a file of them is told from other JSONL.
_EPISODE_KEYS = ("score", "turns", "stop_reason", "row", "messages")


def is_episode_records(path: Path) -> bool:
    """Whether `path`'s first line is an episode record (`aitrain eval --output`, transcripts): a file
    `eval --output` may replace. A dataset, a run's metrics.jsonl or anything else is not."""
    try:
        with path.open(errors="replace") as lines:
            first = json.loads(lines.readline())
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and all(key in first for key in _EPISODE_KEYS)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a torn line (a run still writing, or killed mid-line) is skipped."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def drop_records_after(path: Path, step: int) -> None:
    """Keep only the records of steps up to `step` (all of them go for a fresh run, step 0)."""
    if not path.exists():
        return
    if step <= 0:
        path.unlink()
        return
    write_jsonl(path, [r for r in read_jsonl(path) if isinstance(r.get("step"), int) and r["step"] <= step])
