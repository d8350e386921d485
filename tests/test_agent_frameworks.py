"""Agent code written on real frameworks trains unchanged through the run's endpoint.

One weather agent per framework (tests/envs_fixtures/agent_frameworks.py): the OpenAI Agents SDK (run plain
and streamed: `stream: true` requests), pydantic-ai and LangGraph, each as its documentation writes it, each
given only the client a rollout gets. What a user relies on: the framework's tool calls reach the policy and
the policy's tool calls come back as the framework's tool calls; the framework's requests extend one token
sequence (append-only history), so the episode trains as one sequence with the model's turns as sampled;
concurrent episodes never mix.

Three levels: the oracle at the text level (deterministic tool calls); the real tiny model (what its
random text does to each framework); and an expert backend, a generation backend that writes the
oracle's turns as tokens, which plays the framework's full tool loop through the token path the model
uses. No framework, openai client, transformers or TRL object is mocked.
"""

from __future__ import annotations

import contextlib
import re

import pytest

from helpers import require  # noqa: E402

require("openai", "pip install openai")

from aitrain_grpo.engine.backends.base import GenerationBackend, Sample  # noqa: E402
from aitrain_grpo.engine.backends.hf import HFBackend  # noqa: E402
from aitrain_grpo.engine.rollout import RolloutEngine  # noqa: E402
from aitrain_grpo.engine.settings import EpisodeSettings  # noqa: E402
from aitrain_grpo.engine.runner import oracle_policy, play  # noqa: E402
from helpers.rollouts import model_spans  # noqa: E402
from envs_fixtures.agent_frameworks import FRAMEWORKS, TEMPERATURES, answer_from, tool_call_text  # noqa: E402
from envs_fixtures.agents import WeatherAgent  # noqa: E402

NAMES = list(FRAMEWORKS)


def framework_env(name: str, episodes: int):
    module, env_class = FRAMEWORKS[name]
    pytest.importorskip(module)
    return env_class(episodes=episodes)


def run_engine(env, tokenizer, backend, *, max_new_tokens: int):
    engine = RolloutEngine(env, tokenizer, backend, EpisodeSettings(max_new_tokens=max_new_tokens, max_completion_length=384))
    with engine:
        return engine.run(env.build_dataset(tokenizer))


class ExpertBackend(GenerationBackend):
    """A generation backend whose 'sample' is the oracle's next turn, read off the prompt tokens: a tool
    call for the city asked about, then the number in the tool's result. The framework's whole tool loop
    then runs through the model's token path (token extension, the policy's tool calls parsed from
    sampled text), deterministically."""

    def __init__(self, tokenizer):
        self.tokenizer, self.stop_ids, self.prompts = tokenizer, [tokenizer.eos_token_id], []

    def generate(self, prompts, max_tokens, sampling):
        samples = []
        for prompt in prompts:
            self.prompts.append(prompt)
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            city = re.findall(r"What is the temperature in (\w+)\?", text)[-1]
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.DOTALL)
            turn = answer_from(results[-1], city) if results else tool_call_text(city)
            ids = self.tokenizer.encode(turn, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            samples.append(Sample(ids[:max_tokens], [-0.5] * len(ids[:max_tokens]), "stop"))
        return samples

    def rollout_session(self):
        return contextlib.nullcontext()


# ------------------------------------------------------------------------------------------- text level


@pytest.mark.parametrize("name", NAMES)
def test_framework_agent_with_the_oracle_calls_its_tool_and_scores(name):
    env = framework_env(name, episodes=4)
    episodes = play(env, env.build_dataset(None), oracle_policy(env))
    for episode in episodes:
        city, number = episode.row["city"], str(TEMPERATURES[episode.row["city"]])
        assert episode.error is None, episode.error
        assert episode.score == 1.0 and episode.metrics["looked_up"] == 1.0
        assert episode.tool_call_forms[0] == "hermes" and episode.turns == 2
        roles = [m["role"] for m in episode.messages]
        assert roles == ["system", "user", "assistant", "tool", "assistant"], roles
        assert f"Episode {episode.row['id']}." in episode.messages[0]["content"]
        assert '"get_temperature"' in episode.messages[2]["content"] and city in episode.messages[2]["content"]
        tool = episode.messages[3]
        assert tool["name"] == "get_temperature" and re.search(rf"celsius\W*{number}\b", tool["content"])
        assert number in episode.messages[4]["content"]


# ------------------------------------------------------------------------------------------- model level


@pytest.mark.parametrize("name", NAMES)
def test_framework_agent_plays_the_tiny_model(name, tiny_model_and_tokenizer):
    """The real model's text, whatever it is, reaches the framework and the episode trains: model tokens
    in every trace, no errors, the framework's requests extend one sequence."""
    model, tokenizer = tiny_model_and_tokenizer
    env = framework_env(name, episodes=4)
    batch = run_engine(env, tokenizer, HFBackend.for_model(model, tokenizer), max_new_tokens=24)
    for episode, trace in zip(batch.episodes, batch.traces):
        # The one error a framework may raise here is its own refusal of the model's text: the Agents SDK
        # on a complete call to a tool it lacks (see the unknown-tool test below).
        rejected = UNKNOWN_TOOL[name] == "raises" and "ModelBehaviorError" in (episode.error or "")
        assert episode.error is None or rejected, episode.error
        assert episode.turns >= 1 and sum(trace.env_mask) > 0
        assert len(trace.completion_ids) == len(trace.env_mask) == len(trace.logprobs)
        assert f"Episode {episode.row['id']}." in episode.messages[0]["content"]
    counts = batch.agent_counts
    assert counts["requests"] >= 4 and counts["history_rewrites"] == 0 and counts["earlier_segment_tokens"] == 0


@pytest.mark.parametrize("name", NAMES)
def test_framework_tool_loop_is_one_append_only_sequence(name, tiny_model_and_tokenizer):
    """The framework's second request (its history, our tool call in its own shape, the tool result)
    extends the first: one training sequence holding both model turns exactly as sampled, and the tool
    result between them as environment tokens."""
    _, tokenizer = tiny_model_and_tokenizer
    env = framework_env(name, episodes=3)
    backend = ExpertBackend(tokenizer)
    batch = run_engine(env, tokenizer, backend, max_new_tokens=64)
    counts = batch.agent_counts
    assert counts["requests"] == 6 and counts["history_rewrites"] == 0 and counts["earlier_segment_tokens"] == 0
    for episode, trace in zip(batch.episodes, batch.traces):
        city, number = episode.row["city"], str(TEMPERATURES[episode.row["city"]])
        assert episode.error is None, episode.error
        assert episode.score == 1.0 and episode.metrics["looked_up"] == 1.0 and episode.turns == 2
        call, answer = model_spans(trace)  # two model turns in one sequence
        assert call == tokenizer.encode(tool_call_text(city), add_special_tokens=False) + [tokenizer.eos_token_id]
        assert answer[:-1] == tokenizer.encode(answer_from(f"celsius {number}", city), add_special_tokens=False)
        between = tokenizer.decode(trace.completion_ids[len(call):-len(answer)])
        assert "<tool_response>" in between and re.search(rf"celsius\W*{number}\b", between)
        # The second turn was drawn from the first turn's tokens, extended: nothing re-rendered.
        assert trace.prompt_ids + trace.completion_ids[:-len(answer)] in backend.prompts


def test_sixteen_concurrent_openai_episodes_stay_apart(tiny_model_and_tokenizer):
    """16 episodes of plain openai code at once, batched into shared model turns: each episode's
    transcript and tokens are its own request's (its `Episode {id}` line, its city)."""
    model, tokenizer = tiny_model_and_tokenizer
    env = WeatherAgent(episodes=16)
    batch = run_engine(env, tokenizer, HFBackend.for_model(model, tokenizer), max_new_tokens=12)
    assert batch.agent_counts["requests"] >= 16
    for episode, trace in zip(batch.episodes, batch.traces):
        own, city = f"Episode {episode.row['id']}.", episode.row["city"]
        assert episode.error is None, episode.error
        assert own in episode.messages[0]["content"] and city in episode.messages[1]["content"]
        prompt = tokenizer.decode(trace.prompt_ids)
        assert own in prompt and f"temperature in {city}?" in prompt and sum(trace.env_mask) > 0
        others = {f"Episode {e.row['id']}." for e in batch.episodes} - {own}
        text = tokenizer.decode(trace.prompt_ids + trace.completion_ids)
        assert not any(other in text for other in others)


# What each framework does with a call to a tool it does not have (the tiny model writes such calls: it
# learned hotel tools): the framework's own rule, which the episode shows as it is.
UNKNOWN_TOOL = {
    "openai-agents": "raises",  # ModelBehaviorError ends the rollout: the episode scores 0 with the error
    "openai-agents-streamed": "raises",
    "pydantic-ai": "Unknown tool name: 'book_hotel'",  # a retry prompt, sent as the tool's result
    "langgraph": "book_hotel is not a valid tool",  # ToolNode's error message, sent as the tool's result
}


@pytest.mark.parametrize("name", NAMES)
def test_framework_answers_a_call_to_an_unknown_tool_its_own_way(name):
    env = framework_env(name, episodes=1)

    def policy(episode):
        if not any(m["role"] == "tool" for m in episode.messages) and episode.turns == 0:
            return '<tool_call>{"name": "book_hotel", "arguments": {"hotel_id": "h1"}}</tool_call>'
        return "I could not look it up."

    (episode,) = play(env, env.build_dataset(None), policy)
    assert episode.tool_call_forms[0] == "hermes" and episode.score == 0.0
    if UNKNOWN_TOOL[name] == "raises":
        assert episode.error is not None and "ModelBehaviorError" in episode.error and "book_hotel" in episode.error
        assert episode.turns == 1
    else:
        assert episode.error is None and episode.turns == 2
        tool = episode.messages[3]
        assert tool["role"] == "tool" and UNKNOWN_TOOL[name] in tool["content"]
