"""`--rl-reward-aggregation` (TRL's multi_objective_aggregation): with several rewards, normalize_then_sum
normalises each within its group before the weighted sum (GDPO), so a reward's scale does not decide its
say; sum_then_normalize, the default, sums first. What a user sees: under normalize_then_sum a reward a
hundred times larger trains the same step; under the default it takes over."""

from __future__ import annotations

import json

import pytest

from aitrain_grpo.config import RunConfig
from aitrain_grpo.training.trainer import train
from helpers import REPO

PROBES = "envs_fixtures.reward_probes"


def first_step(tmp_path, aggregation: str, reward: str) -> dict:
    out = tmp_path / f"{aggregation}-{reward}"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO / "tests")  # the probe module resolves from the current folder
        train(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(out), max_steps=1,
                        rl_max_new_tokens=16, seed=3, use_vllm=False, rl_reward_funcs=f"{PROBES}:{reward}",
                        rl_reward_weights="1,1", rl_reward_aggregation=aggregation))
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.parametrize("aggregation, same", [("normalize_then_sum", True), ("sum_then_normalize", False)])
def test_a_rewards_scale_decides_its_say_only_when_summed_first(tmp_path, aggregation, same):
    small, large = (first_step(tmp_path, aggregation, reward) for reward in ("e_share", "e_share_hundredfold"))
    assert large["rewards/e_share_hundredfold/mean"] == pytest.approx(100 * small["rewards/e_share/mean"])
    # equal up to TRL's 1e-4 added to each group's spread, which weighs more against the smaller reward
    assert (large["loss"] == pytest.approx(small["loss"], rel=1e-2)) is same
    assert (large["grad_norm"] == pytest.approx(small["grad_norm"], rel=1e-2)) is same
