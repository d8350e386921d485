"""Judge calls overlap with the rollout (training/rewards/judge.py, the engine's `on_episode_done`): the engine
tells each episode once it is scored (agents' too), a replayed one once, when its replay is; on the tiny
model, under both schedules, a judge behind the fake server gets its first call while episodes are still
being scored; the scores, the failure count and the fallback are those of the calls made after the
rollout; batches played ahead each get their own transcripts' scores; a run step completes with the
judge's calls all made during its rollout. About 30 seconds."""

from __future__ import annotations

import json
import re
import time

import pytest

from aitrain_grpo.engine.backends.base import ReplayEpisode, RequestBackend, Sample
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.training.rewards.judge import HttpJudge, Judge
from helpers.fake_judge import FakeJudge, one_judged_step
from helpers.rollouts import GREEDY, NEW_TOKENS, StaggeredEnv, TurnEndingHF

GROUP = 2


class TimedEnv(StaggeredEnv):
    """StaggeredEnv that notes when each episode is scored, a little slowly, as a real check would be."""

    def __init__(self):
        super().__init__()
        self.scored_at: list[float] = []

    def score_episode(self, episode):
        time.sleep(0.05)
        self.scored_at.append(time.perf_counter())
        return super().score_episode(episode)


def rows(first_task: int = 0, groups: int = 4) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"Task {task}: tell me about room {task * 7}."}], "task": task}
            for task in range(first_task, first_task + groups) for _ in range(GROUP)]


@pytest.fixture
def fake():
    server = FakeJudge()
    yield server
    server.close()


def judge_at(fake: FakeJudge, mode: str, fallback: float = 0.0) -> Judge:
    return Judge("Reward helpful replies.", mode, fallback, GROUP, HttpJudge(fake.url + "/v1", "fake", None))


def engine_for(tiny_model_and_tokenizer, schedule: str, env=None) -> RolloutEngine:
    model, tokenizer = tiny_model_and_tokenizer
    settings = EpisodeSettings(max_new_tokens=NEW_TOKENS, sampling=GREEDY, schedule=schedule,
                               max_concurrent_episodes=GROUP)  # lockstep: waves of one group
    return RolloutEngine(env or TimedEnv(), tokenizer, TurnEndingHF.for_model(model, tokenizer), settings)


def scored(judge: Judge, episodes) -> tuple[list[float], dict[str, float]]:
    metrics: dict[str, float] = {}
    return judge.score(episodes, lambda name, value: metrics.__setitem__(name, value)), metrics


def distinct(episodes) -> int:
    """Transcripts a batch holds: greedy episodes of one prompt are alike, and one call serves alike ones."""
    return len({json.dumps(ep.messages) for ep in episodes})


def by_length(ask: str) -> str:
    """A judge whose score depends on the transcript, so a batch given another's scores shows."""
    return json.dumps({"score": (len(ask) % 97) / 97})


class LosesAServer(RequestBackend):
    """Every turn ends at once; the first request's server is lost, so its episode is played again."""

    def __init__(self, eos: int):
        self.stop_ids, self.lost = [eos], False

    def generate(self, prompts, max_tokens, sampling, **keys):
        return [Sample([self.stop_ids[0]], [0.0], "stop") for _ in prompts]

    async def generate_one(self, prompt, max_tokens, sampling, **keys):
        if not self.lost:
            self.lost = True
            raise ReplayEpisode("server 1 is gone")
        return self.generate([prompt], max_tokens, sampling)[0]


def test_the_engine_tells_each_scored_episode_once_a_replayed_one_when_its_replay_is(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    engine = RolloutEngine(StaggeredEnv(), tokenizer, LosesAServer(tokenizer.eos_token_id), EpisodeSettings())
    told: list[tuple[int, object, float | None]] = []
    engine.on_episode_done = lambda batch, i: told.append((i, batch.episodes[i], batch.episodes[i].score))
    with engine:
        batch = engine.run(rows())
    assert batch.replayed_episodes == 1
    assert sorted(i for i, _, _ in told) == list(range(len(batch.episodes)))  # each once, the replay included
    assert all(episode is batch.episodes[i] and score is not None for i, episode, score in told)


def test_an_agent_environment_tells_each_episode_once_scored(tiny_model_and_tokenizer):
    pytest.importorskip("openai")
    from envs_fixtures.agents import ChattyAgent

    model, tokenizer = tiny_model_and_tokenizer
    env = ChattyAgent(episodes=4, turns=1, max_tokens=8)
    engine = RolloutEngine(env, tokenizer, TurnEndingHF.for_model(model, tokenizer),
                           EpisodeSettings(max_new_tokens=8, model_name="tiny"))
    told: list[tuple[int, float | None]] = []
    engine.on_episode_done = lambda batch, i: told.append((i, batch.episodes[i].score))
    with engine:
        engine.run(env.build_dataset(tokenizer))
    assert sorted(i for i, _ in told) == [0, 1, 2, 3] and all(score is not None for _, score in told)


@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_judge_calls_start_before_the_last_episode_is_scored(tiny_model_and_tokenizer, fake, schedule):
    fake.delay = 0.2
    judge = judge_at(fake, "group")
    env = TimedEnv()
    with engine_for(tiny_model_and_tokenizer, schedule, env) as engine:
        engine.on_episode_done = judge.on_episode_done
        batch = engine.run(rows())
    starts = sorted(r["started"] for r in fake.requests)
    assert starts and starts[0] < max(env.scored_at)  # the first group's call went out during the rollout
    scores, metrics = scored(judge, batch.episodes)
    assert len(fake.requests) == 4  # one call per group, all made early: collecting asked nothing again
    assert scores == [0.0, 0.5] * 4 and metrics == {"judge/failures": 0.0, "judge/cache_hits": 0.0}
    after = judge_at(fake, "group")  # the same transcripts judged after the rollout, as before this feature
    assert scored(after, batch.episodes) == (scores, metrics)


def test_failures_and_the_fallback_are_counted_as_after_the_rollout(tiny_model_and_tokenizer, fake, capsys):
    fake.status = 500
    judge = judge_at(fake, "episode", fallback=0.25)
    with engine_for(tiny_model_and_tokenizer, "lockstep") as engine:
        engine.on_episode_done = judge.on_episode_done
        batch = engine.run(rows(groups=2))
    scores, metrics = scored(judge, batch.episodes)
    calls = distinct(batch.episodes)
    assert len(fake.requests) == calls  # made early, none asked again while collecting
    assert scores == [0.25] * 4 and metrics == {"judge/failures": 4.0, "judge/cache_hits": 0.0}  # per episode
    assert capsys.readouterr().err.count("warning: the judge") == 1
    fake.status = 200  # a failure is not cached: the next time the same episodes are judged, they are asked again
    assert scored(judge, batch.episodes) == ([0.75] * 4, {"judge/failures": 0.0, "judge/cache_hits": 0.0})
    assert len(fake.requests) == calls + 4  # judged after a rollout: one call per episode, as before


def test_batches_played_ahead_each_get_their_own_scores(tiny_model_and_tokenizer, fake):
    fake.reply_for = by_length
    judge = judge_at(fake, "episode")
    with engine_for(tiny_model_and_tokenizer, "continuous") as engine:
        engine.on_episode_done = judge.on_episode_done
        first, second = engine.run(rows(0, 2)), engine.run(rows(10, 2))  # as --rl-async-steps plays them
    late = [scored(judge, batch.episodes)[0] for batch in (second, first)]  # collected in the other order
    calls = distinct(first.episodes) + distinct(second.episodes)
    assert len(fake.requests) == calls  # all made while the batches played
    after = judge_at(fake, "episode")
    assert late == [scored(after, batch.episodes)[0] for batch in (second, first)]
    assert late[0] != late[1] and len(fake.requests) == calls + 8


def test_a_run_step_completes_with_the_judges_calls_made_during_its_rollout(tiny_model_dir, fake, tmp_path):
    fake.delay = 0.1
    record = one_judged_step(tiny_model_dir, tmp_path / "out", rl_num_generations=GROUP, rl_judge_url=fake.url + "/v1",
                             rl_judge_model="fake", rl_rollout_schedule="continuous")
    assert record["rewards/judge/mean"] == pytest.approx(0.25) and record["judge/failures"] == 0
    # the judge's test call before step 1 (rewards/judge_setup.py), then two groups, each asked once, early
    assert len(fake.requests) == 1 + 2 and record["judge/early_calls"] == 2
    assert all(re.match(r"2 conversations follow", r["body"]["messages"][-1]["content"]) for r in fake.requests)
