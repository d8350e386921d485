"""TR-DPO's moving reference (`--rl-ref-sync-steps`, `--rl-ref-mixup-alpha`; TRL's sync_ref_model). What a
user sees: the KL is measured against a reference that follows the policy (at alpha 1 it is the policy of
the step before, so the logged KL stays 0 where a fixed reference's grows), each checkpoint holds the
mixed reference, a resumed run goes on from it, and the setups without a reference to move are refused
in one line before anything loads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.training.run.checkpoints import resume_checkpoint
from aitrain_grpo.training.trainer import train
from envs.letters import LetterEnv
from tests.helpers.cli import refused

# A large learning rate so that one update moves the tiny policy far from the start; --no-peft so the
# reference is a model of its own.
FAST = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv", max_steps=3, lr=3e-2, seed=1, rl_max_new_tokens=8,
            use_vllm=False, peft=False)


def kl_by_step(out, **options):
    train(RunConfig(**{**FAST, **options}, output_dir=str(out)), env=LetterEnv(turns=1, num_tasks=16))
    return {r["step"]: r["kl"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def test_a_reference_synced_every_step_keeps_the_kl_at_zero_where_a_fixed_one_grows(tmp_path):
    fixed = kl_by_step(tmp_path / "fixed")
    synced = kl_by_step(tmp_path / "synced", rl_ref_sync_steps=1, rl_ref_mixup_alpha=1.0)
    assert fixed[1] == synced[1] == 0  # step 1: the policy is still the start
    assert fixed[2] > 0.1 and fixed[3] > 0.1
    assert synced[2] == pytest.approx(0, abs=1e-6) and synced[3] == pytest.approx(0, abs=1e-6)


def test_each_checkpoint_holds_the_reference_mixed_toward_that_steps_policy(tmp_path):
    out = tmp_path / "run"
    kl_by_step(out, rl_ref_sync_steps=1, rl_ref_mixup_alpha=0.5, save_steps=1, max_steps=2)
    ref1, ref2 = (load_file(out / f"checkpoint-{n}" / "reference_model.safetensors") for n in (1, 2))
    policy2 = load_file(out / "checkpoint-2" / "model.safetensors")
    shared = sorted(set(ref2) & set(policy2))
    assert len(shared) >= len(policy2) - 1  # every weight (a tied head may be stored once, under either name)
    moved = [name for name in shared if not torch.equal(policy2[name], ref2[name])]
    assert moved  # the reference is not the policy: it moved halfway
    for name in shared:  # ref_2 = 0.5 * policy_2 + 0.5 * ref_1
        torch.testing.assert_close(ref2[name], 0.5 * policy2[name] + 0.5 * ref1[name], rtol=1e-5, atol=1e-6)


def test_a_resumed_run_measures_its_kl_against_the_saved_reference(tmp_path):
    """Resumed from checkpoint-2, step 3's reference is step 2's policy (alpha 1), as in the run that was not
    stopped: its KL is 0. From the start model instead it would be well above 0 (the fixed run's step 3)."""
    out = tmp_path / "run"
    options = dict(rl_ref_sync_steps=1, rl_ref_mixup_alpha=1.0, save_steps=1)
    kl_by_step(out, **options)
    resumed = kl_by_step(out, **options, resume_from_checkpoint=str(out / "checkpoint-2"))
    assert resumed[3] == pytest.approx(0, abs=1e-6)
    # another schedule would change the reference midway: refused, naming the checkpoint's
    with pytest.raises(ConfigError, match="was trained with --rl-ref-sync-steps 1"):
        resume_checkpoint(RunConfig(**{**FAST, **options, "rl_ref_sync_steps": 4}, output_dir=str(out),
                                    resume_from_checkpoint="auto"))


@pytest.mark.parametrize("args, expected", [
    ([], ("--rl-ref-sync-steps", "with LoRA", "--no-peft")),
    (["--no-peft", "--rl-kl-coef", "0"], ("--rl-kl-coef 0", "--rl-kl-coef 0.04")),
])
def test_a_reference_that_cannot_move_is_refused_before_anything_loads(tmp_path, args, expected):
    refused(["grpo", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--rl-ref-sync-steps", "4",
             "--output-dir", str(tmp_path / "run"), *args], tmp_path, *expected)


def test_a_mixup_alpha_without_syncs_is_named_as_doing_nothing():
    from aitrain_grpo.option_effects import unused_option_notes

    notes = unused_option_notes(RunConfig(**FAST, rl_ref_mixup_alpha=0.9), [])
    assert any("--rl-ref-mixup-alpha does nothing without --rl-ref-sync-steps" in note for note in notes)
    assert not any("mixup" in note for note in unused_option_notes(
        RunConfig(**FAST, rl_ref_mixup_alpha=0.9, rl_ref_sync_steps=2), []))
