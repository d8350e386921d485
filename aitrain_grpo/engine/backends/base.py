"""The generation interface the rollout engine talks to.

A backend gets a batch of token-id prompts and returns, per prompt, the sampled token ids exactly as
the sampler produced them, their log-probabilities, and why sampling stopped. It never sees text, so
nothing is re-tokenized between turns.

Left out: choosing and building a backend (choice.py) and weight sync (training/rollout/weight_sync.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one model turn. `top_k=0`, `top_p=1.0` and `min_p=0.0` mean no truncation,
    `repetition_penalty=1.0` no penalty (it applies to greedy decoding too)."""

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0


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
    training then saves a checkpoint and exits non-zero with that message (see run/stopping.py)."""


class ReplayEpisode(GenerationBackendError):
    """The server an episode was played on was lost mid-episode (backends/server_pool.py): the engine
    plays that episode again from its start, so no episode is sampled partly by a server that is gone.
    A caller that cannot replay one episode replays its whole rollout (rollout.py); one that does not
    catch it stops the run like any `GenerationBackendError`."""


class GenerationBackend(Protocol):
    """What the engine needs of a backend. Subclass it to inherit the default `rollout_session`."""

    #: Token ids that end a model turn (sampling stops after one; it is kept in `Sample.token_ids`).
    stop_ids: list[int]

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams) -> list[Sample]:
        """Sample one continuation per prompt, at most `max_tokens` tokens each."""
        ...

    def rollout_session(self) -> ContextManager[None]:
        """Opened by the engine around one rollout, while the weights stay as they are: a backend may
        keep state from one turn to the next inside it (the hf backend: its key-value cache). The
        default keeps nothing."""
        return contextlib.nullcontext()


@runtime_checkable
class RequestBackend(GenerationBackend, Protocol):
    """A backend that also takes one episode's turn at a time, on the engine's event loop, and batches
    concurrent requests itself (a vLLM server, a colocated vLLM engine stepped in process). The engine's
    continuous schedule submits each episode's next turn as soon as its environment reply is ready."""

    async def generate_one(self, prompt: list[int], max_tokens: int, sampling: SamplingParams) -> Sample:
        """Sample one continuation of one prompt, at most `max_tokens` tokens."""
        ...
