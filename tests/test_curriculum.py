"""The difficulty curriculum (`--rl-curriculum pools`, training/rollout/curriculum.py): prompts whose recent groups
all succeeded (easy) or all failed (hard) are drawn at the revisit rate; a real run's pools move, its
batches turn away from the solved prompts, and a resumed run keeps the pools and draws what an
uninterrupted run draws."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from aitrain_grpo.config import ConfigError, RunConfig
from aitrain_grpo.training.run.checkpoints import ResumableRepeatSampler
from aitrain_grpo.training.rollout.curriculum import Curriculum, CurriculumSampler
from aitrain_grpo.training.trl.access import RepeatSampler
from envs_fixtures.graded import EASY, HARD, Graded, pooled_before
from helpers.letters import letters_config


def curriculum(rows: int = 40, envs=None, **options) -> Curriculum:
    settings = dict(easy=1.0, hard=0.0, revisit=0.2, history=2, lag=1, seed=3)
    return Curriculum(envs or [None] * rows, **{**settings, **options})


def play(cur: Curriculum, rows: list[int], rewards_of) -> None:
    """Draw nothing: record one batch of `rows` (groups of 2) scored by `rewards_of(row)`."""
    cur.drawn[cur.recorded] = (rows, ["normal"] * len(rows), [float("nan")] * len(rows))
    cur.record([r for row in rows for r in rewards_of(row)], 2)


def sampler(cur: Curriculum, rows: int, prompts_per_batch: int) -> CurriculumSampler:
    made = RepeatSampler(list(range(rows)), mini_repeat_count=2, batch_size=prompts_per_batch, shuffle=True, seed=3)
    made.__class__ = CurriculumSampler
    made.curriculum = cur
    return made


# ------------------------------------------------------------------------------------------ the pools


def test_groups_that_all_succeed_make_a_prompt_easy_all_fail_hard_and_mixed_stays_normal():
    cur = curriculum()
    play(cur, [0, 1, 2, 3], lambda row: {0: [1, 1], 1: [0, 0], 2: [1, 0], 3: [0.5, 0.5]}[row])
    assert [cur.pool(row) for row in range(5)] == ["easy", "hard", "normal", "normal", "normal"]
    metrics = cur.pool_sizes()
    assert (metrics["curriculum/easy"], metrics["curriculum/normal"], metrics["curriculum/hard"]) == (1, 38, 1)
    play(cur, [0], lambda row: [1, 0])  # an easy prompt that fails once is normal again
    assert cur.pool(0) == "normal"


def test_the_history_decides_the_pool_and_a_batch_reads_only_groups_old_enough():
    cur = curriculum(history=2)
    play(cur, [0], lambda row: [1, 0])  # batch 0: mixed
    play(cur, [0], lambda row: [1, 1])  # batch 1: succeeded
    assert cur.pool(0) == "normal"  # one of its last two groups was mixed
    play(cur, [0], lambda row: [1, 1])  # batch 2
    assert cur.pool(0) == "easy"
    assert cur.pool(0, upto=1) == "normal"  # batch 3 (lag 1) reads batches 0 and 1 only


@pytest.mark.parametrize("reward", [1.0, 0.0])
def test_an_easy_or_hard_prompt_is_drawn_at_about_the_revisit_rate(reward):
    rows, batches = 40, 4000  # ten prompts a batch, four batches an epoch
    cur = curriculum(rows, revisit=0.2)
    play(cur, list(range(5)), lambda row: [reward, reward])  # prompts 0-4 solved (or failed)
    draw = sampler(cur, rows, 10)
    drawn = Counter(row for batch in range(2, batches + 2) for row in draw.batch_rows(batch))
    per_epoch = batches / 4
    for row in range(5):
        assert drawn[row] / per_epoch == pytest.approx(0.2, abs=0.05)
    # The others fill the batches: a normal prompt comes up a little more than once an epoch.
    assert all(1.0 <= drawn[row] / per_epoch < 1.2 for row in range(5, rows))


def test_with_no_pools_the_batches_are_trls_and_each_environment_keeps_its_share():
    rows = 12
    cur = curriculum(rows, envs=["a"] * 6 + ["b"] * 6, revisit=0.0)
    draw = sampler(cur, rows, 4)
    plain = RepeatSampler(list(range(rows)), mini_repeat_count=2, batch_size=4, shuffle=True, seed=3)
    plain.__class__ = ResumableRepeatSampler
    for epoch in (0, 1):
        draw.set_epoch(epoch)
        plain.set_epoch(epoch)
        assert list(draw) == list(plain)
    uniform = [draw.batch_rows(b) for b in range(3, 6)]
    play(cur, [0, 1, 2, 6], lambda row: [1, 1])  # batch 0: two of a's prompts and one of b's solved
    for batch, before in zip(range(3, 6), uniform):
        rows_now = draw.batch_rows(batch)
        assert not {0, 1, 2, 6} & set(rows_now)
        assert Counter(r < 6 for r in rows_now) == Counter(r < 6 for r in before)
    assert cur.pool_sizes()["curriculum/a/easy"] == 3 and cur.pool_sizes()["curriculum/b/easy"] == 1


@pytest.mark.parametrize("lag", [1, 2])
def test_a_batch_reads_the_groups_of_batches_up_to_lag_before_it_whenever_it_is_drawn(lag):
    """The data loader draws batch c before batch c - 1 is played (--rl-async-steps N: N batches ahead), so
    batch c reads batches up to c - 1 - lag: groups recorded since it was first drawn do not change it."""
    rows = 12
    cur = curriculum(rows, revisit=0.0, lag=lag)
    draw = sampler(cur, rows, 4)
    uniform = {b: draw.batch_rows(b) for b in (2, 3)}
    play(cur, uniform[2], lambda row: [1, 1])  # batch 0 found batch 2's uniform prompts solved
    assert (draw.batch_rows(2) == uniform[2]) == (lag == 2)
    assert not set(draw.batch_rows(3)) & set(uniform[2])
    # What the async plan plays ahead is what the data loader yields, each prompt once per episode.
    draw.set_epoch(1)
    assert list(draw)[:8] == draw.step_indices(3)


def test_the_state_round_trips_through_json():
    cur = curriculum()
    play(cur, [0, 1], lambda row: [row, row])
    again = curriculum()
    again.load_state_dict(json.loads(json.dumps(cur.state_dict())))
    assert again.recorded == 1 and [again.pool(r) for r in (0, 1)] == ["hard", "easy"]


@pytest.mark.parametrize("options, fragment", [
    (dict(rl_curriculum_easy=0.5, rl_curriculum_hard=0.5), "--rl-curriculum-easy 0.5 must be above"),
    (dict(rl_zero_std_groups="refill"), "--rl-zero-std-groups drop"),
    (dict(rl_curriculum_revisit=1.5), "--rl-curriculum-revisit must be in [0, 1]"),
])
def test_bad_curriculum_options_are_refused_in_one_line(options, fragment):
    with pytest.raises(ConfigError, match="^[^\n]*$") as error:
        RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", rl_curriculum="pools", **options).validate()
    assert fragment in str(error.value)


# ------------------------------------------------------------------------------------------ real runs

def graded_config(out, **overrides) -> RunConfig:
    options = dict(rl_curriculum="pools", rl_curriculum_revisit=0.0, rl_curriculum_history=1, max_steps=8, save_steps=3)
    return letters_config(out, **{**options, **overrides})


def metrics(out) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    from aitrain_grpo.training.trainer import train

    out = tmp_path_factory.mktemp("pooled")
    env = Graded()
    train(graded_config(out), env=env)
    return out, env


def test_a_run_moves_prompts_into_pools_and_its_batches_turn_away_from_them(pooled):
    out, env = pooled
    steps = env.per_step()
    logged = metrics(out)
    assert len(steps) == 8
    assert pooled_before(steps) == [set()] * 8  # no step drew a prompt solved or failed two steps before
    seen_by: dict[int, int] = {}
    for step, tasks in enumerate(steps):
        for task in tasks:
            seen_by.setdefault(task, step)
        record = logged[step + 1]
        assert record["curriculum/easy"] == len(EASY & set(seen_by))
        assert record["curriculum/hard"] == len(HARD & set(seen_by))
        assert record["curriculum/normal"] == 8 - len((EASY | HARD) & set(seen_by))
    assert logged[8]["curriculum/easy"] + logged[8]["curriculum/hard"] >= 3  # the pools did move
    # Uniform sampling (TRL's order, the same seed) comes back to the pooled prompts in the second epoch.
    plain = RepeatSampler(list(range(8)), mini_repeat_count=4, batch_size=2, shuffle=True, seed=7)
    plain.__class__ = ResumableRepeatSampler
    uniform = []
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        order = list(plain)
        uniform += [set(order[i:i + 8]) for i in range(0, len(order), 8)]
    assert sum(len(s & (EASY | HARD)) for s in uniform[4:]) > sum(len(s & (EASY | HARD)) for s in steps[4:])


def test_a_resumed_run_keeps_the_pools_and_draws_what_the_uninterrupted_run_drew(pooled, tmp_path):
    from aitrain_grpo.training.trainer import train

    first_out, first_env = pooled
    out = tmp_path / "resumed"
    train(graded_config(out, max_steps=3), env=Graded())  # stopped after step 3 (its checkpoint)
    state = json.loads((out / "checkpoint-3" / "aitrain_state.json").read_text())
    assert state["curriculum"]["recorded"] == 3
    env = Graded()
    train(graded_config(out, resume_from_checkpoint="auto"), env=env)
    assert env.per_step() == first_env.per_step()[3:]
    before, after = metrics(first_out), metrics(out)
    for step in range(4, 9):
        for key in ("curriculum/easy", "curriculum/normal", "curriculum/hard", "curriculum/sampled_easy"):
            assert after[step][key] == before[step][key], (step, key)
