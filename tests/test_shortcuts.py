"""The shortcut warning fires when the score rises together with a behaviour that means a gamed score (episodes
cut by a budget, one-turn episodes, climbing tool calls or errors), stays silent when the score rises alone
or the behaviour moves alone, and is printed once during training, shown in the report and by `aitrain eval`."""

from __future__ import annotations

import io
import json
import random

from rich.console import Console
from transformers import TrainerControl, TrainerState

from aitrain_grpo.runlog.health import HealthCallback, check_health, first_warnings
from aitrain_grpo.runlog.shortcuts import eval_shifts, eval_warning, find_shortcut, first_shortcut


def ramp(step: int, steps: int, start: float, end: float) -> float:
    return start + (end - start) * min(1.0, step / steps)


def run(steps: int = 40, seed: int = 0, **behaviour) -> list[dict]:
    """A run whose score climbs 0.1 -> 0.6 with batch noise; `behaviour` maps a metric to (start, end), reached
    by the middle of the run; unnamed metrics stay at a tool environment's usual values."""
    rng = random.Random(seed)
    base = {"env/stop/turn_tokens": (0.1, 0.1), "env/stop/max_turns": (0.3, 0.3), "env/stop/completion_budget": (0, 0),
            "env/turns_mean": (2.5, 2.5), "env/tool_calls_mean": (1.5, 1.5), "env/tool_errors": (3.0, 3.0),
            "env/truncated_turns_mean": (0.0, 0.0), "env/group_same_reply": (0.05, 0.05), "env/score_mean": (0.1, 0.6)}
    base.update(behaviour)
    records = []
    for s in range(1, steps + 1):
        record = {"step": s, "env/episodes": 16.0}
        for key, (a, b) in base.items():
            noisy = ramp(s, steps // 2, a, b) + (rng.uniform(-0.06, 0.06) if a != b or key == "env/score_mean" else 0)
            record[key] = max(0.0, noisy)
        record["reward"] = record["env/score_mean"]
        records.append(record)
    return records


def test_a_run_that_learns_without_a_shortcut_is_silent():
    for seed in range(5):
        assert first_shortcut(run(seed=seed)) is None
        assert [w.key for w in first_warnings(run(seed=seed))] == []


def test_the_quick_start_pattern_warns_with_the_metric_and_its_values():
    # README's first run: a turn cut at 16 tokens ends the episode; the model learns to be cut at once.
    records = run(**{"env/stop/turn_tokens": (0.1, 1.0), "env/turns_mean": (2.9, 1.0), "env/stop/max_turns": (0.9, 0.0)})
    found = first_shortcut(records)
    assert found is not None
    metrics = [m.metric for m in found.moves]
    assert "env/stop/turn_tokens" in metrics
    message = found.message()
    assert "possible shortcut" in message and "env/stop/turn_tokens" in message
    move = found.moves[metrics.index("env/stop/turn_tokens")]
    assert move.start < 0.5 and move.now >= 0.5
    assert f"{move.start:.2f} -> {move.now:.2f}" in message


def test_turns_collapsing_to_one_warn_alone():
    found = first_shortcut(run(**{"env/turns_mean": (2.5, 1.0)}))
    assert found is not None and [m.metric for m in found.moves] == ["env/turns_mean"]


def test_climbing_tool_errors_and_calls_warn():
    found = first_shortcut(run(**{"env/tool_errors": (3.0, 14.0)}))  # 0.19 -> 0.88 per episode
    assert found is not None and [m.metric for m in found.moves] == ["tool_errors_per_episode"]
    found = first_shortcut(run(**{"env/tool_calls_mean": (1.5, 3.5)}))
    assert found is not None and [m.metric for m in found.moves] == ["env/tool_calls_mean"]


def test_one_reply_taking_over_the_groups_as_the_score_climbs_warns():
    found = first_shortcut(run(**{"env/group_same_reply": (0.0, 0.9)}))
    assert found is not None and [m.metric for m in found.moves] == ["env/group_same_reply"]
    assert "share of a group's episodes writing its most common reply" in found.message()
    # Not when the score is flat (the quick start's seed 42 from step 40: replies alike, score at its top) ...
    assert first_shortcut(run(**{"env/group_same_reply": (0.0, 0.9), "env/score_mean": (0.47, 0.47)})) is None
    # ... nor when groups stay varied while the score climbs (a SmolLM2 start at temperature 0.7: 0.09).
    assert first_shortcut(run(**{"env/group_same_reply": (0.05, 0.25)})) is None


def test_learning_to_call_a_tool_at_all_is_no_shortcut():
    # A model that never called learns to look up, sometimes twice: 0 -> 1.5 calls an episode.
    assert first_shortcut(run(**{"env/tool_calls_mean": (0.0, 1.5), "env/tool_errors": (0.5, 1.0)})) is None


def test_the_turn_limit_share_rising_warns():
    found = first_shortcut(run(**{"env/stop/max_turns": (0.1, 0.8)}))
    assert found is not None and "env/stop/max_turns" in found.message()


def test_the_share_cut_by_the_context_window_rising_warns():
    # A model that learns to fill the window (long replies) ends episodes with stop reason context.
    found = first_shortcut(run(**{"env/stop/context": (0.0, 0.7)}))
    assert found is not None and "share of episodes stopped by the context window (env/stop/context)" in found.message()


def test_a_behaviour_moving_while_the_score_stays_flat_is_not_a_shortcut():
    records = run(**{"env/score_mean": (0.3, 0.3), "env/stop/turn_tokens": (0.1, 1.0), "env/turns_mean": (2.9, 1.0)})
    assert first_shortcut(records) is None


def test_small_moves_stay_below_the_thresholds():
    # Stations-like learning: a few more calls and limit stops, tool errors falling.
    records = run(**{"env/tool_calls_mean": (2.4, 3.0), "env/stop/max_turns": (0.35, 0.55), "env/tool_errors": (10, 6)})
    assert first_shortcut(records) is None


def test_too_few_steps_or_missing_metrics_say_nothing():
    records = run(**{"env/stop/turn_tokens": (0.1, 1.0), "env/turns_mean": (2.9, 1.0)}, steps=16)
    assert find_shortcut(records[:5]) is None    # five steps: too few to hold two 3-step means
    assert find_shortcut(records[:8]) is not None  # eight steps: two 4-step means
    assert find_shortcut([{"step": s, "reward": s / 10} for s in range(1, 30)]) is None


def test_an_older_run_without_stop_reasons_is_read_by_its_truncated_share():
    records = run(**{"env/stop/turn_tokens": (0.1, 1.0)})
    for r in records:
        r["env/truncated_frac"] = r.pop("env/stop/turn_tokens")
        del r["env/stop/max_turns"], r["env/stop/completion_budget"]
    found = first_shortcut(records)
    assert found is not None and found.moves[0].metric == "env/truncated_frac"


def printed(records) -> str:
    """What the training health callback prints as `records` are logged one step at a time."""
    out = io.StringIO()
    callback = HealthCallback(Console(file=out, width=600, highlight=False))
    state = TrainerState()
    for record in records:
        state.global_step = record["step"]
        callback.on_log(None, state, TrainerControl(), logs={k: v for k, v in record.items() if k != "step"})
    return out.getvalue()


def test_training_prints_the_shortcut_warning_once():
    records = run(**{"env/stop/turn_tokens": (0.1, 1.0), "env/turns_mean": (2.9, 1.0)})
    assert "shortcut" in [w.key for w in check_health(records[:30])]
    text = printed(records)
    assert text.count("possible shortcut") == 1
    assert "episodes.jsonl" in text and "score function" in text


def test_the_warning_names_the_probe_its_replies_resemble_and_no_other():
    # The quick start's shortcut: its best replies become the fill-the-turn probe's (benchmarks/SHORTCUTS.md).
    pattern = {"env/stop/turn_tokens": (0.1, 1.0), "env/turns_mean": (2.9, 1.0)}
    records = run(**pattern, **{"probe/fill-the-turn": (0.05, 0.98), "probe/echo": (0.05, 0.02)})
    found = first_shortcut(records)
    assert found is not None and found.probe is not None and found.probe[0] == "fill-the-turn"
    assert f"its replies resemble the probe 'fill-the-turn' (similarity {found.probe[1]:.2f})" in found.message()
    assert found.to_dict()["probe"]["name"] == "fill-the-turn"
    # A run that learned the task: its finished "A a a a a a." turns stay under 0.5 (seeds 2 and 3 reach 0.45).
    for quiet in ({"probe/fill-the-turn": (0.05, 0.45), "probe/echo": (0.05, 0.0)}, {}):
        found = first_shortcut(run(**pattern, **quiet))
        assert found is not None and found.probe is None and "resemble" not in found.message()
        assert [w.key for w in first_warnings(run(**pattern, **quiet))] == ["shortcut"]
        assert "resemble" not in first_warnings(run(**pattern, **quiet))[0].message
    # Nor without a shortcut: resembling a probe alone is no warning.
    assert first_shortcut(run(**{"probe/echo": (0.0, 1.0)})) is None


def test_training_prints_the_warning_once_more_when_its_replies_come_to_resemble_a_probe():
    # Seeds 1 and 2 of the quick start: cut turns rise first, the replies become the probe's a few steps later.
    records = run(**{"env/stop/turn_tokens": (0.1, 1.0), "env/turns_mean": (2.9, 1.0)})
    for r in records:
        r["probe/fill-the-turn"] = 0.0 if r["step"] < 24 else 0.97
    lines = [line for line in printed(records).splitlines() if "possible shortcut" in line]
    assert len(lines) == 2 and "resemble" not in lines[0]
    assert "its replies resemble the probe 'fill-the-turn'" in lines[1]
    found = first_shortcut(records)  # the report's replay: the first step, and the probe from where it was named
    assert found.probe_step > found.step and f"from step {found.probe_step} its replies resemble" in found.message()
    assert "its replies resemble the probe 'fill-the-turn'" in first_warnings(records)[0].message


def test_eval_names_a_large_shift_against_the_baseline():
    base = {"episodes": 32, "truncated": 4, "mean_turns": 2.1, "tool_errors": 7}
    trained = {"episodes": 32, "truncated": 32, "mean_turns": 1.0, "tool_errors": 23}
    shifts = eval_shifts(trained, base)
    assert len(shifts) == 3 and "1.00 against the baseline's 0.12" in shifts[0]
    assert eval_shifts(dict(base, truncated=6, mean_turns=2.3), base) == []
    # Learning that stops at the turn limit less and fails fewer calls (stations, benchmarks/TOOL_USE.md).
    start = {"episodes": 64, "truncated": 28, "mean_turns": 3.36, "tool_errors": 105}
    assert eval_shifts({"episodes": 64, "truncated": 5, "mean_turns": 3.08, "tool_errors": 19}, start) == []
    # A tool run that learned to call more and fail more (issue 41's second run).
    start = {"episodes": 32, "truncated": 0, "mean_turns": 1.9, "tool_errors": 7}
    assert len(eval_shifts({"episodes": 32, "truncated": 16, "mean_turns": 2.5, "tool_errors": 23}, start)) == 3
    # The quick start learned (benchmarks/FIRST_RUN.md): all three turns played, none cut, where the base was cut.
    start = {"episodes": 32, "truncated": 27, "mean_turns": 2.0, "tool_errors": 0}
    assert eval_shifts({"episodes": 32, "truncated": 0, "mean_turns": 3.0, "tool_errors": 0}, start) == []
    assert "turns per episode: 1.00 against the baseline's 2.10" in eval_warning([trained, base], "tiny")
    assert eval_warning([base, base], "tiny") is None


def test_eval_without_a_baseline_compares_a_run_folder_with_its_first_steps(tmp_path):
    records = run(**{"env/stop/turn_tokens": (0.1, 1.0), "env/turns_mean": (2.9, 1.0)})
    for r in records:
        r["env/truncated_frac"] = r["env/stop/turn_tokens"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "checkpoint-8").mkdir()
    trained = {"episodes": 32, "truncated": 32, "mean_turns": 1.0, "tool_errors": 3}
    for folder in (tmp_path, tmp_path / "checkpoint-8"):
        line = eval_warning([trained], str(folder))
        assert line is not None and "against the training run's first steps'" in line and "turns per episode" in line
    assert eval_warning([trained], "tiny") is None  # no run to compare with: nothing to say


# ------------------------------------------------------------------------------ end to end


def test_the_old_quick_start_warns_of_its_shortcut_and_the_report_shows_it(tmp_path):
    """README's first run as it was before issue 35 (envs.letters' old score, `pay_cut_turns`, which pays a
    turn cut at its limit; outcome advantages): the tiny model learns to fill its 16-token turn with " a a a",
    which is cut and ends the episode: measured on seed 42, the warning comes at step 18 (steps 11-12 on
    seeds 1-2)."""
    from helpers import REPO, run_cli

    out = tmp_path / "run"
    result = run_cli("grpo", "--config", "examples/quickstart.yaml", "--max-steps", "30", "--output-dir", str(out),
                     "--rl-env-config", '{"letter": "a", "turns": 3, "pay_cut_turns": true}', "--rl-advantage", "outcome",
                     "--log-episodes-every", "29", cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if "possible shortcut" in line]
    assert len(lines) == 1, result.stdout
    assert lines[0].startswith("warning: possible shortcut: the score rose") and "env/stop/turn_tokens" in lines[0]
    assert "its replies resemble the probe 'fill-the-turn'" in lines[0]  # envs.letters' declared probe, step 18
    assert "episodes.jsonl" in lines[0] and "score function" in lines[0]
    page = (out / "report.html").read_text()
    data = json.loads(page.split('id="report-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    assert data["shortcut"]["moves"][0]["metric"] == "env/stop/turn_tokens"
    assert data["shortcut"]["probe"]["name"] == "fill-the-turn"
    first, last = data["shortcut_examples"]["first"], data["shortcut_examples"]["last"]
    assert (first["step"], last["step"]) == (1, 29) and last["turns"] == 1
    from helpers.browser import rendered_dom

    dom = rendered_dom(out / "report.html", tmp_path)
    assert "Possible shortcut" in dom and "shortcut warning: share of episodes ended by a turn cut" in dom
    assert "Best-scoring transcript of the last logged step (step 29)" in dom
    assert "shortcut warning: the replies resemble the probe 'fill-the-turn'" in dom  # its probe/ chart flagged
    # `aitrain eval` of the run, no baseline given: against the run's first steps.
    result = run_cli("eval", "--model", str(out), "--episodes", "8", cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: the model plays differently: " in result.stdout and "turns per episode: 1.00" in result.stdout


def test_the_gamed_stations_score_pays_failed_calls_and_stays_in_range():
    """envs.stations_trl:station_reward_per_call, the issue's tool run: each result shown earns 0.1, an error too."""
    import pytest

    from envs.stations_trl import StationsTRL, station_reward, station_reward_calls_pay, station_reward_per_call

    env = StationsTRL()
    env.reset(city="Oslo")
    failed = [{"role": "assistant", "content": "<tool_call>x</tool_call>"}, {"role": "tool", "content": "Error: x"}]
    assert station_reward([failed * 3], [env]) == [0.1]  # the default pays for trying once
    assert station_reward_per_call([failed * 3], [env]) == [pytest.approx(0.3)]
    assert station_reward_per_call([failed * 30], [env]) == [1.0]  # scores stay in [0, 1]
    assert station_reward_calls_pay([failed * 2], [env]) == [pytest.approx(0.4)]
    assert station_reward_calls_pay([failed * 4], [env]) == [pytest.approx(1.0)]  # four failed calls earn full marks
