"""The training rollout: the first stage of the step (training/step/flow.py), the rollout side.

`TrainingRollout.play(rows, trainer)` plays one step's episodes from the batch's dataset rows (each
row is repeated once per episode of its group) and returns the `GroupedRollout` (rollout/groups.py): the
episodes, each one's token sequences, and which are out of the loss. The step turns that into typed
sequence records (step/records.py). It keeps only what playing needs:
- the last batch it played (`last_batch`, this process's episodes, and `last_weight_versions` with
  --rl-async-steps): what the extra reward functions and the episode log read (rewards/functions.py,
  runlog/files.py);
- its observers, called with every batch's `EpisodeSummary`s from all processes (the error-rate stop);
- what watches episodes as they finish (`watch_episodes`: a judge over HTTP starts its calls then),
  handed to the engine's `on_episode_done`.

What it plays with is built with the trainer and attached (`attach`): the engine, the weight sync and
the async rollout (rollout/parts.py). What it measures goes into the run's metrics sink, which the
trainer owns and its `log` drains (runlog/step_metrics.py): `env/*` from the episodes, `probe/*` (how
alike its best replies and the shortcut probes' are, rollout/probe_watch.py), `agent/*`,
--rl-zero-std-groups' and --rl-async-steps' counters, a server pool's `vllm/<host:port>/*` and totals
(requests, tokens, sync seconds, live servers, replayed episodes), and `time/generate_s` and
`time/env_s` (wall time while a generate / environment call was under way: in lockstep, hf's schedule,
parts of the rollout; under the continuous schedule they overlap; with --rl-async-steps they were mostly
spent while earlier steps trained) and `time/tokens_per_s` (tokens the model generated per second of
generation). Its own wall time is the step's `rollout` phase, and the peak memory up to its end the
step's `memory/rollout_peak_rss_gb`: both through the step timing callback (runlog/step_timing.py).

Left out: building the trainer (trainer.py), building the engine and its backend (rollout/parts.py,
rollout/generation.py), timing the rest of the step (step/phases.py), the files a run writes (runlog/), and
metrics of TRL's evaluation loop (no run configures one).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from accelerate.utils import gather_object

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.rollout import RolloutBatch, RolloutEngine
from aitrain_grpo.engine.stats import EpisodeSummary, episode_stats
from aitrain_grpo.env.base import Environment, needs_policy
from aitrain_grpo.training.preflight.run_checks import check_async_scoring
from aitrain_grpo.runlog.group_replies import group_reply_metrics, model_replies
from aitrain_grpo.runlog.step_metrics import StepMetrics
from aitrain_grpo.runlog.step_timing import StepTiming
from aitrain_grpo.training.rollout.groups import GroupedRollout, play_groups
from aitrain_grpo.training.rollout.parts import RolloutParts
from aitrain_grpo.training.rollout.probe_watch import ProbeWatch
from aitrain_grpo.training.step.records import sequences_of
from aitrain_grpo.training.step.phases import PhaseClock

SummaryObserver = Callable[[list[EpisodeSummary]], None]


def rollout_timing(batch: RolloutBatch) -> dict[str, float]:
    """Where one rollout's time went, and how fast the model generated (the rollout's own wall time is
    the step clock's `time/rollout_s`)."""
    generated = sum(sum(trace.env_mask) for sequences in sequences_of(batch.earlier, batch.traces)
                    for trace in sequences)
    return {
        "time/generate_s": batch.generate_seconds,
        "time/env_s": batch.env_seconds,
        "time/tokens_per_s": generated / batch.generate_seconds if batch.generate_seconds > 0 else 0.0,
    }


class TrainingRollout:
    """The step's rollout (step/flow.py); see the module docstring. `metrics` is the run's sink and `timing`
    the step timing callback (the trainer's; a rollout built alone gets its own)."""

    def __init__(self, env: Environment, config: RunConfig, *, metrics: StepMetrics | None = None,
                 timing: StepTiming | None = None, observers: Iterable[SummaryObserver] = ()):
        check_async_scoring(env, config.rl_async_steps)  # a Python caller's trainer, built without the CLI's checks
        self.env = env
        self.config = config
        self.metrics = metrics if metrics is not None else StepMetrics()
        self.timing = timing if timing is not None else StepTiming(self.metrics, PhaseClock())
        self.observers: list[SummaryObserver] = list(observers)
        self.parts: RolloutParts | None = None  # attached once the trainer is built
        self.last_batch: RolloutBatch | None = None
        self.last_weight_versions: list[int] | None = None  # per episode of last_batch (async runs only)
        self._episode_hook: Callable[[RolloutBatch, int], None] | None = None
        self._closers: list[Callable[[], None]] = []
        self.probe_watch = ProbeWatch(env, config.rl_tool_parser, config.rl_max_new_tokens)

    def attach(self, parts: RolloutParts) -> None:
        """Play with `parts` (built with the trainer: rollout/parts.py)."""
        self.parts = parts
        parts.set_episode_hook(self._episode_hook)

    def watch_episodes(self, hook: Callable[[RolloutBatch, int], None], on_close: Callable[[], None]) -> None:
        """Have the engine call `hook(batch, index)` as each episode is scored; `on_close` when the rollout closes."""
        self._episode_hook = hook
        self._closers.append(on_close)
        if self.parts is not None:
            self.parts.set_episode_hook(hook)

    @property
    def engine(self) -> RolloutEngine | None:
        return self.parts.engine if self.parts is not None else None

    @engine.setter
    def engine(self, engine: RolloutEngine) -> None:
        self.parts.replace_engine(engine)  # a test's own engine, put in before training starts

    def play(self, rows: list[dict[str, Any]], trainer) -> GroupedRollout:
        """Play one step's episodes of `rows` (the batch's dataset rows, each group's rows consecutive)
        with the attached parts, under `--rl-zero-std-groups`; record the rollout's metrics."""
        with self.timing.phase("rollout"):
            return self._play(rows, trainer)

    def _play(self, rows: list[dict[str, Any]], trainer) -> GroupedRollout:
        parts = self.parts
        if parts is None:
            raise RuntimeError("the rollout has no engine: the trainer attaches one when it is built")
        if needs_policy(self.env):  # e.g. an AITraining-style score_episode: the policy as it is now
            self.env.use_policy(trainer.accelerator.unwrap_model(trainer.model), trainer.processing_class)
        if parts.async_rollout is not None:  # --rl-async-steps: episodes played ahead (rollout/async_steps.py)
            grouped, step_metrics = parts.async_rollout.rollout(rows, trainer, training=trainer.model.training)
        else:
            parts.sync_weights(trainer)
            grouped = play_groups(parts.engine.run, rows, trainer, self.config)  # --rl-zero-std-groups
            step_metrics = grouped.metrics
        batch = grouped.batch
        self.last_weight_versions = grouped.weight_versions
        self.metrics.update(step_metrics)
        summaries = batch.summaries()
        if trainer.accelerator.num_processes > 1:
            summaries = gather_object(summaries)
        self.metrics.update(episode_stats(summaries).env_metrics())
        self.metrics.update(group_reply_metrics(model_replies(batch.traces), trainer.num_generations, batch.scores))
        self.metrics.update(self.probe_watch.metrics(batch.episodes, batch.scores, trainer.num_generations, rows,
                                                     trainer.processing_class))
        self.metrics.update({f"agent/{name}": value for name, value in batch.agent_counts.items()})
        self.metrics.update(self._server_metrics(batch))
        for observe in self.observers:
            observe(summaries)
        self.last_batch = batch
        self.timing.mark("rollout")
        self.metrics.update(rollout_timing(batch))
        return grouped

    def _server_metrics(self, batch: RolloutBatch) -> dict[str, float]:
        """`vllm/*` of a server pool (engine/backends/server_pool.py): per server and in total, and the
        episodes replayed because their server was lost."""
        take = getattr(self.parts.engine.backend, "take_metrics", None)
        if take is None:
            return {}
        return {**take(), "vllm/replayed_episodes": float(batch.replayed_episodes)}

    def close(self) -> None:
        """End what the attached parts started (the engine's event loop, the async worker, a server pool)."""
        if self.parts is not None:
            self.parts.close()
        for close in self._closers:
            close()
