"""Attention for sampling from grouped-query models on the CPU: torch's own grouped-query attention
instead of keys and values copied out to every head.

transformers' `sdpa` attention passes torch's `scaled_dot_product_attention` its native grouped-query
option only when no attention mask is given (the condition of the CUDA kernels). A batched rollout turn
always has one (left padding), so each layer of each decode step first copies the whole key-value cache
out to one copy per query head (`repeat_kv`). Profiled on the benchmark's training workload C (tiny
model, 64 episodes, 4 turns): that copy was a quarter of the rollout, more than the attention itself.
Torch's CPU kernels take `enable_gqa=True` together with a mask and return the same numbers (measured
difference 0; one decode step at 450 cached tokens and batch 64: 1.2 ms against 18 ms).

`native_gqa(model)` switches a model to that attention for the duration of a block (the hf backend's
generate calls); the model trains with transformers' own choice.

Left out: CUDA and other devices (transformers' choice stands), models without grouped-query heads or
with a position bias (they take transformers' `sdpa` unchanged), and training (the backward pass was
not measured here).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

NAME = "aitrain_sdpa_native_gqa"
_registered = False


def sdpa_native_gqa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' `sdpa` attention, except that a masked grouped-query call on the CPU goes to
    torch's kernel with `enable_gqa=True` instead of repeating keys and values."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if grouped and attention_mask is not None and kwargs.get("position_bias") is None and query.device.type == "cpu":
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, sdpa_native_gqa)
        AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks transformers builds for `sdpa`
        _registered = True


@contextlib.contextmanager
def native_gqa(model) -> Iterator[None]:
    """Within the block, `model` (a transformers model, or a PEFT wrapper of one) attends with
    `sdpa_native_gqa` if it uses `sdpa` on the CPU; otherwise nothing changes."""
    config = getattr(model, "config", None)
    device = next(model.parameters()).device
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or device.type != "cpu":
        yield
        return
    _register()
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
