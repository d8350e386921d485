"""One aggregation of episodes for training metrics, `aitrain eval` and `env check`, and the error-rate
window kept in checkpoints as typed entries (still reading the list form older checkpoints hold)."""

from __future__ import annotations

import json
import pickle

import pytest

from aitrain_grpo.engine.stats import EpisodeSummary, episode_stats
from aitrain_grpo.env.base import Episode
from aitrain_grpo.training.run.stopping import ErrorRateStop, StepErrors


def episode(score: float, stop: str, *, turns: int = 1, error: str | None = None, **metrics) -> Episode:
    ep = Episode(row={}, messages=[])
    ep.score, ep.stop_reason, ep.turns, ep.error, ep.metrics = score, stop, turns, error, metrics
    ep.truncated = stop in ("turn_tokens", "completion_budget")
    return ep


def test_stop_reasons_become_shares_of_the_batch():
    episodes = [episode(1.0, "env"), episode(0.5, "turn_tokens", turns=2), episode(0.0, "error", error="boom"),
                episode(0.25, "env", turns=3, hits=2)]
    metrics = episode_stats(episodes).env_metrics()
    assert metrics["env/stop/env"] == 0.5 and metrics["env/stop/turn_tokens"] == 0.25
    assert metrics["env/stop/error"] == 0.25 and metrics["env/stop/max_turns"] == 0.0
    assert metrics["env/score_mean"] == pytest.approx(1.75 / 4) and metrics["env/turns_mean"] == 1.75
    assert metrics["env/errors"] == 1.0 and metrics["env/truncated_frac"] == 0.25 and metrics["env/hits"] == 2.0
    assert episode_stats(episodes).success_rate == 0.25


def test_summaries_cross_processes_and_aggregate_like_episodes():
    episodes = [episode(1.0, "env"), episode(0.0, "max_turns", turns=4)]
    summaries = pickle.loads(pickle.dumps([EpisodeSummary.of(ep) for ep in episodes]))  # what gather_object does
    assert episode_stats(summaries) == episode_stats(episodes)


def test_the_error_window_is_saved_as_json_and_old_checkpoints_still_load():
    stop = ErrorRateStop(max_rate=0.5, window=2)
    stop.observe([EpisodeSummary.of(episode(0.0, "error", error="Tool  failed\n badly"))])
    stop.window.append(StepErrors(step=1, episodes=1, errors=1, messages={"Tool failed badly": 1}))
    state = json.loads(json.dumps(stop.state_dict()))
    assert state["window"] == [{"step": 1, "episodes": 1, "errors": 1, "messages": {"Tool failed badly": 1}}]
    fresh = ErrorRateStop(max_rate=0.5, window=2)
    fresh.load_state_dict(state)
    assert list(fresh.window) == list(stop.window)
    fresh.load_state_dict({"window": [[3, 8, 2, {"boom": 2}]], "episodes_total": 8, "errors_total": 2})
    assert list(fresh.window) == [StepErrors(step=3, episodes=8, errors=2, messages={"boom": 2})]
