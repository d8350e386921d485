"""TRL's loss options past the clip ranges, as flags: `--rl-top-entropy-quantile` (train on the
highest-entropy tokens only), `--rl-delta` (INTELLECT-2's two-sided clip), `--rl-off-policy-mask`
(DeepSeek-V3.2's off-policy sequence masking), `--rl-entropy-target` (the adaptive entropy bonus) and
`--no-rl-kl-bias-correction` (the KL term's gradient without TRL's ratio weighting).
What a user sees: each changes the loss where it should act and nowhere else, and the adaptive
coefficient is logged and carried through a resume."""

from __future__ import annotations

import json

import pytest

from aitrain_grpo.config import RunConfig
from aitrain_grpo.training.trainer import train
from envs.letters import LetterEnv

# A large learning rate so that one update moves the tiny policy far from the one that played.
FAST = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv", max_steps=4, lr=3e-2, seed=1, rl_max_new_tokens=8,
            use_vllm=False)


def records(out, **options):
    train(RunConfig(**FAST, output_dir=str(out), **options), env=LetterEnv(turns=1, num_tasks=16))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loss-options")
    return {name: records(tmp / name, **options) for name, options in {
        "once": {},
        # one loss pass over the batch, so that the quantile is over the same tokens with and without sharing
        "top_entropy": dict(rl_top_entropy_quantile=0.2, micro_batch_size=8, shared_prefix_loss="on"),
        "top_entropy_unshared": dict(rl_top_entropy_quantile=0.2, micro_batch_size=8, shared_prefix_loss="off"),
        "mask_once": dict(rl_off_policy_mask=1e-3),
        "twice": dict(rl_num_iterations=2),
        "twice_delta": dict(rl_num_iterations=2, rl_delta=1.25),
        "twice_mask": dict(rl_num_iterations=2, rl_off_policy_mask=0.0),
        "plain_kl": dict(rl_kl_bias_correction=False),
    }.items()}


def test_the_entropy_quantile_trains_on_fewer_tokens_of_the_same_episodes(runs):
    full, top = runs["once"][0], runs["top_entropy"][0]
    assert top["reward"] == full["reward"]  # the same episodes at step 1
    assert abs(top["loss"]) < abs(full["loss"]) / 2  # a fifth of the tokens carry the policy term
    assert all(0.15 <= r["entropy/trained_frac"] <= 0.35 for r in runs["top_entropy"])  # logged: TRL does not
    assert "entropy/trained_frac" not in full and "off_policy/masked_frac" not in full
    # the highest-entropy tokens are the same whether the loss pass shares prompts or not (step/shared_prefix.py)
    assert runs["top_entropy_unshared"][0]["loss"] == pytest.approx(top["loss"], rel=1e-4, abs=1e-6)


def test_delta_and_the_off_policy_mask_act_once_the_policy_has_moved(runs):
    twice = runs["twice"][0]
    for name in ("twice_delta", "twice_mask"):
        assert runs[name][0]["reward"] == twice["reward"]
        assert runs[name][0]["loss"] != pytest.approx(twice["loss"], rel=1e-3), name
    assert runs["twice_mask"][0]["off_policy/masked_frac"] > 0  # negative-advantage sequences the update moved


def test_the_off_policy_mask_leaves_a_batch_played_by_the_policy_that_trains_alone(runs):
    """Hugging Face generation samples with the weights that train: one update a batch, nothing is off
    policy, and no sequence leaves the loss."""
    assert [r["loss"] for r in runs["mask_once"]] == pytest.approx([r["loss"] for r in runs["once"]], rel=1e-5)
    assert [r["off_policy/masked_frac"] for r in runs["mask_once"]] == [0, 0, 0, 0]


def test_the_adaptive_entropy_coefficient_is_logged_and_survives_a_resume(tmp_path):
    """Under a target no tiny policy reaches the coefficient rises by TRL's 0.005 after every step; a run
    resumed from step 2 goes on from the coefficient it had, not from --rl-entropy-coef."""
    out = tmp_path / "run"
    options = dict(rl_entropy_coef=0.01, rl_entropy_target=50.0, save_steps=2)
    whole = [r["entropy_coef"] for r in records(out, **options)]
    assert whole == pytest.approx([0.015, 0.02, 0.025, 0.03])
    train(RunConfig(**FAST, output_dir=str(out), **options, resume_from_checkpoint=str(out / "checkpoint-2")),
          env=LetterEnv(turns=1, num_tasks=16))
    resumed = [json.loads(line)["entropy_coef"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert resumed == pytest.approx(whole)


def test_the_kl_bias_correction_changes_the_kl_gradient_from_the_step_the_policy_has_moved(runs):
    """TRL weights each token's KL term by its policy ratio (use_bias_correction_kl, on by default): the ratio
    is 1 in value, so the loss is the same; its gradient is not, once the policy has left the reference."""
    corrected, plain = runs["once"], runs["plain_kl"]
    assert plain[0]["loss"] == pytest.approx(corrected[0]["loss"], rel=1e-5)  # step 1: policy = reference, KL 0
    assert plain[0]["grad_norm"] == pytest.approx(corrected[0]["grad_norm"], rel=1e-4)
    assert plain[1]["kl"] > 0 and plain[1]["grad_norm"] != pytest.approx(corrected[1]["grad_norm"], rel=1e-4)
