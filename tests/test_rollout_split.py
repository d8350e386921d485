"""The training rollout's roles kept apart: the run's metrics sink (runlog/step_metrics.py) that the
rollout, weight sync and step timing write into and the trainer's log drains; step timing and memory
peaks as a callback (runlog/step_timing.py); the engine, weight sync and async rollout built with the
trainer (training/rollout/parts.py), not on the first rollout."""

from __future__ import annotations

import contextlib
import math

import pytest

from aitrain_grpo.runlog.step_metrics import StepMetrics
from aitrain_grpo.runlog.step_timing import StepTiming
from aitrain_grpo.training.rollout.parts import RolloutParts
from aitrain_grpo.training.step.phases import PhaseClock


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeMemory:
    """The process's resident memory as runlog/memory.py reads it, scripted: `use(gb)` is the resident
    size now; the high-water mark follows it up and `reset_peak` brings it down to the size now (Linux's
    VmHWM and clear_refs)."""

    def __init__(self):
        self.now = self.high = 0.5

    def use(self, gb: float) -> None:
        self.now = gb
        self.high = max(self.high, gb)

    def peak_rss_bytes(self) -> int:
        return int(self.high * 2**30)

    def reset_peak(self) -> bool:
        self.high = self.now
        return True


def one_step(timing: StepTiming, t: FakeTime, rollout_s: float, memory: FakeMemory | None = None,
             gb: tuple[float, float, float] = (1, 1, 1)) -> None:
    """A step as the trainer drives it: transformers' events, the rollout inside TRL's scoring; `memory`
    (where given) peaks at `gb` in the rollout, the loss and the optimizer step, then falls back."""
    use = memory.use if memory is not None else (lambda _: None)
    timing.on_step_begin(None, None, None)
    t.now += 1  # TRL's scoring before the rollout
    with timing.phase("rollout"):
        t.now += rollout_s
        use(gb[0])
        use(0.5)
        timing.mark("rollout")
    timing.clock.base("loss_forward_backward")  # the trainer's first compute_loss
    t.now += 4
    use(gb[1])
    use(0.5)
    timing.on_pre_optimizer_step(None, None, None)
    t.now += 0.5
    use(gb[2])
    use(0.5)
    timing.on_step_end(None, None, None)


def test_step_timing_writes_each_step_s_phases_and_peaks_into_the_sink_which_averages_them_at_the_log(monkeypatch):
    import aitrain_grpo.runlog.memory as memory_module

    memory = FakeMemory()
    monkeypatch.setattr(memory_module, "peak_rss_bytes", memory.peak_rss_bytes)
    monkeypatch.setattr(memory_module, "reset_peak", memory.reset_peak)
    monkeypatch.setattr(memory_module, "_cuda", lambda: None)  # the same keys on a GPU machine
    t = FakeTime()
    sink = StepMetrics()
    timing = StepTiming(sink, PhaseClock(t))
    one_step(timing, t, rollout_s=10, memory=memory, gb=(3, 5, 2))
    one_step(timing, t, rollout_s=20, memory=memory, gb=(1, 7, 4))
    logged = sink.drain()
    assert {k: v for k, v in logged.items() if k.startswith("time/")} == {
        "time/rollout_s": 15, "time/score_s": 1, "time/ref_logprobs_s": 0, "time/loss_forward_backward_s": 4,
        "time/optimizer_step_s": 0.5, "time/eval_s": 0, "time/step_s": 20.5}
    # Each phase's own peak (the mark after the rollout resets the high-water mark, so the loss's 5 is not
    # the rollout's), each step's afresh (step 2's rollout peaked at 1, not step 1's 3), averaged at the log.
    assert {k: v for k, v in logged.items() if k.startswith("memory/")} == {
        "memory/rollout_peak_rss_gb": 2, "memory/loss_peak_rss_gb": 6, "memory/optimizer_peak_rss_gb": 3,
        "memory/peak_rss_gb": 6}
    assert sink.drain() == {}  # drained: the next log starts afresh


def test_outside_a_step_the_timing_callback_writes_nothing():
    sink = StepMetrics()
    timing = StepTiming(sink, PhaseClock(FakeTime()))
    with timing.phase("rollout"):  # an evaluation rollout, between steps
        pass
    assert sink.drain() == {}


def test_the_sink_leaves_nan_out_of_an_average_and_logs_none_where_every_value_was_nan():
    sink = StepMetrics()
    sink.update({"env/score": 1.0, "env/empty": math.nan})
    sink.update({"env/score": math.nan, "env/empty": math.nan})
    sink.update({"env/score": 3.0})
    assert sink.drain() == {"env/score": 2.0, "env/empty": None}


class FakeEngine:
    def __init__(self):
        self.backend = object()
        self.closed = False

    def close(self):
        self.closed = True


class FakeSync:
    def __init__(self, seconds):
        self.seconds = list(seconds)
        self.paused_at_sync: list[bool] = []
        self.backend = None

    def maybe_sync(self, trainer):
        if self.backend is not None:
            self.paused_at_sync.append(self.backend.is_paused)
        return self.seconds.pop(0)


class PausingBackend:
    is_paused = False

    @contextlib.contextmanager
    def paused(self):
        self.is_paused = True
        try:
            yield
        finally:
            self.is_paused = False


class FakeAsync:
    def __init__(self):
        self.backend = PausingBackend()
        self.closed = False

    def close(self):
        self.closed = True


def test_weight_sync_writes_its_seconds_into_the_sink_only_when_it_synced():
    sink = StepMetrics()
    parts = RolloutParts(FakeEngine(), sink=sink, weight_sync=FakeSync([0.25, None, 0.75]))
    for _ in range(3):
        parts.sync_weights(trainer=None)
    assert sink.drain() == {"vllm/sync_seconds": 0.5}
    RolloutParts(FakeEngine(), sink=sink).sync_weights(trainer=None)  # nothing to sync: nothing written
    assert sink.drain() == {}


def test_with_steps_played_ahead_weights_change_only_while_requests_are_paused_and_close_ends_everything():
    sync, played_ahead, engine = FakeSync([0.1]), FakeAsync(), FakeEngine()
    sync.backend = played_ahead.backend
    parts = RolloutParts(engine, sink=StepMetrics(), weight_sync=sync, async_rollout=played_ahead)
    parts.sync_weights(trainer=None)
    assert sync.paused_at_sync == [True]
    parts.close()
    assert played_ahead.closed and engine.closed


def test_an_engine_put_in_by_hand_closes_the_one_it_replaces():
    built, own = FakeEngine(), FakeEngine()
    parts = RolloutParts(built, sink=StepMetrics())
    parts.replace_engine(own)
    assert built.closed and not own.closed and parts.engine is own


def test_a_rollout_without_an_engine_says_the_trainer_attaches_one():
    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.training.rollout.training_rollout import TrainingRollout

    rollout = TrainingRollout(object(), RunConfig())
    with pytest.raises(RuntimeError, match="the trainer attaches one when it is built"):
        rollout.play([{"task": 0}], trainer=None)
    assert rollout.timing.sink is rollout.metrics  # a rollout built alone still has one sink


def test_the_trainer_builds_the_engine_with_itself_and_owns_one_sink(tmp_path):
    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.training.rollout.training_rollout import TrainingRollout
    from aitrain_grpo.training.trainer import build_trainer
    from envs.letters import LetterEnv

    config = RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(tmp_path / "run"),
                       max_steps=1, rl_max_new_tokens=8)
    trainer = build_trainer(config, env=LetterEnv(num_tasks=8))
    try:
        assert trainer.rollout.engine is trainer.rollout_parts.engine is not None  # before any rollout
        assert trainer.rollout.engine.max_new_tokens == 8
        sink = trainer.run.metrics
        assert sink is trainer.rollout.metrics is trainer.rollout_parts.sink is trainer.run.timing.sink
        callbacks = trainer.callback_handler.callbacks
        assert not any(isinstance(c, TrainingRollout) for c in callbacks)
        ours = [c for c in callbacks if type(c).__module__.startswith("aitrain_grpo.")]
        assert ours[0] is trainer.run.timing  # first: a step's edges are measured before the others' work
        sink.update({"env/score": 0.5})
        trainer.model.train()
        logs: dict[str, float] = {}
        trainer.log(logs)
        assert logs["env/score"] == 0.5 and sink.drain() == {}
    finally:
        trainer.rollout_parts.close()
