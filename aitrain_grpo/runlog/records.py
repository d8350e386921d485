"""The formats of a run's files and the few ways they are written and read, each said once.

- `episode_record`: one episode as a JSON-ready dict, the line format of `episodes.jsonl` (training)
  and of `aitrain eval --output`; it carries the stop reason, and secrets are redacted from it. Callers add
  their own keys (step, group, an async run's `weight_version` and `staleness`: runlog/files.py).
- `json_safe`: non-finite floats become None anywhere inside a value (JSON has no NaN).
- `append_jsonl`, `write_jsonl`, `read_jsonl`, `drop_records_after`: JSONL files written a line per
  record (appended, or whole and atomically), read back skipping a torn last line, and cut back to a
  step when a run resumes.
- `written_atomically` / `publish`: write-then-rename, so a reader (a browser on report.html, a vLLM
  server loading weights, a resume looking for checkpoints) never sees half a file or folder.

Left out: when each file is written (runlog/files.py) and what the page does with them (report.py).
Nothing is fsync'd: the case handled is a killed process, not a power cut.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from aitrain_grpo.engine.stats import EpisodeSummary
from aitrain_grpo.env.base import Episode
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.runlog.redaction import redact_strings

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


def episode_record(episode: Episode, **extra: Any) -> dict[str, Any]:
    """One episode as a JSON-ready dict: the whole conversation, score, turns, why it stopped, error,
    metrics, and the dataset row's short scalar columns (task ids, answers) so a transcript can be
    traced to its task."""
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
        "messages": [{k: v for k, v in m.items() if isinstance(v, (str, int, float, bool, type(None)))}
                     for m in episode.messages],
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


# ---------------------------------------------------------------------------------- write, then rename


def publish(temporary: Path, final: Path) -> None:
    """Move a finished file or folder into place. Within one file system the rename is atomic: `final`
    is either the old version or the whole new one. A file replaces a file; a folder replaces only a
    folder of the same name that this package wrote before (a checkpoint or weight version saved
    again); a file never replaces a folder (refused: the caller's path check should have caught it)."""
    if final.is_dir() and not final.is_symlink():
        if not temporary.is_dir():
            raise ConfigError(f"{final} is a folder; it is not replaced by a file (pass a file path)")
        shutil.rmtree(final)
    temporary.replace(final)


@contextlib.contextmanager
def written_atomically(final: Path, *, folder: bool = False) -> Iterator[Path]:
    """Yield a hidden temporary path next to `final` (an empty folder with `folder=True`) to write
    into; once the block finishes, it becomes `final`. A block that raises leaves `final` untouched."""
    temporary = final.parent / f".{final.name}.partial"
    if temporary.is_dir():
        shutil.rmtree(temporary)
    else:
        temporary.unlink(missing_ok=True)
    if folder:
        temporary.mkdir(parents=True)
    yield temporary
    publish(temporary, final)
