"""The training rollout: what TRL calls for each generation batch, as one object whose state is in view.

`TrainingRollout` is GRPOTrainer's `rollout_func` (TRL calls it with the batch's prompts and the
trainer). It owns:
- the `RolloutEngine`, built on the first call (it needs the trainer's model), and, for a vLLM server
  synchronised through a folder, the weight sync; with `--rl-async-steps`, the `AsyncRollout` that
  plays the next steps' episodes while a step trains (async_rollout.py);
- the dataset rows of the batch about to be played: TRL hands `rollout_func` only the prompts, but an
  episode needs its whole row, so `EpisodeGRPOTrainer` passes the rows in (`take_rows`) just before;
- its observers, called with every batch's `EpisodeSummary`s from all processes (the error-rate stop);
- the last batch it played (`last_batch`, this process's episodes; the episode log reads it);
- the metrics of the steps since the last log (`StepMetrics`): `env/*` from the episodes, `time/*`,
  `vllm/sync_seconds`, and a server pool's `vllm/<host:port>/*` and totals (requests, tokens, sync
  seconds, live servers, replayed episodes); `EpisodeGRPOTrainer.log` merges them into each log record.

It is also a trainer callback, to see where each optimizer step begins and ends, and owns the step's
`PhaseClock` (step_phases.py), which the rollout and the trainer (trainer.py) advance: the step's
metrics get `time/<phase>_s` for the rollout, TRL's scoring, the reference log-probabilities, the
loss forward and backward and the optimizer step, adding up to `time/step_s`. Besides: `time/generate_s`
and `time/env_s` (wall time while a generate / environment call was under way: in lockstep, hf's
schedule, parts of the rollout; under the continuous schedule they overlap; with --rl-async-steps they
were mostly spent while earlier steps trained), and `time/tokens_per_s` (tokens the model generated per
second of generation); and `memory/peak_rss_gb`, the process's peak resident memory during the step,
split into `memory/rollout_peak_rss_gb`, `memory/loss_peak_rss_gb` (reference log-probabilities,
forward and backward) and `memory/optimizer_peak_rss_gb` (runlog/memory.py).

Left out: building the trainer (trainer.py), choosing and building the backend (generation.py), the
files a run writes (runlog/), and metrics of TRL's evaluation loop (no run configures one).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections import defaultdict
from typing import Any, Callable, Iterable

from accelerate.utils import gather_object
from transformers import TrainerCallback

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.backends.base import SamplingParams
from aitrain_grpo.engine.rollout import RolloutBatch, RolloutEngine
from aitrain_grpo.engine.stats import EpisodeSummary, episode_stats
from aitrain_grpo.env.base import Environment, needs_policy
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.models.loading import stop_token_ids
from aitrain_grpo.runlog.memory import StepPeaks
from aitrain_grpo.training.generation import GenerationPlan, make_backend
from aitrain_grpo.training.async_rollout import AsyncRollout, start_async_rollout, versioned
from aitrain_grpo.training.groups import play_groups
from aitrain_grpo.training.step_phases import PhaseClock
from aitrain_grpo.training.turn_credit import rollout_turn_advantages

SummaryObserver = Callable[[list[EpisodeSummary]], None]


class StepMetrics:
    """Values recorded since the last log, each key averaged when logged (NaN left out), the way TRL
    averages its own metrics over the steps between two logs."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = defaultdict(list)

    def update(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._values[key].append(float(value))

    def drain(self) -> dict[str, float | None]:
        """The averages since the last drain; starts afresh."""
        averages: dict[str, float | None] = {}
        for key, values in self._values.items():
            valid = [v for v in values if not math.isnan(v)]
            averages[key] = sum(valid) / len(valid) if valid else None
        self._values.clear()
        return averages


def rollout_timing(batch: RolloutBatch) -> dict[str, float]:
    """Where one rollout's time went, and how fast the model generated (the rollout's own wall time is
    the step clock's `time/rollout_s`)."""
    generated = sum(sum(trace.env_mask) for trace in batch.traces)
    return {
        "time/generate_s": batch.generate_seconds,
        "time/env_s": batch.env_seconds,
        "time/tokens_per_s": generated / batch.generate_seconds if batch.generate_seconds > 0 else 0.0,
    }


class TrainingRollout(TrainerCallback):
    """GRPOTrainer's `rollout_func`; see the module docstring."""

    def __init__(self, env: Environment, config: RunConfig, generation: GenerationPlan,
                 observers: Iterable[SummaryObserver] = ()):
        if needs_policy(env) and config.rl_async_steps:
            # Its score_episode uses the live model, which would be training in another thread meanwhile.
            raise ConfigError(f"{type(env).__name__} scores with the policy model (needs_policy), which "
                              f"--rl-async-steps trains while episodes are scored; use --rl-async-steps 0")
        self.env = env
        self.config = config
        self.generation = generation
        self.observers: list[SummaryObserver] = list(observers)
        # Built on the first call; a test may put its own engine here before training starts.
        self.engine: RolloutEngine | None = None
        self.weight_sync = None  # training.weight_sync.FolderWeightSync for a server synced through a folder
        self.metrics = StepMetrics()
        self.last_batch: RolloutBatch | None = None
        self.last_weight_versions: list[int] | None = None  # per episode of last_batch (async runs only)
        self.async_rollout: AsyncRollout | None = None  # --rl-async-steps >= 1: plays steps ahead
        self.clock = PhaseClock()  # the step's time per phase (step_phases.py)
        self._rows: list[dict[str, Any]] | None = None
        self._peaks = StepPeaks()

    # --------------------------------------------------------------------------------- the rollout

    def take_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        """The dataset rows of the batch whose prompts come next (in the same order)."""
        self._rows = [dict(row) for row in rows]

    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        with self.clock.phase("rollout"):
            return self._play(prompts, trainer)

    def _play(self, prompts: list, trainer) -> dict[str, Any]:
        rows, self._rows = self._rows, None
        if rows is None or len(rows) != len(prompts):
            got = "no" if rows is None else len(rows)
            raise RuntimeError(f"rollout got {len(prompts)} prompts but {got} dataset rows; "
                               f"the trainer must hand the batch's rows to take_rows first")
        engine = self.engine or self._start(trainer)
        if needs_policy(self.env):  # e.g. an AITraining-style score_episode: the policy as it is now
            self.env.use_policy(trainer.accelerator.unwrap_model(trainer.model), trainer.processing_class)
        if self.async_rollout is not None:  # --rl-async-steps: episodes played ahead (async_rollout.py)
            grouped, step_metrics = self.async_rollout.rollout(rows, trainer, training=trainer.model.training)
        else:
            self.sync_weights(trainer)
            grouped = play_groups(engine.run, rows, trainer, self.config)  # --rl-zero-std-groups
            step_metrics = grouped.metrics
        batch = grouped.batch
        self.last_weight_versions = grouped.weight_versions
        self.metrics.update(step_metrics)
        summaries = batch.summaries()
        if trainer.accelerator.num_processes > 1:
            summaries = gather_object(summaries)
        self.metrics.update(episode_stats(summaries).env_metrics())
        self.metrics.update({f"agent/{name}": value for name, value in batch.agent_counts.items()})
        self.metrics.update(self._server_metrics(batch))
        for observe in self.observers:
            observe(summaries)
        self.last_batch = batch
        self._peaks.mark("rollout")
        self.metrics.update(rollout_timing(batch))
        out = grouped.for_trl()
        if self.config.rl_advantage == "turn":  # per-token turn credit, an extra field (turn_credit.py)
            out["turn_advantages"] = rollout_turn_advantages(batch.episodes, batch.traces, trainer.num_generations)
        return out

    def _start(self, trainer) -> RolloutEngine:
        config = self.config
        stop_ids = stop_token_ids(trainer.model, trainer.processing_class)
        backend, self.weight_sync = make_backend(trainer, config, self.generation, stop_ids)
        tokenizer = trainer.processing_class
        if config.rl_async_steps:
            backend = versioned(backend)
            # The worker thread tokenizes while TRL decodes; a fast tokenizer is not safe to share.
            tokenizer = copy.deepcopy(tokenizer)
        self.engine = RolloutEngine(
            self.env,
            tokenizer,
            backend,
            max_new_tokens=config.rl_max_new_tokens,
            max_turns=config.rl_max_turns,
            max_completion_length=config.rl_max_completion_length,
            sampling=SamplingParams(config.rl_temperature, config.rl_top_k, config.rl_top_p),
            env_timeout=config.rl_env_timeout,
            cut_turn=config.rl_cut_turn,
            schedule=config.rl_rollout_schedule,
            tool_parser=config.rl_tool_parser,
            model_name=config.model,  # the name an agent environment's requests must use (client.model)
            agent_address=(config.agent_host, config.agent_port),
        )
        if config.rl_async_steps:
            self.async_rollout = start_async_rollout(self.engine, backend, self.weight_sync, trainer, config)
        return self.engine

    def sync_weights(self, trainer) -> None:
        """Bring a folder-synced vLLM server up to the trainer's weights, if they changed."""
        if self.weight_sync is None:
            return
        # Played-ahead episodes: no request may be in flight while the server's weights change.
        with self.async_rollout.backend.paused() if self.async_rollout is not None else contextlib.nullcontext():
            seconds = self.weight_sync.maybe_sync(trainer)
        if seconds is not None:
            self.metrics.update({"vllm/sync_seconds": seconds})

    def _server_metrics(self, batch: RolloutBatch) -> dict[str, float]:
        """`vllm/*` of a server pool (engine/backends/server_pool.py): per server and in total, and the
        episodes replayed because their server was lost."""
        take = getattr(self.engine.backend, "take_metrics", None)
        if take is None:
            return {}
        return {**take(), "vllm/replayed_episodes": float(batch.replayed_episodes)}

    def close(self) -> None:
        if self.async_rollout is not None:
            self.async_rollout.close()
        if self.engine is not None:
            self.engine.close()
            getattr(self.engine.backend, "close", lambda: None)()

    # ------------------------------------------------------------------------ step boundaries

    def on_step_begin(self, args, state, control, **kwargs):
        self._peaks.start()  # this step's own peaks (runlog/memory.py)
        self.clock.start("score")  # TRL's batch preparation, until the first compute_loss (trainer.py)

    def on_step_end(self, args, state, control, **kwargs):
        self._peaks.mark("optimizer")
        self.metrics.update({**self.clock.stop(), **self._peaks.metrics()})

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._peaks.mark("loss")  # every micro-batch's forward and backward are done
        self.clock.base("optimizer_step")
