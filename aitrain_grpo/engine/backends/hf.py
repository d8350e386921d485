"""Generation with the Hugging Face model itself (`model.generate`), on CPU or GPU.

Prompts are left-padded into one batch per call. The log-probability of each sampled token is taken
from the raw logits divided by the temperature, which is how TRL computes the policy's own
log-probabilities, so the two agree when the weights are the same.

Inside `rollout_session()` (the engine opens one around each rollout) each turn continues the previous
turn's key-value cache instead of encoding the whole conversation again, and the first turn encodes
each GRPO group's shared prompt once for the whole group (`share_group_prompts`; turn_cache.py).

On the CPU, grouped-query models attend with torch's native grouped-query kernel while sampling
(attention.py): transformers' `sdpa` copies the keys and values to every head whenever a padding mask is
given.

Left out: continuous batching inside `generate` (the engine's continuous schedule gathers turns into
batched calls, turn_batcher.py), and returning top-k alternatives.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
from transformers import GenerationConfig

from aitrain_grpo.models.loading import stop_token_ids
from aitrain_grpo.engine.backends.attention import native_gqa
from aitrain_grpo.engine.backends.base import GenerationBackend, Sample, SamplingParams
from aitrain_grpo.engine.backends.turn_cache import TurnCache, prefill_shared_prompts


class HFBackend(GenerationBackend):
    """Samples with a transformers causal LM. `open_model()` is a context manager yielding the model to
    generate with: training hands TRL's `unwrap_model_for_generation` around the wrapped model
    (training/trl/access.py), so this module knows nothing of TRL's trainer."""

    def __init__(self, open_model: Callable[[], ContextManager], tokenizer, stop_ids: list[int], device=None,
                 *, share_group_prompts: bool = True):
        self.open_model = open_model
        self.stop_ids = stop_ids
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
        self.device = device
        self.turn_cache: TurnCache | None = None
        # Repeated prompts (a GRPO group) are encoded once per call that starts without a cache.
        self.share_group_prompts = share_group_prompts
        self.shared_prefills = 0  # calls that did so (for tests and benchmarks)

    @contextlib.contextmanager
    def rollout_session(self):
        """Within it, calls may continue the previous call's cache: the weights must not change."""
        self.turn_cache = TurnCache(self.pad_id)
        try:
            yield
        finally:
            self.turn_cache = None

    @classmethod
    def for_model(cls, model, tokenizer) -> "HFBackend":
        return cls(lambda: contextlib.nullcontext(model), tokenizer, stop_token_ids(model, tokenizer))

    def _generation_config(self, max_tokens: int, sampling: SamplingParams) -> GenerationConfig:
        greedy = sampling.temperature <= 0
        return GenerationConfig(
            max_new_tokens=max_tokens,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            # 0 and 1.0 switch the filters off; None would fall back to transformers' defaults (top-k 50).
            top_k=None if greedy else int(sampling.top_k),
            top_p=None if greedy else float(sampling.top_p),
            min_p=None if greedy or not sampling.min_p else float(sampling.min_p),
            repetition_penalty=None if sampling.repetition_penalty == 1.0 else float(sampling.repetition_penalty),
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams) -> list[Sample]:
        if not prompts:
            return []
        turn_cache = self.turn_cache
        continued = turn_cache.continue_batch(prompts) if turn_cache is not None else None
        with self.open_model() as model, native_gqa(model):  # grouped-query attention without copied K/V (CPU)
            device = self.device or next(model.parameters()).device
            was_training = model.training
            model.eval()  # no dropout while sampling: the sampled log-probs must be the policy's
            try:
                if continued is None and self.share_group_prompts:
                    continued = prefill_shared_prompts(model, prompts, self.pad_id, device)
                    self.shared_prefills += continued is not None
                if continued is None:
                    width = max(len(p) for p in prompts)
                    input_ids = torch.tensor([[self.pad_id] * (width - len(ids)) + list(ids) for ids in prompts], dtype=torch.long)
                    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts], dtype=torch.long)
                    cached = {}
                else:
                    input_ids, attention_mask = continued.input_ids, continued.attention_mask
                    cached = {"past_key_values": continued.past_key_values}
                input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    generation_config=self._generation_config(max_tokens, sampling),
                    **cached,
                )
            finally:
                if was_training:
                    model.train()
        sampled = out.sequences[:, input_ids.size(1):]
        logits = torch.stack(out.logits, dim=1).float()  # (batch, steps, vocab)
        if sampling.temperature > 0:
            logits = logits / sampling.temperature
        # x - logsumexp(x) at the sampled token only: the same value as log_softmax, without writing
        # a (batch, steps, vocab) result.
        logprobs = logits.gather(-1, sampled.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        is_stop = torch.isin(sampled, torch.tensor(self.stop_ids, device=sampled.device))
        any_stop = is_stop.any(dim=1)
        lengths = torch.where(any_stop, is_stop.int().argmax(dim=1) + 1, torch.full_like(any_stop, sampled.size(1), dtype=torch.long))
        sampled_rows, logprob_rows = sampled.cpu().tolist(), logprobs.cpu().tolist()
        samples = [
            Sample(
                token_ids=sampled_rows[i][:n],
                logprobs=logprob_rows[i][:n],
                finish_reason="stop" if stopped else "length",
            )
            for i, (n, stopped) in enumerate(zip(lengths.tolist(), any_stop.tolist()))
        ]
        if turn_cache is not None:
            turn_cache.keep(prompts, input_ids, attention_mask, out, [sample.token_ids for sample in samples])
        return samples
