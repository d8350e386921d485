"""Guards the rollout engine's cost model by counting, never by timing (benchmarks/rollout.py measures
the speed itself):

- text the model generated is never encoded again, and the chat-template and tokenizer work of a turn
  does not grow with the conversation (no re-rendering of the whole episode each turn);
- after the first turn, the model continues its key-value cache instead of encoding the conversation
  again, and the log-probabilities it reports are still exactly the model's own;
- the environment calls of a batch overlap: sync methods run in threads, async ones on the event loop,
  and every call here waits at a barrier that only opens once all the batch's episodes are inside it,
  so an engine that called them one after another would fail these tests (after the barrier's timeout).

The model is the real tiny one, with the last token of a turn forced to EOS (a transformers generation
option) so that every turn ends by itself and every episode plays all its turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from aitrain_grpo import Environment
from aitrain_grpo.engine.backends.base import SamplingParams
from aitrain_grpo.engine.backends.hf import HFBackend
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings

EPISODES = 8
TURNS = 5
NEW_TOKENS = 8
# A long system prompt: re-encoding the conversation on any turn would re-encode these characters.
SYSTEM = "You are a patient assistant. " * 40


class TurnEndingHF(HFBackend):
    def _generation_config(self, max_tokens, sampling):
        config = super()._generation_config(max_tokens, sampling)
        config.forced_eos_token_id = self.stop_ids[0]
        return config

    @contextlib.contextmanager
    def rollout_session(self):
        with super().rollout_session():
            self.last_turn_cache = self.turn_cache  # kept for the assertions after the rollout
            yield


class CountingTokenizer:
    """The real tokenizer, recording every text it encodes, every conversation it renders and how many
    tokens it decodes."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.encoded: list[str] = []
        self.rendered: list[list[dict]] = []
        self.decoded_tokens = 0

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def _record(self, text) -> None:
        self.encoded.extend([text] if isinstance(text, str) else list(text))

    def __call__(self, text, *args, **kwargs):
        self._record(text)
        return self._tokenizer(text, *args, **kwargs)

    def encode(self, text, *args, **kwargs):
        self._record(text)
        return self._tokenizer.encode(text, *args, **kwargs)

    def apply_chat_template(self, conversation, *args, **kwargs):
        self.rendered.append(list(conversation))
        return self._tokenizer.apply_chat_template(conversation, *args, **kwargs)

    def decode(self, ids, *args, **kwargs):
        self.decoded_tokens += len(ids)
        return self._tokenizer.decode(ids, *args, **kwargs)

    def batch_decode(self, sequences, *args, **kwargs):
        self.decoded_tokens += sum(len(ids) for ids in sequences)
        return self._tokenizer.batch_decode(sequences, *args, **kwargs)


def rows(n: int = EPISODES) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Task {i}: say something."}],
             "task": i} for i in range(n)]


class TalkEnv(Environment):
    max_turns = TURNS

    def build_dataset(self, tokenizer):
        return rows()

    def step(self, episode, completion):
        if episode.turns >= TURNS:
            return None
        return f"Reply {episode.turns} to task {episode.row['task']}: go on."

    def score_episode(self, episode):
        return 1.0


def play(env, tokenizer, model, episodes: list[dict], env_timeout: float = 60.0):
    backend = TurnEndingHF.for_model(model, tokenizer)
    engine = RolloutEngine(env, tokenizer, backend, EpisodeSettings(
        max_new_tokens=NEW_TOKENS, env_timeout=env_timeout, sampling=SamplingParams(temperature=1.0, top_k=0, top_p=1.0)))
    with engine:
        batch = engine.run(episodes)
        batch.backend = backend
        return batch


@pytest.fixture(scope="module")
def talk(tiny_model_and_tokenizer):
    import torch

    model, tokenizer = tiny_model_and_tokenizer
    counting = CountingTokenizer(tokenizer)
    torch.manual_seed(0)
    batch = play(TalkEnv(), counting, model, rows())
    return batch, counting


def test_every_episode_plays_all_its_turns(talk):
    batch, _ = talk
    assert [ep.turns for ep in batch.episodes] == [TURNS] * EPISODES
    assert not any(ep.truncated or ep.error for ep in batch.episodes)
    assert batch.generate_calls == TURNS  # one batched call per turn, not one per episode


def test_generated_text_is_never_encoded_or_rendered_again(talk):
    batch, counting = talk
    completions = [m["content"] for ep in batch.episodes for m in ep.messages if m["role"] == "assistant"]
    distinctive = [text for text in completions if len(text.strip()) >= 12]
    assert len(distinctive) >= EPISODES  # enough model text for the check to mean something
    for text in distinctive:
        assert not any(text in encoded for encoded in counting.encoded)
        assert not any(m.get("content") == text for conversation in counting.rendered for m in conversation)
    model_tokens = sum(sum(trace.env_mask) for trace in batch.traces)
    assert counting.decoded_tokens <= model_tokens  # only each new turn is decoded, once


def test_each_turn_after_the_first_continues_the_models_cache(talk):
    batch, _ = talk
    assert batch.backend.last_turn_cache.continued_calls == TURNS - 1


def test_logprobs_with_the_continued_cache_are_the_models_own(talk, tiny_model_and_tokenizer):
    import torch

    model, _ = tiny_model_and_tokenizer
    batch, _ = talk
    for trace in batch.traces:
        ids = torch.tensor([trace.prompt_ids + trace.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(trace.prompt_ids) - 1:-1].float()
        own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(trace.completion_ids)[:, None])[:, 0]
        mask = torch.tensor(trace.env_mask, dtype=torch.bool)
        assert torch.allclose(own[mask], torch.tensor(trace.logprobs)[mask], atol=1e-4)


def test_template_work_per_turn_does_not_grow_with_the_conversation(talk):
    batch, counting = talk
    replies = [m for ep in batch.episodes for m in ep.messages[2:] if m["role"] != "assistant"]
    assert len(replies) == EPISODES * (TURNS - 1)
    # The prompts once each, then per reply its own text plus the template's few dozen characters.
    prompt_chars = EPISODES * (len(SYSTEM) + 200)
    reply_chars = sum(len(m["content"]) + 120 for m in replies)
    assert sum(len(text) for text in counting.encoded) <= prompt_chars + reply_chars
    # One rendering per prompt and at most one per reply (a few more set the renderer up).
    assert len(counting.rendered) <= EPISODES + len(replies) + 4
    longest_rendered = max(len(conversation) for conversation in counting.rendered)
    assert longest_rendered <= 4  # never the growing conversation (which reaches 2 + 2 * TURNS messages)


class RendezvousEnv(Environment):
    """Each call waits at a barrier for all EPISODES calls of its round; counts how many are inside."""

    max_turns = 3

    def __init__(self):
        self.barrier = threading.Barrier(EPISODES, timeout=5)
        self.lock = threading.Lock()
        self.inside = self.most_inside = 0
        self.calls = 0

    def build_dataset(self, tokenizer):
        return rows()

    def meet(self) -> None:
        with self.lock:
            self.calls += 1
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            self.barrier.wait()
        finally:
            with self.lock:
                self.inside -= 1

    def reset(self, episode):
        self.meet()

    def step(self, episode, completion):
        self.meet()
        return "go on" if episode.turns < self.max_turns else None

    def score_episode(self, episode):
        self.meet()
        return 1.0


class AsyncRendezvousEnv(RendezvousEnv):
    def __init__(self):
        super().__init__()
        self.async_barrier = asyncio.Barrier(EPISODES)

    async def ameet(self) -> None:
        self.calls += 1
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            await asyncio.wait_for(self.async_barrier.wait(), timeout=5)
        finally:
            self.inside -= 1

    async def reset(self, episode):
        await self.ameet()

    async def step(self, episode, completion):
        await self.ameet()
        return "go on" if episode.turns < self.max_turns else None

    async def score_episode(self, episode):
        await self.ameet()
        return 1.0


@pytest.mark.parametrize("env_class", [RendezvousEnv, AsyncRendezvousEnv], ids=["sync", "async"])
def test_environment_calls_of_a_batch_overlap(tiny_model_and_tokenizer, env_class):
    model, tokenizer = tiny_model_and_tokenizer
    env = env_class()
    batch = play(env, tokenizer, model, rows(), env_timeout=20)
    assert [ep.error for ep in batch.episodes] == [None] * EPISODES
    assert [ep.turns for ep in batch.episodes] == [env.max_turns] * EPISODES
    # reset, each turn's step, and score_episode: every round had all episodes inside at once.
    assert env.calls == EPISODES * (1 + env.max_turns + 1)
    assert env.most_inside == EPISODES
