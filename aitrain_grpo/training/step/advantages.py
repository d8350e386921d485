"""Group-normalised advantages from the step's rewards: GRPO's rule, as TRL 1.16 computes it.

Each episode has one reward per reward function (the environment's score first, then
`--rl-reward-funcs`, the judge and the reward model; NaN where a function abstained). With TRL's default
`multi_objective_aggregation="sum_then_normalize"` (`--rl-reward-aggregation`) the weighted sum is the
episode's reward, and its advantage is

    A = (r - mean_group(r)) / (std_group(r) + 1e-4)

over the `--rl-num-generations` episodes of its prompt (`scale_rewards="group"`; `"batch"` takes the
standard deviation over the whole batch, `"none"` does not divide). `"normalize_then_sum"` normalises
each function within its group first, then sums and normalises over the batch. An episode every
function abstained on gets advantage 0. The formulas are TRL's (grpo_trainer.py,
`_generate_and_score_completions`), so a run's advantages are the ones TRL's own step would give:
benchmarks/step_equivalence.py replays runs of the step TRL scored and of this one to the same numbers;
tests/test_step_records.py pins the rule on small cases.

The rewards are gathered from every process first (a group may span processes), and each process keeps
its own slice.

Left out: nothing of TRL's rule; a reward model reaches it as one more function (training/rewards/reward_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from trl.trainer.utils import nanstd

STD_EPSILON = 1e-4  # TRL's: (r - mean) / (std + 1e-4)


@dataclass
class Advantages:
    """The step's advantages and what its metrics need: `advantages` and `rewards` (the weighted sum, NaN
    where nothing scored) for every episode of every process, in gathered order; `zero_std` per episode
    (its group's rewards were all equal)."""

    advantages: torch.Tensor
    rewards: torch.Tensor
    zero_std: torch.Tensor


def group_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, group_size: int, *,
                     scale: str = "group", aggregation: str = "sum_then_normalize") -> Advantages:
    """`rewards_per_func`: (episodes, functions), every process's episodes, groups consecutive."""
    weights = weights.to(rewards_per_func.device).unsqueeze(0)
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        grouped = rewards.view(-1, group_size)
        mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size, dim=0)
        if scale in ("group", "none"):
            std = (nanstd(grouped, dim=1).repeat_interleave(group_size, dim=0) if group_size > 1
                   else torch.zeros_like(rewards))
        elif scale == "batch":
            std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        else:
            raise ValueError(f"scale_rewards {scale!r} is not one of group, batch, none")
        advantages = rewards - mean
        if scale != "none":
            advantages = advantages / (std + STD_EPSILON)
    elif aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, group_size, rewards_per_func.shape[1])
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean_k)
        normalised = ((grouped - mean_k) / (std_k + STD_EPSILON)).view(-1, rewards_per_func.shape[1])
        rewards = (normalised * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std + STD_EPSILON)
    else:
        raise ValueError(f"multi_objective_aggregation {aggregation!r} is not one of sum_then_normalize, "
                         f"normalize_then_sum")
    logged = (rewards_per_func * weights).nansum(dim=1)
    logged[unscorable] = torch.nan
    return Advantages(torch.nan_to_num(advantages, nan=0.0), logged,
                      torch.isclose(std, torch.zeros_like(std)))


__all__ = ["Advantages", "STD_EPSILON", "group_advantages"]
