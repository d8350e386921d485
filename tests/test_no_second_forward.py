"""No second scoring forward (issue 49): with vLLM's importance-sampling correction on a batch trained
once, the weights come from the loss pass's own log-probabilities (training/step/loss.py) instead of a
forward of their own over the whole batch, as TRL runs it. Loss and gradients must be TRL's: here the
same micro-batch goes through TRL's loss both ways, on the tiny model, with sampler log-probabilities
that differ from the trainer's as a vLLM server's do."""

from __future__ import annotations

import copy

import pytest
import torch

from aitrain_grpo import RunConfig
from aitrain_grpo.training.step.batch import loss_mask
from aitrain_grpo.training.step.loss import loss_inputs
from aitrain_grpo.training.step.scoring import importance_ratio
from aitrain_grpo.training.trainer import build_trainer
from envs_fixtures.turn_rewards import TurnRewardEnv
from helpers.rollouts import as_on_a_vllm_server


@pytest.fixture(scope="module")
def trained_once(tiny_model_dir, tmp_path_factory):
    """A one-step run (micro-batches of 4, KL on) and the step's micro-batches, as the trainer split them."""
    config = RunConfig(model=tiny_model_dir, output_dir=str(tmp_path_factory.mktemp("once") / "run"), max_steps=1,
                       batch_size=8, micro_batch_size=4, rl_num_generations=4, rl_max_new_tokens=10, seed=2,
                       peft=False, rl_kl_coef=0.05)
    trainer = build_trainer(config, TurnRewardEnv(flat_score=None))
    as_on_a_vllm_server(trainer, shift=0.3)
    calls = []
    forward = trainer._get_per_token_logps_and_entropies
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: calls.append(k.get("compute_entropy")) or forward(*a, **k)
    trainer.train()
    trainer._get_per_token_logps_and_entropies = forward
    return trainer, calls


def loss_and_grads(trainer, inputs):
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = [p.grad.detach().clone() for p in trainer.model.parameters() if p.grad is not None]
    trainer.model.zero_grad()
    return loss.item(), grads


def test_a_batch_trained_once_runs_no_old_policy_forward(trained_once):
    trainer, calls = trained_once
    log = next(h for h in trainer.state.log_history if "loss" in h)
    # One scoring pass over the batch (the reference's, for the KL) and a loss pass (with entropies) per
    # micro-batch; TRL would run a second scoring pass for the old policy.
    assert calls == [None, True, True], calls
    assert log["sampling/importance_sampling_ratio/mean"] != pytest.approx(1.0, abs=1e-3)


def test_the_loss_pass_weights_give_trls_loss_and_gradients(trained_once):
    trainer, _ = trained_once
    trainer.model.train()
    (micro, _) = trainer._micro_batches
    inputs = loss_inputs(micro, drop_masked_rows=False)
    assert "importance_sampling_ratio" not in inputs  # the step's micro-batch is left as the step made it
    ours_in = copy.copy(inputs)
    trl_in = copy.copy(inputs)
    with torch.no_grad():  # TRL's way: a forward of its own for the old policy, then the ratio
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        old = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, inputs["completion_ids"].shape[1])[0]
    trl_in["old_per_token_logps"] = old
    trl_in["importance_sampling_ratio"] = importance_ratio(old, inputs["sampling_per_token_logps"], loss_mask(inputs),
                                                           mode="token_truncate",
                                                           low=trainer.vllm_importance_sampling_clip_min,
                                                           high=trainer.vllm_importance_sampling_clip_max)
    ours, ours_grads = loss_and_grads(trainer, ours_in)
    trls, trl_grads = loss_and_grads(trainer, trl_in)
    assert ours == pytest.approx(trls, rel=1e-5, abs=1e-7)
    for a, b in zip(ours_grads, trl_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # Negative control: without the weights the loss moves, so the comparison above can fail.
    plain = copy.copy(inputs)
    plain["importance_sampling_ratio"] = torch.ones_like(trl_in["importance_sampling_ratio"])
    assert loss_and_grads(trainer, plain)[0] != pytest.approx(trls, rel=1e-3)


def test_trl_loss_still_takes_a_batchs_own_weights_when_they_are_there(trained_once):
    # A batch trained over several optimizer steps brings its weights from the scoring forward
    # (step/flow.py); the loss pass then leaves them as they are.
    trainer, _ = trained_once
    (micro, _) = trainer._micro_batches
    inputs = loss_inputs(micro, drop_masked_rows=False)
    given = copy.copy(inputs)
    given["importance_sampling_ratio"] = torch.full_like(inputs["completion_ids"], 0.5, dtype=torch.float32)
    loss_and_grads(trainer, given)
    assert torch.equal(given["importance_sampling_ratio"], torch.full_like(given["importance_sampling_ratio"], 0.5))

