"""Continuous rollouts on a backend that only generates in batches (the hf backend, or any backend with
just `generate`): turns submitted one at a time are gathered into batched `generate` calls.

`TurnBatcher.submit` queues one episode's turn and waits for its sample. One driver task on the
engine's event loop takes every turn queued so far, in episode order (so the hf backend's key-value
cache, which continues the previous call's rows in order, matches as often as it can), and runs one
`generate` call for them in a worker thread, so that environment calls go on meanwhile; turns that
become ready during that call form the next one. Each call samples up to the largest limit asked for;
a longer sample is cut back to its own limit and marked "length", exactly as the lockstep schedule
cuts an episode whose completion budget is below the batch's limit.

Left out: a wait to let a batch fill up (a call starts as soon as the previous one ends), and
backends that batch by themselves (the vLLM ones take one request at a time: `RequestBackend`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aitrain_grpo.engine.backends.base import GenerationBackend, Sample, SamplingParams


@dataclass
class _QueuedTurn:
    """One episode's turn waiting for a batched `generate` call; `sample` resolves when it is sampled."""

    order: int
    prompt: list[int]
    max_tokens: int
    sample: asyncio.Future


class TurnBatcher:
    """Batches single turns for a `GenerationBackend`; lives on one event loop, for one sampling setting."""

    def __init__(self, backend: GenerationBackend, sampling: SamplingParams):
        self.backend = backend
        self.sampling = sampling
        self._queued: list[_QueuedTurn] = []
        self._driver: asyncio.Task | None = None
        self.calls = 0

    async def submit(self, order: int, prompt: list[int], max_tokens: int) -> Sample:
        loop = asyncio.get_running_loop()
        turn = _QueuedTurn(order, prompt, max_tokens, loop.create_future())
        self._queued.append(turn)
        if self._driver is None or self._driver.done():
            self._driver = loop.create_task(self._drive())
        return await turn.sample

    async def close(self) -> None:
        """Drop the queued turns and wait for the call under way (its thread cannot be stopped), so that
        nothing of this batcher runs on after the rollout it served."""
        self._queued.clear()
        if self._driver is not None:
            await asyncio.gather(self._driver, return_exceptions=True)

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0)  # turns submitted in the same pass of the loop join the first call
        while self._queued:
            batch, self._queued = sorted(self._queued, key=lambda t: t.order), []
            limit = max(t.max_tokens for t in batch)
            try:
                samples = await loop.run_in_executor(None, self.backend.generate, [t.prompt for t in batch], limit, self.sampling)
            except Exception as exc:
                for turn in batch + self._queued:
                    if not turn.sample.done():
                        turn.sample.set_exception(exc)
                self._queued = []
                return
            self.calls += 1
            for turn, sample in zip(batch, samples):
                if len(sample.token_ids) > turn.max_tokens:
                    sample = Sample(sample.token_ids[: turn.max_tokens], sample.logprobs[: turn.max_tokens], "length")
                if not turn.sample.done():
                    turn.sample.set_result(sample)
            await asyncio.sleep(0)  # let episodes whose turn finished submit their next one
