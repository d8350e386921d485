"""`report.html`: one self-contained page about a training run, built from the files in its output directory.

The page reads nothing from the network. Python gathers the run's data (`run_config.json`,
`run_summary.json`, `metrics.jsonl`, `scores.jsonl`, `episodes.jsonl`) into one JSON object embedded
in the page; a small inline script draws the charts as SVG (reward mean with its std band, the score
distribution early vs late, turns and errors over steps, every other logged metric) and lists the
sampled transcripts with tool calls and tool results laid out readably. When the shortcut warning fired
(shortcuts.py), report_shortcut.js marks the charts behind it and sets the best transcripts of the first
and last logged steps side by side. A run with held-back evaluation (evaluation/held_back.py) gets, first among
the training charts, held-back success against wall-clock minutes beside the training reward
(report_held_back.js).

Model text is never interpreted as HTML: the JSON is embedded with `<`, `>` and `&` escaped (so no
`</script>` inside it can end the block), and the script puts text into the page with `textContent`
only. A completion that contains `<script>` shows as those characters.

Left out: live updating (the page is regenerated during training and by `aitrain report DIR`), and the
record formats of the files it reads (records.py).
"""

from __future__ import annotations

import html
import json
import math
import time
from pathlib import Path
from typing import Any

from aitrain_grpo.outputs import written_atomically
from aitrain_grpo.runlog.records import EPISODES_FILE, METRICS_FILE, SCORES_FILE, json_safe, read_jsonl

REPORT_FILE = "report.html"  # in the run folder
TEMPLATE = Path(__file__).with_name("report_template.html")
DATA_MARK = "__AITRAIN_REPORT_DATA__"
TITLE_MARK = "__AITRAIN_REPORT_TITLE__"
SHORTCUT_MARK = "__AITRAIN_REPORT_SHORTCUT_SCRIPT__"
SHORTCUT_SCRIPT = Path(__file__).with_name("report_shortcut.js")  # the shortcut warning's part of the page
STYLE_MARK = "__AITRAIN_REPORT_STYLE__"
HELD_BACK_MARK = "__AITRAIN_REPORT_HELD_BACK_SCRIPT__"
HELD_BACK_SCRIPT = Path(__file__).with_name("report_held_back.js")  # held-back success over wall-clock time
STYLE = Path(__file__).with_name("report_style.css")  # the page's style sheet, inlined: the report is one file
MAX_EPISODES = 300        # transcripts embedded in the page, spread over the run
MAX_METRIC_POINTS = 2000  # steps kept per chart; longer runs are thinned evenly (the last step kept)


def _by_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step, the last written winning (a resumed run may repeat steps), in step order."""
    latest: dict[int, dict[str, Any]] = {}
    for record in records:
        if isinstance(record.get("step"), int):
            latest[record["step"]] = record
    return [latest[s] for s in sorted(latest)]


def _thin(items: list, limit: int) -> list:
    if len(items) <= limit:
        return items
    stride = len(items) / limit
    picked = [items[int(i * stride)] for i in range(limit - 1)]
    return picked + [items[-1]]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _best_of_first_and_last_step(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The best-scoring logged episode of the first and of the last step with logged episodes: side by side,
    they show what the reward paid for at the start and what it pays for now (the shortcut warning's question)."""
    def best(step: int) -> dict[str, Any]:
        return max((e for e in episodes if e.get("step") == step), key=lambda e: _score(e))

    steps = sorted({e["step"] for e in episodes if isinstance(e.get("step"), int)})
    if not steps:
        return {}
    return {"first": best(steps[0]), "last": best(steps[-1]) if len(steps) > 1 else None}


def _score(episode: dict[str, Any]) -> float:
    score = episode.get("score")
    return float(score) if isinstance(score, (int, float)) and math.isfinite(score) else -math.inf


def held_back_gain(metrics: list[dict[str, Any]]) -> dict[str, float] | None:
    """Held-back success at the run's first and last evaluation, the training hours between them (wall
    clock, `time/elapsed_s`), the gain an hour: the number that says whether training paid, on tasks it
    did not train on, and (`interval`) the last evaluation's 95 % interval of the gain, paired by task
    (evaluation/held_back.py). None with fewer than two evaluations or no time between them."""
    points = [(r["time/elapsed_s"], r["eval/success"]) for r in metrics
              if isinstance(r.get("eval/success"), (int, float)) and isinstance(r.get("time/elapsed_s"), (int, float))]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    hours = (points[-1][0] - points[0][0]) / 3600
    first, last = points[0][1], points[-1][1]
    gain = {"first": first, "last": last, "hours": hours, "per_hour": (last - first) / hours}
    final = [r for r in metrics if isinstance(r.get("eval/success"), (int, float))][-1]
    if isinstance(final.get("eval/success_gain_low"), (int, float)):  # its 95 % interval, paired by task
        gain["interval"] = [final["eval/success_gain_low"], final["eval/success_gain_high"]]
    return gain


def report_data(output_dir: str | Path) -> dict[str, Any]:
    """Everything the page shows, as one JSON-ready dict."""
    # health.py defines a trainer callback, so importing it loads transformers and torch (seconds):
    # `aitrain report` pays that only when it gets this far.
    from aitrain_grpo.runlog.health import first_warnings
    from aitrain_grpo.runlog.shortcuts import first_shortcut

    output_dir = Path(output_dir)
    config = _read_json(output_dir / "run_config.json")
    summary = _read_json(output_dir / "run_summary.json")
    metrics = _by_step(read_jsonl(output_dir / METRICS_FILE))
    scores = _by_step(read_jsonl(output_dir / SCORES_FILE))
    episodes = [e for e in read_jsonl(output_dir / EPISODES_FILE) if isinstance(e.get("messages"), list)]
    shortcut = first_shortcut(metrics)
    numeric = [
        {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        for record in metrics
    ]
    return {
        "title": f"{config.get('rl_env_class') or output_dir.name} · {output_dir.name}",
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "output_dir": str(output_dir.resolve()),
        "config": {k: v for k, v in config.items() if isinstance(v, (str, int, float, bool, type(None)))},
        "summary": summary,
        "metrics": _thin(numeric, MAX_METRIC_POINTS),
        "scores": _thin([{"step": s["step"], "scores": s.get("scores", [])} for s in scores], MAX_METRIC_POINTS),
        "episodes": _thin(episodes, MAX_EPISODES),
        "episodes_total": len(episodes),
        "health": [w.to_dict() for w in first_warnings(metrics)],
        "shortcut": shortcut.to_dict() if shortcut else None,
        "shortcut_examples": _best_of_first_and_last_step(episodes) if shortcut else {},
        "held_back_gain": held_back_gain(metrics),
    }


# ------------------------------------------------------------------------------------ writing the page


def embed_json(data: Any) -> str:
    """JSON that is safe inside `<script type="application/json">`: no `<`, `>` or `&` survive as such,
    so nothing in it can close the block or open a comment; JSON.parse reads the escapes back."""
    text = json.dumps(json_safe(data), ensure_ascii=False, allow_nan=False, default=str)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def render_report(data: dict[str, Any]) -> str:
    page = TEMPLATE.read_text().replace(STYLE_MARK, STYLE.read_text())  # the page's own parts, before any run text
    page = page.replace(SHORTCUT_MARK, SHORTCUT_SCRIPT.read_text())
    page = page.replace(HELD_BACK_MARK, HELD_BACK_SCRIPT.read_text())
    page = page.replace(TITLE_MARK, html.escape(str(data.get("title", "training report"))))
    return page.replace(DATA_MARK, embed_json(data))


_PAGE_MARK = "· aitrain report</title>"  # in every page's title (report_template.html)


def is_report_page(path: Path) -> bool:
    """Whether `path` is a page `write_report` wrote: one `report --output` may replace."""
    try:
        with path.open(errors="replace") as page:
            return _PAGE_MARK in page.read(4096)
    except OSError:
        return False


def write_report(output_dir: str | Path, path: str | Path | None = None) -> Path:
    """Render the run in `output_dir` to `path` (default: `<output_dir>/report.html`), atomically."""
    output_dir = Path(output_dir)
    target = Path(path) if path else output_dir / REPORT_FILE
    page = render_report(report_data(output_dir))
    with written_atomically(target) as partial:  # a browser open on the old page never sees half the new one
        partial.write_text(page, encoding="utf-8")
    return target
