"""Credit per turn: `episode.reward_turn` and `--rl-advantage outcome|turn`, from the hand-computed
numbers of one group to real TRL steps on the tiny model."""

from __future__ import annotations

import json
import math

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.env.base import Episode
from aitrain_grpo.training.trainer import build_trainer
from aitrain_grpo.training.step.turn_credit import group_turn_advantages, returns_to_go, token_turn_advantages
from envs_fixtures.turn_rewards import TurnRewardEnv


def test_a_turn_reward_goes_to_the_latest_turn_or_the_one_named():
    episode = Episode(row={}, messages=[])
    with pytest.raises(ValueError, match="has not been played"):
        episode.reward_turn(1.0)
    episode.turns = 1
    episode.reward_turn(0.25)
    episode.reward_turn(0.25)  # the same turn again: they add up
    episode.turns = 3
    episode.reward_turn(1.0)
    episode.reward_turn(-0.5, turn=1)
    assert episode.turn_rewards == [0.5, -0.5, 1.0]
    for bad in (float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match="finite number"):
            episode.reward_turn(bad)


def test_returns_to_go_sum_a_turn_and_the_turns_after_it():
    assert returns_to_go([1.0, 0.0, 2.0], 3) == [3.0, 2.0, 2.0]
    assert returns_to_go([1.0], 3) == [1.0, 0.0, 0.0]  # turns never rewarded count 0


def test_turn_advantages_of_a_hand_computed_two_turn_group():
    # One group of three: episodes 0 and 1 played two turns, episode 2 one turn.
    rewards, turns = [[1.0, 0.0], [0.0, 1.0], [0.5]], [2, 2, 1]
    # Turn 0's returns-to-go are 1, 1, 0.5: mean 5/6, sample std sqrt(1/12) = 0.288675.
    # Turn 1's are 0 and 1 (episode 2 has no turn 1): mean 0.5, sample std sqrt(0.5) = 0.707107.
    std0, std1 = math.sqrt(1 / 12), math.sqrt(0.5)
    expected = [
        [(1 - 5 / 6) / (std0 + 1e-4), (0 - 0.5) / (std1 + 1e-4)],
        [(1 - 5 / 6) / (std0 + 1e-4), (1 - 0.5) / (std1 + 1e-4)],
        [(0.5 - 5 / 6) / (std0 + 1e-4)],
    ]
    got = group_turn_advantages(rewards, turns, group_size=3)
    assert [[round(v, 6) for v in row] for row in got] == [[round(v, 6) for v in row] for row in expected]
    assert got[0][0] == pytest.approx(0.5771, abs=1e-4) and got[2][0] == pytest.approx(-1.1543, abs=1e-4)
    # Groups are normalised apart: the same three episodes next to a flat group change nothing.
    both = group_turn_advantages(rewards + [[0.0], [0.0], [0.0]], turns + [1, 1, 1], group_size=3)
    assert both[:3] == got and both[3:] == [[0.0], [0.0], [0.0]]
    with pytest.raises(ValueError, match="groups of 4"):
        group_turn_advantages(rewards, turns, group_size=4)


def test_each_token_gets_its_own_turns_advantage():
    # Turn 0 is tokens 0-2, then 2 environment tokens, turn 1 is tokens 5-7.
    assert token_turn_advantages([0.5, -1.0], [0, 5], 8) == [0.5] * 5 + [-1.0] * 3
    assert token_turn_advantages([], [], 3) == [0.0, 0.0, 0.0]


def one_step(tiny_model_dir, out, env, **options):
    config = RunConfig(
        model=tiny_model_dir, output_dir=str(out), rl_env_module="envs_fixtures.turn_rewards",
        rl_env_class="TurnRewardEnv", peft=False, max_steps=1, batch_size=8, rl_num_generations=4,
        rl_max_new_tokens=12, seed=5, rl_kl_coef=0.0, **options,
    )
    trainer = build_trainer(config, env)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    return trainer, log


def test_turn_credit_reaches_the_loss_where_the_score_gives_no_signal(tiny_model_dir, tmp_path):
    # Every episode scores 0.5: TRL's advantages are all 0, so `outcome` has no gradient at all. The
    # turns' rewards differ, and with `turn` they must reach the loss as per-token advantages.
    _, outcome = one_step(tiny_model_dir, tmp_path / "outcome", TurnRewardEnv(), rl_advantage="outcome")
    trainer, turn = one_step(tiny_model_dir, tmp_path / "turn", TurnRewardEnv(), rl_advantage="turn")
    assert outcome["grad_norm"] == 0.0 and outcome["frac_reward_zero_std"] == 1.0
    assert turn["grad_norm"] > 0.0
    episodes = trainer.rollout.last_batch.episodes
    assert all(len(ep.turn_rewards) == ep.turns == 2 for ep in episodes)
    mean = sum(sum(ep.turn_rewards) for ep in episodes) / sum(ep.turns for ep in episodes)
    assert turn["env/turn_reward_mean"] == pytest.approx(mean)
    # The transcripts carry each turn's reward.
    record = json.loads((tmp_path / "turn" / "episodes.jsonl").read_text().splitlines()[0])
    assert len(record["turn_rewards"]) == 2 and record["turn_reward"] == pytest.approx(sum(record["turn_rewards"]))


def test_outcome_ignores_turn_rewards(tiny_model_dir, tmp_path):
    # The score varies, so `outcome` trains; rewarding turns as well must not change one number of it.
    _, plain = one_step(tiny_model_dir, tmp_path / "plain", TurnRewardEnv(flat_score=None, reward_turns=False))
    _, rewarded = one_step(tiny_model_dir, tmp_path / "rewarded", TurnRewardEnv(flat_score=None))
    assert plain["grad_norm"] > 0
    for key in ("loss", "grad_norm", "reward", "reward_std"):
        assert rewarded[key] == plain[key], key
    assert "env/turn_reward_mean" not in plain and "env/turn_reward_mean" in rewarded
