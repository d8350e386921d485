"""What plays a run's episodes, built once when the trainer is built (`build_rollout_parts`), not on
the first rollout: the engine, what keeps its weights current, and the steps played ahead.

- the `RolloutEngine` over the backend of the run's plan (rollout/generation.py's `make_backend`). It is built
  with the trainer rather than before it because the backend needs what TRL's `__init__` makes: the
  model it wraps (hf) or TRL's own vLLM engine (colocate);
- the weight sync, where this package moves the weights (a server synced through a folder, colocated
  vLLM with lora/disk: rollout/weight_sync.py): `sync_weights` brings the generator up to the trainer's weights
  if they changed, and writes `vllm/sync_seconds` into the run's metrics sink;
- with --rl-async-steps, the `AsyncRollout` (rollout/async_steps.py) that plays the next steps' episodes while
  a step trains, on a versioned backend and a copy of the tokenizer (a fast tokenizer is not safe to
  share with the thread where TRL decodes).

Between steps the held-back evaluation (evaluation/held_back.py) plays on the same engine
(`evaluation_backend`): the weights are brought up to the trainer's by the same `sync_weights` a rollout
calls, which syncs only when the optimizer has stepped since the last sync (each sync records the step
it synced), so the next rollout, on the same weights, does not sync again. Where the engine cannot play
the weights of the moment between steps it says so (None) and the evaluation plays Hugging Face
generate on the trainer's model: with --rl-async-steps the server's weights belong to the steps played
ahead (each episode's weight version is recorded from them); and a colocated engine sharded over a
tensor-parallel group generates a whole group's prompts together, which each process's own share of the
held-back tasks (different turns, different calls) would leave waiting on each other.

The engine's `on_episode_done` (engine/rollout.py) is the rollout's episode hook (`set_episode_hook`:
a judge over HTTP, training/rewards/judge.py), kept when a test replaces the engine; the async worker plays on
the same engine, so played-ahead episodes call it too.

Building sends no request and starts no thread (the async worker's thread starts with its first
step), so a trainer built and never trained leaves nothing running; `close()` ends what ran.

Left out: playing a batch (rollout/training_rollout.py), choosing the backend and the sync method (rollout/generation.py),
and when a step syncs (the rollout, before playing; the held-back evaluation, at the end of a step it falls
on; `train()`, after the last step).
"""

from __future__ import annotations

import contextlib
import copy

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.env.base import Environment
from aitrain_grpo.models.loading import stop_token_ids
from aitrain_grpo.runlog.step_metrics import StepMetrics
from aitrain_grpo.training.rollout.async_steps import AsyncRollout, start_async_rollout, versioned
from aitrain_grpo.training.rollout.generation import GenerationPlan, make_backend
from aitrain_grpo.training.run.signals import uninterrupted


class RolloutParts:
    """A run's engine, weight sync (or None) and async rollout (or None); see the module docstring."""

    def __init__(self, engine: RolloutEngine, *, sink: StepMetrics, weight_sync=None,
                 async_rollout: AsyncRollout | None = None, trainer=None):
        self.engine = engine
        self.sink = sink
        self.weight_sync = weight_sync  # training.weight_sync's FolderWeightSync or ColocateWeightSync
        self.async_rollout = async_rollout
        self.episode_hook = None
        self.trainer = trainer  # whose weights `evaluation_backend` syncs between steps (None: it cannot)

    def set_episode_hook(self, hook) -> None:
        """Call `hook(batch, index)` as each episode is scored (None: nothing)."""
        self.episode_hook = self.engine.on_episode_done = hook

    def replace_engine(self, engine: RolloutEngine) -> None:
        """Play with `engine` from now on (a test's own backend); the one it replaces is closed."""
        if engine is not self.engine:
            self.engine.close()
        self.engine = engine
        engine.on_episode_done = self.episode_hook

    def sync_weights(self, trainer) -> None:
        """Bring the generator up to the trainer's weights, if they changed (nothing without a sync)."""
        if self.weight_sync is None:
            return
        # Played-ahead episodes: no request may be in flight while the server's weights change.
        with self.async_rollout.backend.paused() if self.async_rollout is not None else contextlib.nullcontext():
            with uninterrupted():  # a signal waits: a server's weights are never left half-synced (run/signals.py)
                seconds = self.weight_sync.maybe_sync(trainer)
        if seconds is not None:
            self.sink.update({"vllm/sync_seconds": seconds})

    def evaluation_backend(self):
        """The engine's backend playing the trainer's weights as they are now, synced first where a sync
        moves them (a no-op when they have not changed since the last sync); None where the engine cannot
        play them between steps (module docstring)."""
        if self.weight_sync is None:
            return self.engine.backend  # Hugging Face generate: the trainer's model itself
        if self.trainer is None or self.async_rollout is not None or getattr(self.engine.backend, "tp_size", 1) > 1:
            return None
        self.sync_weights(self.trainer)
        return self.engine.backend

    def close(self) -> None:
        if self.async_rollout is not None:
            self.async_rollout.close()
        self.engine.close()
        getattr(self.engine.backend, "close", lambda: None)()


def build_rollout_parts(trainer, env: Environment, config: RunConfig, generation: GenerationPlan,
                        sink: StepMetrics) -> RolloutParts:
    """The parts for `trainer`, once TRL's `__init__` has run (its model, tokenizer, sampler, vLLM)."""
    stop_ids = stop_token_ids(trainer.model, trainer.processing_class)
    backend, weight_sync = make_backend(trainer, config, generation, stop_ids)
    tokenizer = trainer.processing_class
    if config.rl_async_steps:
        backend = versioned(backend)
        # The worker thread tokenizes while TRL decodes; a fast tokenizer is not safe to share.
        tokenizer = copy.deepcopy(tokenizer)
    engine = RolloutEngine(env, tokenizer, backend, EpisodeSettings.from_options(config))
    async_rollout = None
    if config.rl_async_steps:
        try:  # refuses a run it cannot plan ahead (several processes, several generations a step)
            async_rollout = start_async_rollout(engine, backend, weight_sync, trainer, config)
        except BaseException:
            engine.close()
            raise
    return RolloutParts(engine, sink=sink, weight_sync=weight_sync, async_rollout=async_rollout, trainer=trainer)
