"""The generation interface the rollout engine talks to.

A backend gets a batch of token-id prompts and returns, per prompt, the sampled token ids exactly as
the sampler produced them, their log-probabilities, and why sampling stopped. It never sees text, so
nothing is re-tokenized between turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one model turn. `top_k=0` and `top_p=1.0` mean no truncation."""

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0


@dataclass
class Sample:
    """One sampled model turn. `finish_reason` is "stop" when it ended with an end-of-turn token
    (included in `token_ids`) and "length" when it ran into its token limit."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


class GenerationBackendError(RuntimeError):
    """The generation backend is gone for good (for a server: it still fails after the client's bounded
    retries). Raise it from `generate` with a one-line message that names the server and what failed;
    training then saves a checkpoint and exits non-zero with that message (see stopping.py)."""


class GenerationBackend(Protocol):
    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams) -> list[Sample]:
        """Sample one continuation per prompt, at most `max_tokens` tokens each."""
        ...


@runtime_checkable
class RequestBackend(GenerationBackend, Protocol):
    """A backend that also takes one episode's turn at a time, on the engine's event loop, and batches
    concurrent requests itself (a vLLM server, a colocated vLLM engine stepped in process). The engine's
    continuous schedule submits each episode's next turn as soon as its environment reply is ready."""

    async def generate_one(self, prompt: list[int], max_tokens: int, sampling: SamplingParams) -> Sample:
        """Sample one continuation of one prompt, at most `max_tokens` tokens."""
        ...
