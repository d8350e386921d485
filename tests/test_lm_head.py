"""TRL's fused LM head scoring only the labelled positions on a CPU (training/trl/lm_head.py) gives the
log-probabilities, entropies and gradients of scoring every position, and a trainer installs it."""

from __future__ import annotations

import pytest
import torch

import trl.trainer.utils as trl_utils
from trl.kernels.chunked_logprob import _use_triton as TRL_USE_TRITON  # TRL's own, never replaced

from aitrain_grpo.training.trl.lm_head import scoring_labelled_positions


def _fused_pass(model, ids, mask, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    (-(out.log_probs * 0.7).sum() + 0.3 * out.entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.log_probs.detach(), out.entropy.detach(), grads


@pytest.mark.integration
def test_labelled_positions_only_give_what_every_position_gives(tiny_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trl_utils.add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (3, 20))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding of a prompt
    mask[2, -6:] = 0  # right padding of a completion
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :12] = -100  # the prompt: not scored
    monkeypatch.setattr(trl_utils, "_use_triton", TRL_USE_TRITON)  # as TRL ships it, whatever ran before
    assert not TRL_USE_TRITON(ids.device)  # TRL scores every position on a CPU
    every = _fused_pass(model, ids, mask, labels)
    monkeypatch.setattr(trl_utils, "_use_triton", scoring_labelled_positions(TRL_USE_TRITON))
    calls = []
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", _counting(trl_utils._ChunkedLogProbFunction, calls))
    labelled = _fused_pass(model, ids, mask, labels)
    assert calls == [int((labels[:, 1:] != -100).sum())]  # only the labelled positions went through the head
    torch.testing.assert_close(labelled[0], every[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(labelled[1], every[1], rtol=1e-5, atol=1e-5)
    assert labelled[2].keys() == every[2].keys() and labelled[2]
    for name in every[2]:
        torch.testing.assert_close(labelled[2][name], every[2][name], rtol=1e-4, atol=1e-6, msg=name)


def _counting(function, calls):
    class Counting:
        @staticmethod
        def apply(hidden, *args):
            calls.append(hidden.shape[0])
            return function.apply(hidden, *args)

    return Counting


def test_the_replacement_answers_for_a_cpu_only_and_wraps_once():
    calls = []

    def use_triton(device):
        calls.append(device.type)
        return device.type == "cuda"

    wrapped = scoring_labelled_positions(use_triton)
    assert wrapped(torch.device("cpu")) and wrapped(torch.device("cuda")) and not wrapped(torch.device("meta"))
    assert scoring_labelled_positions(wrapped) is wrapped


@pytest.mark.integration
def test_a_trainer_installs_it_for_its_training_only(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import TrainerCallback

    from aitrain_grpo import RunConfig
    from aitrain_grpo.training.trainer import build_trainer

    class Seen(TrainerCallback):
        during = None

        def on_step_end(self, args, state, control, **kwargs):
            Seen.during = trl_utils._use_triton(torch.device("cpu"))

    monkeypatch.setattr(trl_utils, "_use_triton", TRL_USE_TRITON)
    config = RunConfig(model=tiny_model_dir, output_dir=str(tmp_path / "run"), rl_env_module="envs.letters",
                       rl_env_class="LetterEnv", max_steps=1, batch_size=4)
    trainer = build_trainer(config, callbacks=[Seen()])
    trainer.train()
    assert Seen.during is True  # while the trainer trains, the CPU scores completion positions only
    assert trl_utils._use_triton is TRL_USE_TRITON  # and TRL's own function is back afterwards, for the process
