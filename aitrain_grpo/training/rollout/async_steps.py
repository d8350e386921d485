"""Generation overlapped with training: `--rl-async-steps N` (N >= 1, vLLM server mode only).

On-policy GRPO alternates: the server idles while the trainer computes a step, the trainer idles while
the server plays the next batch. Here a worker thread plays the episodes of steps k+1..k+N while step k
trains, so the server and the trainer work at the same time.

- Which prompts: TRL hands the rollout one step's prompts when that step begins, too late to play them
  ahead. `PromptPlan` reads the same sampler TRL's data loader reads (run/checkpoints.py makes its order a
  function of the seed and the epoch), so it knows the rows of any step in advance; a resumed run
  therefore plays the prompts an uninterrupted run would. With `--rl-curriculum pools` a step's batch is
  drawn when it is first asked for, from the groups recorded N + 1 steps before it (rollout/curriculum.py). Each step still checks that the planned rows
  are the rows TRL handed over; on a mismatch it plays TRL's rows on the spot (counted in
  `async/plan_misses`) rather than train on other prompts.
- Which weights: weights are synchronised to the server at the start of each step (rollout/weight_sync.py), as
  on-policy runs do, but between two generation requests: `VersionedBackend` holds new requests and
  waits for those in flight, so every request is sampled with one weight version, the number of
  optimizer steps behind it. The episodes of step k are submitted after the sync of step k - N and
  their version is the oldest any of their requests used, so `k - version` (the staleness) is at most N.
- The correction: the sampler's log-probabilities are the behaviour policy of TRL's importance-sampling
  correction, which the trainer keeps on in server mode (trainer.py); stale episodes are reweighted,
  and sequences whose ratio leaves TRL's bounds are masked. Logged: `async/staleness_mean` (all
  episodes of a step share a version), `async/wait_seconds` (time the trainer waited for episodes),
  `sampling/importance_sampling_ratio/*` and `sampling/is_masked_frac` (step/scoring.py).

Left out: several training processes (refused), `--vllm-sync nccl` (refused: TRL pushes NCCL weights
inside its own generation call, which this worker does not go through), and evaluation, which plays
on-policy after the steps already queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.training.rollout.groups import GroupedRollout
from aitrain_grpo.training.run.signals import uninterrupted
from aitrain_grpo.training.trl.access import train_sampler


def check_async_supported(config: RunConfig, sync_method: str | None) -> None:
    """`--rl-async-steps N >= 1` needs a generator apart from the trainer: a vLLM server synchronised
    through a folder. Raise a one-line `ConfigError` everywhere else."""
    if not config.rl_async_steps:
        return
    if not (config.use_vllm and config.vllm_mode == "server"):
        backend = "colocated vLLM" if config.use_vllm else "Hugging Face generate"
        raise ConfigError(
            f"--rl-async-steps {config.rl_async_steps} needs a separate generator, but {backend} shares the "
            f"trainer's model; add --use-vllm --vllm-mode server --vllm-server-url URL, or use --rl-async-steps 0"
        )
    if sync_method == "nccl":
        raise ConfigError(
            "--rl-async-steps with --vllm-sync nccl is not supported; use --vllm-sync lora (with --peft) or disk"
        )


class VersionedBackend:
    """Wraps a generation backend: counts requests in flight, tags each with the weight version it is
    sampled with, and can pause new requests while weights change (`paused()`)."""

    def __init__(self, backend):
        self.backend = backend
        self.stop_ids = getattr(backend, "stop_ids", None)
        self.version = 0
        self._state = threading.Condition()
        self._in_flight = 0
        self._paused = False
        self._seen: list[int] | None = None

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def _enter(self) -> int:
        with self._state:
            self._state.wait_for(lambda: not self._paused)
            return self._admit()

    def _admit(self) -> int:
        self._in_flight += 1
        if self._seen is not None:
            self._seen.append(self.version)
        return self.version

    def _leave(self) -> None:
        with self._state:
            self._in_flight -= 1
            self._state.notify_all()

    def generate(self, prompts, max_tokens, sampling, **episodes):
        self._enter()
        try:
            return self.backend.generate(prompts, max_tokens, sampling, **episodes)
        finally:
            self._leave()

    @contextlib.contextmanager
    def paused(self):
        """No request is in flight inside this block, and none starts."""
        with self._state:
            self._paused = True
            self._state.wait_for(lambda: self._in_flight == 0)
        try:
            yield
        finally:
            with self._state:
                self._paused = False
                self._state.notify_all()

    @contextlib.contextmanager
    def recording(self):
        """Collect the versions of the requests started inside this block (yields the list)."""
        seen: list[int] = []
        with self._state:
            self._seen = seen
        try:
            yield seen
        finally:
            with self._state:
                self._seen = None


class VersionedRequestBackend(VersionedBackend):
    """`VersionedBackend` for a backend that also takes one episode turn at a time (`generate_one`):
    waiting for a pause must not block the event loop the other requests complete on."""

    async def generate_one(self, prompt, max_tokens, sampling, **episode):
        while True:
            with self._state:
                if not self._paused:
                    self._admit()
                    break
            await asyncio.sleep(0.005)
        try:
            return await self.backend.generate_one(prompt, max_tokens, sampling, **episode)
        finally:
            self._leave()


def versioned(backend) -> VersionedBackend:
    return VersionedRequestBackend(backend) if hasattr(backend, "generate_one") else VersionedBackend(backend)


class PromptPlan:
    """The rows TRL's data loader hands the rollout at each step, computed ahead from its sampler."""

    def __init__(self, trainer):
        args = trainer.args
        if trainer.accelerator.num_processes > 1:
            raise ConfigError("--rl-async-steps supports one training process; launch without accelerate's multi-process, or use --rl-async-steps 0")
        if args.steps_per_generation != args.gradient_accumulation_steps or trainer.num_iterations != 1:
            raise ConfigError("--rl-async-steps needs one generation per optimizer step (TRL's steps_per_generation and num_iterations at their defaults)")
        self.dataset = trainer.train_dataset
        self.sampler = train_sampler(trainer, self.dataset)  # TRL's private API, pinned (trl/access.py)
        self.batch = args.per_device_train_batch_size * args.steps_per_generation
        self.repeat = trainer.num_iterations * args.steps_per_generation
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            if hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(epoch)
            order = list(iter(self.sampler))
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}  # steps ahead span two epochs at most
            self._orders[epoch] = order
        return self._orders[epoch]

    def rows(self, step: int) -> list[dict[str, Any]]:
        if hasattr(self.sampler, "step_indices"):  # --rl-curriculum pools: drawn now, from the state known now
            return [dict(self.dataset[i]) for i in self.sampler.step_indices(step)]
        per_epoch = max(len(self._order(0)) // (self.batch * self.repeat), 1)
        epoch, index = divmod(step, per_epoch)
        start = index * self.batch * self.repeat
        return [dict(self.dataset[i]) for i in self._order(epoch)[start:start + self.batch]]


@dataclass
class PlayedStep:
    """One step's episodes, played ahead: `weight_version` is the oldest weight version they used."""

    step: int
    grouped: GroupedRollout
    weight_version: int

    @property
    def staleness(self) -> int:
        return self.step - self.weight_version


class AsyncRollout:
    """Plays steps ahead on a worker thread. `play(rows, step)` plays one training step's rows (the
    zero-std policy included), `play_eval` an evaluation batch; `sync(trainer)` moves the trainer's
    weights to the server (or is None)."""

    def __init__(
        self,
        play: Callable[[list[dict[str, Any]], int], GroupedRollout],
        play_eval: Callable[[list[dict[str, Any]], int], GroupedRollout],
        plan: PromptPlan,
        backend: VersionedBackend,
        sync: Callable[[Any], float | None] | None,
        steps_ahead: int,
    ):
        self.play = play
        self.play_eval = play_eval
        self.plan = plan
        self.backend = backend
        self.sync = sync
        self.steps_ahead = steps_ahead
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aitrain-async-rollout")
        self.queued: dict[int, Future] = {}
        self.plan_misses = 0

    def _play_planned(self, step: int, rows: list[dict[str, Any]]) -> PlayedStep:
        with self.backend.recording() as seen:
            grouped = self.play(rows, step)
        version = min(seen) if seen else self.backend.version
        grouped.weight_versions = [version] * len(grouped.batch.episodes)
        return PlayedStep(step, grouped, version)

    def _queue(self, step: int, rows: list[dict[str, Any]] | None = None) -> None:
        if step not in self.queued:
            rows = self.plan.rows(step) if rows is None else rows
            self.queued[step] = self.worker.submit(self._play_planned, step, rows)

    def take(self, rows: list[dict[str, Any]], trainer) -> tuple[PlayedStep, dict[str, float]]:
        """Step `global_step`'s episodes (played ahead where possible), and this step's metrics."""
        step = trainer.state.global_step
        metrics: dict[str, float] = {}
        with self.backend.paused(), uninterrupted():  # a signal lets a weight sync finish (run/signals.py)
            seconds = self.sync(trainer) if self.sync is not None else None
            self.backend.version = step
        if seconds is not None:
            metrics["vllm/sync_seconds"] = seconds
        for old in [s for s in self.queued if s < step]:  # not expected; a step TRL skipped
            self.queued.pop(old).cancel()
        if self.plan.rows(step) != rows:
            self.plan_misses += 1
            for future in self.queued.values():
                future.cancel()
            self.queued.clear()
            self._queue(step, rows)
        last = step + self.steps_ahead
        if trainer.state.max_steps and trainer.state.max_steps > 0:
            last = min(last, trainer.state.max_steps - 1)
        for ahead in range(step, last + 1):
            self._queue(ahead)
        started = time.perf_counter()
        played = self.queued.pop(step).result()
        metrics.update({
            "async/wait_seconds": time.perf_counter() - started,
            "async/staleness_mean": float(played.staleness),
            "async/plan_misses": float(self.plan_misses),
        })
        return played, metrics

    def rollout(self, rows: list[dict[str, Any]], trainer, *, training: bool) -> tuple[GroupedRollout, dict[str, float]]:
        """The training rollout's entry point: a training step's episodes played ahead, or (evaluation)
        `rows` played now on the current weights, after whatever is queued."""
        if training:
            played, metrics = self.take(rows, trainer)
            return played.grouped, {**played.grouped.metrics, **metrics}
        with self.backend.paused(), uninterrupted():
            if self.sync is not None:
                self.sync(trainer)
            self.backend.version = trainer.state.global_step
        grouped = self.worker.submit(self.play_eval, rows, trainer.state.global_step).result()
        return grouped, grouped.metrics

    def close(self) -> None:
        for future in self.queued.values():
            future.cancel()
        self.queued.clear()
        self.worker.shutdown(wait=True)


def start_async_rollout(engine, backend: VersionedBackend, weight_sync, trainer, config: RunConfig) -> AsyncRollout:
    """The `AsyncRollout` of a run: its plan from the trainer's sampler, the zero-std policy per step."""
    from aitrain_grpo.training.rollout.groups import play_groups

    return AsyncRollout(
        lambda rows, step: play_groups(engine.run, rows, trainer, config, step=step, training=True),
        lambda rows, step: play_groups(engine.run, rows, trainer, config, step=step, training=False),
        PromptPlan(trainer),
        backend,
        weight_sync.maybe_sync if weight_sync is not None else None,
        config.rl_async_steps,
    )
