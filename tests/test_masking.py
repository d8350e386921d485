"""Environment tokens are context, not actions: a real TRL GRPO step puts no gradient on them."""

from __future__ import annotations

import torch

from aitrain_grpo import RunConfig
from aitrain_grpo.training.trainer import build_trainer
from envs.letters import LetterEnv


def test_environment_tokens_receive_no_gradient(tiny_model_dir, tmp_path):
    config = RunConfig(
        model=tiny_model_dir, output_dir=str(tmp_path), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        peft=False, max_steps=1, batch_size=8, rl_max_new_tokens=48, lr=1e-3, rl_kl_coef=0.0, seed=7,
    )
    trainer = build_trainer(config, LetterEnv(turns=3, num_tasks=8))
    captured: list[tuple[torch.Tensor, torch.Tensor]] = []

    def capture(module, args, kwargs, output):
        # TRL scores tokens with a fused LM head: `log_probs[:, s]` is the log-prob, predicted at
        # position s, of token s + 1. Its gradient at an environment token is what must be zero.
        per_token = getattr(output, "log_probs", None)
        if per_token is not None and per_token.requires_grad:  # the training pass, not no-grad scoring
            input_ids = kwargs["input_ids"].detach().clone()
            per_token.register_hook(lambda grad: captured.append((input_ids, grad.detach().clone())))

    trainer.model.register_forward_hook(capture, with_kwargs=True)
    trainer.train()

    batch = trainer.rollout.last_batch
    assert captured, "no training forward pass was seen"
    env_positions = model_positions = 0
    for input_ids, grad in captured:
        for row, token_grads in zip(input_ids.tolist(), grad):
            trace = next(t for t in batch.traces if _contains(row, t))
            start = _find(row, trace.prompt_ids + trace.completion_ids) + len(trace.prompt_ids)
            for j, mask in enumerate(trace.env_mask):
                g = token_grads[start + j - 1].abs().item()
                if mask == 0:
                    env_positions += 1
                    assert g == 0.0, f"environment token {j} received gradient {g}"
                elif g > 0:
                    model_positions += 1
    assert env_positions > 0, "the batch had no environment tokens to check"
    assert model_positions > 0, "model tokens should receive gradient"


def _find(row: list[int], sequence: list[int]) -> int:
    for start in range(len(row) - len(sequence) + 1):
        if row[start:start + len(sequence)] == sequence:
            return start
    raise AssertionError("episode tokens not found in the training batch")


def _contains(row: list[int], trace) -> bool:
    try:
        _find(row, trace.prompt_ids + trace.completion_ids)
        return True
    except AssertionError:
        return False
