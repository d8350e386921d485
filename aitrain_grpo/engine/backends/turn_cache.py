"""Key-value cache reuse across the turns of one rollout, for the Hugging Face backend.

Each turn the engine asks for a continuation of every running episode: the previous turn's prompt, the
tokens sampled for it, and the environment's reply. Encoding that whole conversation again each turn
(the prefill) is most of the generation time once episodes grow: 45% on the benchmark's tool workload.
`TurnCache` keeps the previous `generate` call's cache and, when every new prompt extends one of the
previous rows (same tokens, checked, in the same order), hands `generate` that cache plus only the new
tokens. Within one rollout the weights do not change, so the cached keys and values are exactly what a
fresh prefill would compute (up to float rounding: 3e-6 in the log-probabilities on the tiny model).

Layout: the cache's rows are left-padded; after a call, a row's sampled tokens follow its prompt, and a
row that stopped early is followed by padding that `generate` produced while the others went on. The
next call keeps those columns and masks them out (attention mask 0); the model's positions come from
the mask's running count, so they stay those of the real conversation. The new tokens (the last sampled
token, whose keys were never computed, and the environment's reply) are left-padded into a block after
the cache. Masked columns are never removed: they cost attention time, not correctness.

Anything unexpected (a prompt that extends no previous row, a cache type other than plain full
attention, a cache length `generate` did not leave as expected) falls back to a fresh prefill for the
whole call. The cache lives only inside `HFBackend.rollout_session()`, which the engine opens around one
rollout: weights change between rollouts, so nothing is kept across them. Within a rollout it stays in
memory while the environments answer (on a GPU, memory `generate` would otherwise have freed).

The first call of a rollout has no cache to continue, but GRPO gives it each prompt several times
(a group). `prefill_shared_prompts` encodes each distinct prompt once and copies its keys and values
to the group's rows, so `generate` starts from a cache and only the last prompt column is computed per
row: the group shares one prefill (the copies still take memory; only the compute is shared).

Left out: prefixes shared by different prompts (only whole identical prompts are shared), memory
sharing between a group's rows, and compacting masked columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ContinuedBatch:
    """What `generate` needs to continue the cache: every column's ids and mask, the cache itself."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    past_key_values: object


@dataclass
class _Row:
    covered: list[int]  # the real tokens whose keys and values the cache holds, in order


class TurnCache:
    """The previous `generate` call of a rollout, kept to continue from."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id
        self._cache = None
        self._ids: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self._rows: list[_Row] = []
        self.continued_calls = 0  # calls that reused the cache (for tests and benchmarks)

    def clear(self) -> None:
        self._cache, self._ids, self._mask, self._rows = None, None, None, []

    def continue_batch(self, prompts: list[list[int]]) -> ContinuedBatch | None:
        """The inputs that continue the kept cache for these prompts, or None (then prefill afresh).
        The kept cache is handed over (generate extends it in place), so this is good for one call."""
        cache, ids, mask, rows = self._cache, self._ids, self._mask, self._rows
        self.clear()
        if cache is None:
            return None
        picked, tails = [], []
        j = 0
        for prompt in prompts:
            # The engine passes the running episodes in their original order, so a single forward scan
            # pairs each prompt with the row it extends.
            while j < len(rows) and not _extends(prompt, rows[j].covered):
                j += 1
            if j == len(rows):
                return None
            picked.append(j)
            tails.append(prompt[len(rows[j].covered):])
            j += 1
        index = torch.tensor(picked, dtype=torch.long, device=ids.device)
        cache.batch_select_indices(index)
        width = max(len(tail) for tail in tails)
        tail_ids = torch.full((len(tails), width), self.pad_id, dtype=torch.long)
        tail_mask = torch.zeros((len(tails), width), dtype=mask.dtype)
        for row, tail in enumerate(tails):
            tail_ids[row, width - len(tail):] = torch.tensor(tail, dtype=torch.long)
            tail_mask[row, width - len(tail):] = 1
        self.continued_calls += 1
        return ContinuedBatch(
            input_ids=torch.cat([ids[index], tail_ids.to(ids.device)], dim=1),
            attention_mask=torch.cat([mask[index], tail_mask.to(mask.device)], dim=1),
            past_key_values=cache,
        )

    def keep(self, prompts: list[list[int]], input_ids, attention_mask, out, sampled: list[list[int]]) -> None:
        """Remember a finished call: `out` is generate's output (with `past_key_values`), `sampled` each
        row's sampled tokens up to and including its stop token."""
        cache = getattr(out, "past_key_values", None)
        width = input_ids.size(1)
        steps = out.sequences.size(1) - width
        # The last sampled token is never fed back, so the cache ends one column before it.
        if cache is None or not _plain_full_attention(cache) or steps < 1 or cache.get_seq_length() != width + steps - 1:
            return
        generated = torch.arange(steps - 1, device=attention_mask.device).unsqueeze(0)
        counts = torch.tensor([len(s) for s in sampled], device=attention_mask.device).unsqueeze(1)
        # Columns after a row's stop token hold padding generated while other rows went on: mask them.
        tail_mask = (generated < counts).to(attention_mask.dtype)
        self._cache = cache
        self._ids = out.sequences[:, : width + steps - 1]
        self._mask = torch.cat([attention_mask, tail_mask], dim=1)
        self._rows = [_Row(covered=prompt + tokens[: steps - 1]) for prompt, tokens in zip(prompts, sampled)]


def _extends(prompt: list[int], covered: list[int]) -> bool:
    # Strictly longer: generate needs at least one new token to compute the next token's logits.
    return len(prompt) > len(covered) and prompt[: len(covered)] == covered


def _plain_full_attention(cache) -> bool:
    """Only a plain dynamic cache of full-attention layers can be continued this way (a sliding window
    drops old columns; quantized and linear-attention layers keep other state)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = getattr(cache, "layers", None)
    return type(cache) is DynamicCache and bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def prefill_shared_prompts(model, prompts: list[list[int]], pad_id: int, device) -> ContinuedBatch | None:
    """Encode each distinct prompt once, all but its last token, and give every row a copy of its
    prompt's cache; None when no prompt repeats (then a plain prefill costs the same).

    The prompts are left-padded to one width, as a plain prefill would be, and the positions come from
    the attention mask the way `generate` derives them, so the cache holds what a plain prefill of
    the same columns would."""
    distinct: dict[tuple[int, ...], int] = {}
    rows = [distinct.setdefault(tuple(prompt), len(distinct)) for prompt in prompts]
    width = max(len(p) for p in prompts)
    if len(distinct) == len(prompts) or width < 2:
        return None
    from transformers.cache_utils import DynamicCache

    unique = list(distinct)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in unique], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in unique], dtype=torch.long, device=device)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], past_key_values=cache, use_cache=True)
    if not _plain_full_attention(cache) or cache.get_seq_length() != width - 1:
        return None
    index = torch.tensor(rows, dtype=torch.long, device=device)
    cache.batch_select_indices(index)
    return ContinuedBatch(input_ids=ids[index], attention_mask=mask[index], past_key_values=cache)
