"""Agent environments: the episode is a program that calls a chat-completions API, not a `step` method.

Most agents worth training already exist as code that calls an OpenAI-compatible client in a loop (the
`openai` SDK, OpenAI Agents, LangGraph, pydantic-ai, a verifiers environment). An `AgentEnvironment`
trains that code unchanged: its `rollout(client, row)` plays one episode with `client`, an
`openai.AsyncOpenAI` whose base URL points at this run's own endpoint (engine/agent_endpoint.py), and
returns the episode's score. Every request the agent sends is answered by the policy being trained and
recorded token for token, so the episode trains exactly like one of an `Environment` with `step`.

    class Weather(AgentEnvironment):
        def build_dataset(self, tokenizer):
            return [{"prompt": "Weather in Oslo?", "city": "Oslo"}]

        async def rollout(self, client, row):
            reply = await client.chat.completions.create(model=client.model, messages=[...], tools=[...])
            ...
            return 1.0 if "Oslo" in reply.choices[0].message.content else 0.0

`client.model` is the name the endpoint serves (any other name is refused). `rollout` may return a
number in [0, 1] or an `AgentResult` with metrics beside the score. The dataset row's `prompt` is what
transcripts and checks show; the agent decides what it actually sends.

`solve(episode)`, optional, is an expert's reply to a request (`episode.messages` holds the request's
messages as the model would see them): `env check` plays it as the oracle, and `aitrain sft` learns from
its episodes.

Streamed requests (`stream: true`) are answered with the finished reply sent as stream events.

Left out: `n > 1`, and a timeout on the whole rollout (each generation is bounded by the run's token
budgets, and the agent's own code between two requests by `--rl-env-timeout`: engine/agent_rollout.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aitrain_grpo.env.base import Environment, Episode

# Where the engine keeps a finished rollout's score in `episode.state`, for `score_episode` to return.
AGENT_SCORE_KEY = "agent_score"


@dataclass
class AgentResult:
    """What a rollout may return instead of a bare score: the score, and numbers logged beside it as
    `env/<name>` (means over the step's episodes)."""

    score: float
    metrics: dict[str, float] = field(default_factory=dict)


class AgentEnvironment(Environment):
    """Base class for an environment written as agent code; see the module docstring.

    Required: `build_dataset(tokenizer)` and `async def rollout(self, client, row)`.
    `max_turns` caps the chat-completion requests of one episode: a request past the cap is answered
    with an empty reply whose `finish_reason` is "length", which ends a usual agent loop."""

    # How `aitrain grpo` and `env check` name this kind of environment (env/loading.describe_interface).
    interface = ("agent environment: rollout(client, row) plays each episode, its chat-completion requests "
                 "answered by the model through the run's OpenAI-compatible endpoint")

    async def rollout(self, client: Any, row: dict[str, Any]) -> float | AgentResult:
        """Play one episode through `client` and return its score in [0, 1] (or an `AgentResult`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement async def rollout(self, client, row)")

    def score_episode(self, episode: Episode) -> float:
        """The score `rollout` returned (the engine stores it before scoring)."""
        return episode.state[AGENT_SCORE_KEY]


def is_agent_environment(env: Any) -> bool:
    """Whether `env` plays its episodes through the endpoint (an `AgentEnvironment`, or an adapter that
    says so with `plays_through_endpoint = True`)."""
    return isinstance(env, AgentEnvironment) or bool(getattr(env, "plays_through_endpoint", False))


def split_result(value: Any) -> tuple[Any, dict[str, float]]:
    """A rollout's return value as (score, metrics); the score is checked by the caller."""
    if isinstance(value, AgentResult):
        return value.score, dict(value.metrics)
    return value, {}


__all__ = ["AgentEnvironment", "AgentResult", "AGENT_SCORE_KEY", "is_agent_environment", "split_result"]
