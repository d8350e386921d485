"""`--rl-min-p` and `--rl-repetition-penalty` reach Hugging Face generation: what a user sees in the turns.
The tiny model's greedy reply repeats one word ("The the the ..."); a repetition penalty of 5 leaves no
token twice, and min-p 0.999 at temperature 1 keeps only the likeliest token, so it samples the greedy
reply. The vLLM side is tests/test_vllm.py's (extras)."""

from __future__ import annotations

import pytest

from aitrain_grpo.engine.backends.base import SamplingParams
from aitrain_grpo.engine.backends.hf import HFBackend

ASKS = ["Write a's.", "Hello there", "Book a hotel in Lisbon"]


@pytest.fixture(scope="module")
def backend_and_prompts(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": ask}], add_generation_prompt=True,
                                             return_dict=True)["input_ids"] for ask in ASKS]
    return HFBackend.for_model(model, tokenizer), prompts


def test_a_repetition_penalty_stops_the_greedy_reply_repeating(backend_and_prompts):
    backend, prompts = backend_and_prompts
    plain = backend.generate(prompts, 24, SamplingParams(temperature=0, top_k=0))
    penalised = backend.generate(prompts, 24, SamplingParams(temperature=0, top_k=0, repetition_penalty=5.0))
    assert all(len(set(s.token_ids)) <= 3 for s in plain)  # the premise: one word over and over
    assert all(len(set(s.token_ids)) == len(s.token_ids) for s in penalised)


def test_a_min_p_near_one_samples_the_greedy_reply(backend_and_prompts):
    backend, prompts = backend_and_prompts
    greedy = backend.generate(prompts, 24, SamplingParams(temperature=0, top_k=0))
    sampled = backend.generate(prompts, 24, SamplingParams(temperature=1.0, top_k=0, min_p=0.999))
    unfiltered = backend.generate(prompts, 24, SamplingParams(temperature=1.0, top_k=0))
    assert [s.token_ids for s in sampled] == [s.token_ids for s in greedy]
    assert [s.token_ids for s in unfiltered] != [s.token_ids for s in greedy]  # without the filter it samples
