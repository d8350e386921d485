"""TRL's reference/old log-prob passes over each chunk's own length (training/trl/scoring_passes.py) give
TRL's own values, and a trainer's passes are really cut."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.integration
def test_a_scoring_pass_is_cut_to_each_chunk_and_gives_trls_values(tiny_model_dir, tmp_path):
    from aitrain_grpo import RunConfig
    from aitrain_grpo.training.trainer import build_trainer

    trainer = build_trainer(RunConfig(model=tiny_model_dir, output_dir=str(tmp_path / "run"), seed=0,
                                      rl_env_module="envs.letters", rl_env_class="LetterEnv", max_steps=1,
                                      batch_size=4, micro_batch_size=2))
    model = trainer.model
    model.eval()  # no dropout: the two passes must see the same function
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)  # after the trainer's hooks: what the model is given
    torch.manual_seed(0)
    prompt, completion = 6, 14
    ids = torch.randint(3, model.config.vocab_size, (4, prompt + completion))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a shorter prompt, left-padded
    mask[0, prompt + 5:] = 0  # chunk 1: completions of 5 and 9 tokens
    mask[1, prompt + 9:] = 0
    mask[3, prompt + 12:] = 0  # chunk 2: 14 and 12

    def scores(grad: bool):
        with torch.set_grad_enabled(grad):
            logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
                model, ids, mask, completion, batch_size=2, compute_entropy=True)
        return logps.detach(), entropies.detach()

    cut = scores(grad=False)  # a scoring pass: cut per chunk
    assert seen == [prompt + 9, prompt + completion]
    seen.clear()
    full = scores(grad=True)  # with gradient (the loss pass) the trainer leaves TRL's inputs alone
    assert seen == [prompt + completion] * 2
    assert cut[0].shape == full[0].shape == (4, completion)
    torch.testing.assert_close(cut[0], full[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cut[1], full[1], rtol=1e-5, atol=1e-6)
    assert (cut[0][0, 5:] == 0).all() and (cut[0][1, 9:] == 0).all()  # padding scores zero, as TRL's does


def test_only_scoring_forwards_of_the_fused_head_are_cut():
    from aitrain_grpo.training.trl.scoring_passes import trailing_cut

    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 0]])
    base = {"input_ids": torch.zeros_like(mask), "attention_mask": mask, "labels": torch.zeros_like(mask),
            "fused_lm_head": True}
    with torch.no_grad():
        assert trailing_cut(base) == 4
        assert trailing_cut({**base, "fused_lm_head": False}) is None  # generation, plain forwards
        assert trailing_cut({**base, "past_key_values": object()}) is None  # the shared-prefix path
        assert trailing_cut({**base, "token_type_ids": torch.zeros_like(mask)}) is None  # more per-column inputs
        assert trailing_cut({**base, "attention_mask": torch.ones_like(mask)}) is None  # nothing to cut
    assert trailing_cut(base) is None  # with gradient: the loss pass
