"""--rl-zero-std-groups: groups whose episodes all scored the same, kept, dropped or refilled, in real
TRL steps on the tiny model. The environment's `flat` prompts always score 0.5 (no signal)."""

from __future__ import annotations

import math

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.training.trainer import build_trainer
from envs_fixtures.flat_groups import FlatGroupsEnv


def train_steps(tiny_model_dir, out, policy: str, *, steps: int = 1, flat_every: int = 2, **options):
    config = RunConfig(
        model=tiny_model_dir, output_dir=str(out), rl_env_module="envs_fixtures.flat_groups",
        rl_env_class="FlatGroupsEnv", peft=False, max_steps=steps, batch_size=8, rl_num_generations=4,
        rl_max_new_tokens=16, seed=3, rl_zero_std_groups=policy, **options,
    )
    trainer = build_trainer(config, FlatGroupsEnv(num_tasks=16, flat_every=flat_every))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return trainer, logs


def test_drop_takes_flat_groups_out_of_the_loss_and_its_normalisation(tiny_model_dir, tmp_path):
    _, keep = train_steps(tiny_model_dir, tmp_path / "keep", "keep", rl_loss_type="grpo")
    trainer, drop = train_steps(tiny_model_dir, tmp_path / "drop", "drop", rl_loss_type="grpo")
    # Same seed, same episodes: one group of two is flat (even prompts always score 0.5).
    scores = trainer.rollout.last_batch.scores
    assert sum(len(set(scores[4 * g:4 * g + 4])) == 1 for g in range(2)) == 1
    assert drop[0]["groups/zero_std_frac"] == 0.5 and drop[0]["groups/dropped_frac"] == 0.5
    # TRL's grpo loss averages over sequences. A kept flat group adds zeros to that average; dropped,
    # the average runs over the informative group alone, so the gradient doubles (at the first step
    # the KL term has no gradient, and grad_norm is logged before clipping).
    assert keep[0]["grad_norm"] > 0
    assert drop[0]["grad_norm"] == pytest.approx(2 * keep[0]["grad_norm"], rel=1e-3)


def test_drop_token_normalised_loss_counts_only_informative_tokens(tiny_model_dir, tmp_path):
    trainer_keep, keep = train_steps(tiny_model_dir, tmp_path / "keep", "keep", rl_loss_type="dapo")
    trainer_drop, drop = train_steps(tiny_model_dir, tmp_path / "drop", "drop", rl_loss_type="dapo")
    batch = trainer_drop.rollout.last_batch
    tokens = [sum(t.env_mask) for t in batch.traces]
    informative = [i for g in range(2) if len(set(batch.scores[4 * g:4 * g + 4])) > 1 for i in range(4 * g, 4 * g + 4)]
    # dapo divides by the batch's model tokens: all of them when kept, the informative ones when dropped.
    assert drop[0]["loss"] == pytest.approx(keep[0]["loss"] * sum(tokens) / sum(tokens[i] for i in informative), rel=1e-4)


def test_dropped_groups_carry_no_gradient_even_with_an_entropy_bonus(tiny_model_dir, tmp_path):
    # Every group is flat: kept, the entropy bonus still moves the weights; dropped, nothing does.
    for policy, should_move in (("keep", True), ("drop", False)):
        config = RunConfig(
            model=tiny_model_dir, output_dir=str(tmp_path / policy), rl_env_module="envs_fixtures.flat_groups",
            rl_env_class="FlatGroupsEnv", peft=False, max_steps=1, batch_size=8, rl_num_generations=4,
            rl_max_new_tokens=16, seed=3, rl_zero_std_groups=policy, rl_entropy_coef=0.5, lr=1e-2,
        )
        trainer = build_trainer(config, FlatGroupsEnv(num_tasks=16, flat_every=1))
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        moved = any(not (p.detach() == before[n]).all() for n, p in trainer.model.named_parameters())
        assert moved == should_move, f"{policy}: weights moved={moved}"


def test_refill_plays_more_prompts_until_every_group_has_signal(tiny_model_dir, tmp_path):
    trainer, logs = train_steps(tiny_model_dir, tmp_path / "a", "refill", steps=2)
    for log in logs:
        assert log["groups/zero_std_frac"] == 0.5  # what TRL handed over
        assert log["groups/refill_rollouts"] > 0
        assert log["groups/dropped_frac"] == 0.0
        assert log["frac_reward_zero_std"] == 0.0  # what TRL trained on
    batch = trainer.rollout.last_batch
    assert len(batch.episodes) == 8  # one completion per prompt TRL sent
    assert all(not ep.row["flat"] for ep in batch.episodes)
    # The extra prompts come from the seed and the step: a second run plays the same ones.
    again, _ = train_steps(tiny_model_dir, tmp_path / "b", "refill", steps=2)
    assert [ep.row["task"] for ep in again.rollout.last_batch.episodes] == [ep.row["task"] for ep in batch.episodes]


def test_refill_stops_at_its_cap_and_drops_what_is_still_flat(tiny_model_dir, tmp_path):
    _, logs = train_steps(tiny_model_dir, tmp_path, "refill", flat_every=1, rl_refill_max_episodes=8)
    assert logs[0]["groups/refill_rollouts"] == 8.0
    assert logs[0]["groups/dropped_frac"] == 1.0
    assert math.isfinite(logs[0]["loss"])


def test_bad_refill_cap_is_a_one_line_error():
    config = RunConfig(rl_env_module="envs.hotel", rl_env_class="HotelEnv", rl_refill_max_episodes=-1)
    with pytest.raises(ConfigError, match="--rl-refill-max-episodes"):
        config.validate()
