"""What a run leaves to look at: progress lines, episodes.jsonl, scores.jsonl, the tracker's metrics, and
report.html, which a real browser (headless Chromium) renders with its charts and transcripts, showing
model text as text."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aitrain_grpo.commands.cli import app
from aitrain_grpo.engine.runner import play
from aitrain_grpo.runlog.records import episode_record
from aitrain_grpo.runlog.report import write_report
from helpers import run_cli
from helpers.browser import browse, rendered_dom

STEPS = 3
GROUP = 4
BATCH = 8
SAMPLED = 3  # --log-episodes-count
# Would run if the page let model text become markup: the first line breaks out of a script block, the
# second through innerHTML. Written without double quotes or spaces, which JSON escaping would defuse.
INJECTION = (
    "</script><script>document.body.appendChild(Object.assign(document.createElement('div'),{id:'pwned'}))</script>"
    "<img src=x onerror=document.body.setAttribute('data-pwned','yes')><!-- & done"
)


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    """One real short hotel run: episodes sampled at steps 1 and 2, metrics also sent to TensorBoard."""
    out = tmp_path_factory.mktemp("report") / "hotel"
    result = run_cli(
        "grpo", "--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv", "--rl-env-config", '{"num_tasks": 8, "seed": 3}',
        "--model", tiny_model_dir, "--output-dir", str(out), "--max-steps", str(STEPS), "--batch-size", str(BATCH),
        "--rl-num-generations", str(GROUP), "--rl-max-new-tokens", "24", "--log-episodes-every", "2",
        "--log-episodes-count", str(SAMPLED), "--report-to", "tensorboard",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_progress_is_plain_lines_when_stdout_is_not_a_terminal(run):
    _, result = run
    lines = result.stdout.splitlines()
    for step in range(1, STEPS + 1):
        assert any(re.match(rf"step {step}/{STEPS}  reward \d\.\d{{3}}±\d\.\d{{3}}  turns \d", line) for line in lines), result.stdout
    assert "\x1b[" not in result.stdout  # no colours, no cursor movement


def test_episodes_and_scores_files(run):
    out, _ = run
    scores = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert [s["step"] for s in scores] == [1, 2, 3]
    assert all(len(s["scores"]) == BATCH and all(0.0 <= x <= 1.0 for x in s["scores"]) for s in scores)
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [e["step"] for e in episodes] == [1] * SAMPLED + [2] * SAMPLED  # step 1, then every 2nd step
    for episode in episodes:
        assert episode["messages"][0]["role"] == "system" and episode["messages"][1]["role"] == "user"
        assert any(m["role"] == "assistant" for m in episode["messages"])
        assert episode["turns"] >= 1 and "error" in episode and "task_id" in episode["row"]
        # The score is the one the step's batch recorded for that episode.
        assert episode["score"] == scores[episode["step"] - 1]["scores"][episode["index"]]
    # The best and the worst of the batch are always among the sample.
    step_one = [e["score"] for e in episodes if e["step"] == 1]
    assert max(step_one) == max(scores[0]["scores"]) and min(step_one) == min(scores[0]["scores"])


def _tensorboard_tags(out: Path) -> set[str]:
    from tensorboardX.proto.event_pb2 import Event

    tags = set()
    for path in out.glob("runs/**/events.out.tfevents*"):
        data = path.read_bytes()
        at = 0
        while at < len(data):  # TFRecord: length (u64), its crc (u32), the record, its crc (u32)
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = Event.FromString(data[at + 12:at + 12 + length])
            tags.update(value.tag for value in event.summary.value)
            at += 12 + length + 4
    return tags


def test_report_to_tensorboard_carries_the_env_metrics(run):
    pytest.importorskip("tensorboardX")
    out, _ = run
    tags = _tensorboard_tags(out)
    assert {"train/reward", "train/env/score_mean", "train/env/turns_mean", "train/env/errors"} <= tags, sorted(tags)


def test_the_report_written_at_the_end_has_the_runtime(run):
    out, _ = run
    summary = json.loads((out / "run_summary.json").read_text())
    assert f'"runtime_seconds": {json.dumps(summary["runtime_seconds"])}' in (out / "report.html").read_text()


def test_report_is_self_contained(run):
    out, _ = run
    page = (out / "report.html").read_text()
    assert not re.search(r"<(script|img|link|iframe)[^>]+(src|href)=", page, re.I)  # nothing loaded from anywhere
    assert "default-src 'none'" in page  # and the browser is told to refuse network loads


def test_the_report_renders_charts_and_transcripts_in_chromium(run, tmp_path):
    out, _ = run
    dom = rendered_dom(out / "report.html", tmp_path)
    reward = re.search(r'<svg[^>]*data-chart="reward".*?</svg>', dom, re.S)
    assert reward and 'class="line"' in reward.group(0) and 'class="band"' in reward.group(0)
    assert reward.group(0).count("<circle") == STEPS  # one point per logged step
    scores = re.search(r'<svg[^>]*data-chart="scores".*?</svg>', dom, re.S)
    assert scores and 'class="bar"' in scores.group(0)
    for chart in ("turns", "errors", "env/booked", "entropy"):
        assert f'data-chart="{chart}"' in dom, chart
    assert dom.count('<details class="episode"') == 2 * SAMPLED
    assert "book the cheapest" in dom.lower() or "cheapest option" in dom  # the guest's request is shown
    shot = tmp_path / "report.png"
    browse(out / "report.html", tmp_path / "profile", f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_aitrain_report_regenerates_the_page(run, tmp_path):
    out, _ = run
    copy = tmp_path / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("runs", "*.safetensors"))
    (copy / "report.html").unlink()
    result = CliRunner().invoke(app, ["report", str(copy)])
    assert result.exit_code == 0, result.output
    assert f"report written to {copy / 'report.html'}" in result.stdout
    assert "HotelEnv" in (copy / "report.html").read_text()


@pytest.mark.parametrize("name, fragment", [
    ("missing", "is not a directory"), ("empty", "has no metrics.jsonl"),
    ("no-steps", "metrics.jsonl holds no step's record"), ("not-metrics", "metrics.jsonl holds no step's record"),
])
def test_aitrain_report_on_something_that_is_not_a_run(tmp_path, name, fragment):
    (tmp_path / "empty").mkdir()
    for folder, text in (("no-steps", ""), ("not-metrics", '{"truncated": \n[1, 2]\n')):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "metrics.jsonl").write_text(text)
    result = CliRunner().invoke(app, ["report", str(tmp_path / name)])
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and fragment in result.stderr


@pytest.fixture
def hostile_run(tmp_path) -> Path:
    """A run directory whose transcripts hold real oracle episodes with tool calls, plus a model turn
    that tries to inject markup."""
    from envs.hotel import HotelEnv

    run = tmp_path / "hostile"
    run.mkdir()
    env = HotelEnv(num_tasks=2, seed=1)
    episodes = play(env, env.build_dataset(None), env.solve)
    records = [episode_record(ep, step=1, index=i, group=0) for i, ep in enumerate(episodes)]
    records[1]["messages"].append({"role": "assistant", "content": INJECTION})
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward": 0.5, "reward_std": 0.1, "env/turns_mean": 2.0, "env/errors": 0.0}) + "\n"
        for s in (1, 2)))
    (run / "run_config.json").write_text(json.dumps({"rl_env_class": "<b>Hotel</b>", "model": "tiny"}))
    write_report(run)
    return run


def test_model_text_shows_as_text_and_never_runs(hostile_run, tmp_path):
    page = (hostile_run / "report.html").read_text()
    assert "</script><script>document" not in page and "<img src=x" not in page and "<b>Hotel</b>" not in page
    dom = rendered_dom(hostile_run / "report.html", tmp_path)
    assert 'id="pwned"' not in dom and "data-pwned=" not in dom.split("<main>")[0]  # nothing executed
    assert "&lt;/script&gt;&lt;script&gt;document.body.appendChild" in dom  # the text is on the page, as text
    assert "&lt;b&gt;Hotel&lt;/b&gt;" in dom


def test_tool_calls_and_results_are_laid_out(hostile_run, tmp_path):
    dom = rendered_dom(hostile_run / "report.html", tmp_path)
    calls = re.findall(r'<div class="tool-call"><span class="name">→ (\w+)</span>', dom)
    assert calls[:3] == ["search_hotels", "check_availability", "book_hotel"], calls
    assert '"city": "' in dom  # arguments pretty-printed as JSON
    assert dom.count('class="msg role-tool"') >= 3 and '"available": true' in dom
