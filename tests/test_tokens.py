"""Token accounting on the real tiny model: what the model sampled, what the environment said, and the
budgets that stop an episode."""

from __future__ import annotations

import pytest
import torch

from aitrain_grpo import Environment, ToolEnvironment, tool
from aitrain_grpo.engine.backends.base import SamplingParams
from aitrain_grpo.engine.backends.hf import HFBackend
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings


class ChattyEnv(ToolEnvironment):
    """Replies with a user message, then a tool message, for three turns."""

    max_turns = 3

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]}]

    @tool
    def lookup(self, q: str) -> str:
        """Look something up.

        Args:
            q: The query.
        """
        return q

    async def step(self, episode, completion):
        if episode.turns == 1:
            return "Tell me more, please."
        return [{"role": "tool", "name": "lookup", "content": '{"result": "forty-two"}'}]

    def score_episode(self, episode):
        return 0.5


def make_engine(model_and_tokenizer, env, **kwargs) -> RolloutEngine:
    model, tokenizer = model_and_tokenizer
    kwargs.setdefault("max_new_tokens", 24)
    kwargs.setdefault("max_completion_length", 512)
    # These tests read each model turn up to its own EOS; a cut turn going on (the default, "continue")
    # has its end-of-turn token in the reply's suffix instead, checked in test_cut_turn.py.
    kwargs.setdefault("cut_turn", "end")
    return RolloutEngine(env, tokenizer, HFBackend.for_model(model, tokenizer), EpisodeSettings(**kwargs))


@pytest.fixture(scope="module")
def chatty_batch(tiny_model_and_tokenizer):
    torch.manual_seed(0)
    engine = make_engine(tiny_model_and_tokenizer, ChattyEnv(), max_new_tokens=48)
    rows = ChattyEnv().build_dataset(None) * 12
    batch = engine.run(rows)
    yield engine, batch
    engine.close()


def test_decoded_episode_tokens_equal_the_rendered_final_conversation(chatty_batch):
    engine, batch = chatty_batch
    tokenizer = engine.tokenizer
    multi_turn = [i for i, ep in enumerate(batch.episodes) if ep.turns >= 2]
    assert multi_turn, "expected some episodes to reach a second turn"
    for episode, trace in zip(batch.episodes, batch.traces):
        decoded = tokenizer.decode(trace.prompt_ids + trace.completion_ids, skip_special_tokens=False)
        ended_with_eos = trace.completion_ids[-1] == tokenizer.eos_token_id
        # The rendering also closes the last assistant turn; the episode's tokens stop at the EOS.
        decoded += engine.renderer.closing_text(ended_with_eos)
        assert decoded == engine.renderer.render(episode.messages, add_generation_prompt=False)


def test_env_mask_is_zero_exactly_on_environment_tokens(chatty_batch):
    engine, batch = chatty_batch
    for episode, trace in zip(batch.episodes, batch.traces):
        assert len(trace.completion_ids) == len(trace.env_mask) == len(trace.logprobs)
        # Rebuild the expected layout from the conversation: model turns (mask 1), replies (mask 0).
        expected_mask: list[int] = []
        assistant_turns = [m for m in episode.messages if m["role"] == "assistant"]
        replies = []
        reply: list[dict] = []
        for message in episode.messages[len(ChattyEnv().build_dataset(None)[0]["prompt"]):]:
            if message["role"] == "assistant":
                if reply:
                    replies.append(reply)
                reply = []
            else:
                reply.append(message)
        if reply:
            replies.append(reply)
        position = 0
        for turn_index, _ in enumerate(assistant_turns):
            # Model tokens run until the EOS that closes the turn (or the end of the trace).
            start = position
            while position < len(trace.env_mask) and trace.env_mask[position] == 1:
                position += 1
            assert position > start
            expected_mask += [1] * (position - start)
            if turn_index < len(replies):
                suffix = engine.renderer.reply_ids(replies[turn_index], ended_with_eos=True)
                assert trace.completion_ids[position:position + len(suffix)] == suffix
                expected_mask += [0] * len(suffix)
                position += len(suffix)
        assert position == len(trace.completion_ids)
        assert trace.env_mask == expected_mask
        assert all(lp == 0.0 for lp, m in zip(trace.logprobs, trace.env_mask) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(trace.logprobs, trace.env_mask) if m == 1)


def test_sampled_logprobs_match_the_models_own(chatty_batch, tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    engine, batch = chatty_batch
    trace = batch.traces[0]
    ids = torch.tensor([trace.prompt_ids + trace.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(trace.prompt_ids) - 1:-1]
    own = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(trace.completion_ids)[:, None])[:, 0]
    mask = torch.tensor(trace.env_mask, dtype=torch.bool)
    assert torch.allclose(own[mask], torch.tensor(trace.logprobs)[mask], atol=1e-4)


class EndlessEnv(Environment):
    max_turns = 50

    def build_dataset(self, tokenizer):
        return [{"prompt": "Talk to me."}]

    def step(self, episode, completion):
        return "Go on. " * 5

    def score_episode(self, episode):
        return 1.0


def test_completion_budget_truncates_and_is_never_exceeded(tiny_model_and_tokenizer):
    torch.manual_seed(1)
    engine = make_engine(tiny_model_and_tokenizer, EndlessEnv(), max_new_tokens=16, max_completion_length=60)
    with engine:
        batch = engine.run([{"prompt": "Talk to me."}] * 8)
    for episode, trace in zip(batch.episodes, batch.traces):
        assert episode.truncated and episode.done
        assert len(trace.completion_ids) <= 60
        assert episode.score == 1.0  # scored as it stands


def test_turn_token_limit_ends_the_episode_as_truncated(tiny_model_and_tokenizer):
    torch.manual_seed(2)
    engine = make_engine(tiny_model_and_tokenizer, EndlessEnv(), max_new_tokens=2, max_completion_length=512)
    with engine:
        batch = engine.run([{"prompt": "Talk to me."}] * 8)
    cut = [ep for ep, tr in zip(batch.episodes, batch.traces) if tr.completion_ids[-1] != engine.tokenizer.eos_token_id]
    assert cut, "with 2 tokens per turn some turns must hit the limit"
    assert all(ep.truncated for ep in cut)
    assert all(sum(tr.env_mask[-2:]) == 2 for tr, ep in zip(batch.traces, batch.episodes) if ep in cut)


def test_one_generate_call_per_turn_for_the_whole_batch(tiny_model_and_tokenizer):
    torch.manual_seed(3)
    engine = make_engine(tiny_model_and_tokenizer, EndlessEnv(), max_new_tokens=8, max_completion_length=4096)
    engine.runner.max_turns = 3
    with engine:
        batch = engine.run([{"prompt": "Talk to me."}] * 16)
    assert batch.generate_calls == max(ep.turns for ep in batch.episodes) <= 3


def test_greedy_sampling_is_deterministic(tiny_model_and_tokenizer):
    engine = make_engine(tiny_model_and_tokenizer, EndlessEnv(), max_new_tokens=8, sampling=SamplingParams(temperature=0))
    with engine:
        first = engine.run([{"prompt": "Talk to me."}] * 2)
        second = engine.run([{"prompt": "Talk to me."}] * 2)
    assert first.traces[0].completion_ids == first.traces[1].completion_ids == second.traces[0].completion_ids
