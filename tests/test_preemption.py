"""A signal mid-step (issue 39): the step in progress is dropped at once, the last finished step is saved,
and a resume plays the dropped step again exactly as a run never stopped plays it: the same rows in the
same order, the same rewards and losses. Real signals to this process (pytest runs tests in the main
thread, where `train()` installs its handler), sent from inside each phase of a step: the rollout (an
environment call in a worker thread), the loss pass and its backward, an agent's request in flight, a
wait for a lost vLLM server, and the optimizer step (which finishes first).
The stop latency of a real process is in test_signals.py."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from transformers import TrainerCallback

from helpers import require
from helpers.letters import letters_config
from aitrain_grpo.config import RunConfig
from aitrain_grpo.training.run.checkpoints import complete_checkpoints
from aitrain_grpo.training.run.stopping import TrainingStopped
from envs.letters import LetterEnv


class RecordingLetters(LetterEnv):
    """envs.letters that records which task each episode plays, and sends this process `signum` from
    the reset of the first episode of step `signal_at_step` (a worker thread: the rollout is waiting)."""

    def __init__(self, signal_at_step: int | None = None, signum: int = signal.SIGTERM, **kwargs):
        super().__init__(**kwargs)
        self.tasks: list[int] = []
        self.lock = threading.Lock()
        self.signal_at_reset = None if signal_at_step is None else (signal_at_step - 1) * 8
        self.signum = signum

    def reset(self, episode):
        with self.lock:
            if len(self.tasks) == self.signal_at_reset:
                os.kill(os.getpid(), self.signum)
            self.tasks.append(episode.row["task"])

    def per_step(self, batch: int = 8) -> list[list[int]]:
        return [sorted(self.tasks[i:i + batch]) for i in range(0, len(self.tasks), batch)]


def metrics(output_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (output_dir / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Five steps over four tasks (two per step, so a new shuffle every two steps), never stopped."""
    from aitrain_grpo.training.trainer import train

    out = tmp_path_factory.mktemp("uninterrupted")
    env = RecordingLetters(turns=1, num_tasks=4)
    train(letters_config(out), env=env)
    return out, env


def stopped_run(out: Path, env: LetterEnv, callbacks=(), **overrides) -> TrainingStopped:
    from aitrain_grpo.training.trainer import train

    with pytest.raises(TrainingStopped) as stopped:
        train(letters_config(out, **overrides), env=env, callbacks=list(callbacks))
    return stopped.value


def assert_resume_replays_the_rest(out: Path, uninterrupted, saved: int = 4, **overrides) -> None:
    """Resumed from checkpoint-`saved`, the run plays the steps after it as the uninterrupted run did."""
    from aitrain_grpo.training.trainer import train

    first_out, first_env = uninterrupted
    env = RecordingLetters(turns=1, num_tasks=4)
    train(letters_config(out, resume_from_checkpoint="auto", **overrides), env=env)
    batch = len(first_env.tasks) // 5  # episodes a step (8, or 16 with two micro-batches)
    assert env.per_step(batch) == first_env.per_step(batch)[saved:5]  # the dropped step's rows, in order, and on
    before, after = metrics(first_out), metrics(out)
    assert sorted(after) == [1, 2, 3, 4, 5]
    for step in range(saved + 1, 6):
        assert after[step]["reward"] == pytest.approx(before[step]["reward"], abs=1e-6)
        assert after[step]["loss"] == pytest.approx(before[step]["loss"], abs=1e-6)


def test_a_signal_during_the_rollout_drops_the_step_and_the_resume_plays_it_again(uninterrupted, tmp_path):
    out = tmp_path / "run"
    stop = stopped_run(out, RecordingLetters(signal_at_step=5, turns=1, num_tasks=4))
    assert stop.exit_code == 143 and not stop.is_error
    assert stop.reason == "stopped by SIGTERM during step 5, which a resume plays again"
    # The last finished step is saved, and step 5 never counted: no log line, no checkpoint of it.
    assert stop.checkpoint == out / "checkpoint-4" and complete_checkpoints(out)[-1].name == "checkpoint-4"
    assert sorted(metrics(out)) == [1, 2, 3, 4]
    assert_resume_replays_the_rest(out, uninterrupted)


def test_a_signal_during_the_loss_drops_the_step_and_the_resume_plays_it_again(uninterrupted, tmp_path, monkeypatch):
    """In step 4, mid-epoch (two steps an epoch), with no checkpoint but the stop's: the resume skips the
    epoch's first batch, not the dropped one."""
    from aitrain_grpo.training.trainer import EpisodeGRPOTrainer

    compute_loss = EpisodeGRPOTrainer.compute_loss

    def signalled_in_step_4(self, *args, **kwargs):
        if self.state.global_step == 3:
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside the loss
        return compute_loss(self, *args, **kwargs)

    monkeypatch.setattr(EpisodeGRPOTrainer, "compute_loss", signalled_in_step_4)
    out = tmp_path / "run"
    stop = stopped_run(out, RecordingLetters(turns=1, num_tasks=4), save_steps=100)
    monkeypatch.undo()
    assert stop.exit_code == 130 and stop.checkpoint == out / "checkpoint-3"
    assert sorted(metrics(out)) == [1, 2, 3]
    assert_resume_replays_the_rest(out, uninterrupted, saved=3)


def test_a_signal_between_accumulated_micro_batches_discards_their_gradients(tmp_path, monkeypatch):
    """Two micro-batches a step: the signal lands in step 5's second loss, after the first one's backward
    has accumulated gradients. The resumed step 5 is the uninterrupted run's (gradients and all)."""
    from aitrain_grpo.training.trainer import EpisodeGRPOTrainer, train

    accumulate = dict(gradient_accumulation_steps=2, save_steps=100)
    first_out = tmp_path / "uninterrupted"
    first_env = RecordingLetters(turns=1, num_tasks=4)
    train(letters_config(first_out, **accumulate), env=first_env)
    compute_loss, calls = EpisodeGRPOTrainer.compute_loss, []

    def signalled_in_the_second_micro_batch(self, *args, **kwargs):
        calls.append(self.state.global_step)
        if calls.count(4) == 2:
            signal.raise_signal(signal.SIGTERM)
        return compute_loss(self, *args, **kwargs)

    monkeypatch.setattr(EpisodeGRPOTrainer, "compute_loss", signalled_in_the_second_micro_batch)
    out = tmp_path / "run"
    stop = stopped_run(out, RecordingLetters(turns=1, num_tasks=4), **accumulate)
    monkeypatch.undo()
    assert stop.checkpoint == out / "checkpoint-4" and sorted(metrics(out)) == [1, 2, 3, 4]
    assert_resume_replays_the_rest(out, (first_out, first_env), **accumulate)


def test_a_signal_while_a_resume_loads_its_checkpoint_lets_the_load_finish(uninterrupted, tmp_path, monkeypatch):
    """Resumed from another folder's checkpoint-3, the run is signalled while it loads the optimizer
    state: the checkpoint-3 it saves in its own folder holds that state, not a fresh optimizer's."""
    import torch

    from aitrain_grpo.training.trainer import EpisodeGRPOTrainer, train

    first_out, _ = uninterrupted
    load = EpisodeGRPOTrainer._load_optimizer_and_scheduler

    def signalled_while_loading(self, checkpoint):
        signal.raise_signal(signal.SIGTERM)
        return load(self, checkpoint)

    monkeypatch.setattr(EpisodeGRPOTrainer, "_load_optimizer_and_scheduler", signalled_while_loading)
    out = tmp_path / "run"
    with pytest.raises(TrainingStopped) as stopped:
        train(letters_config(out, resume_from_checkpoint=str(first_out / "checkpoint-3")),
              env=RecordingLetters(turns=1, num_tasks=4))
    monkeypatch.undo()
    assert stopped.value.reason == "stopped by SIGTERM during step 4, which a resume plays again"
    assert stopped.value.checkpoint == out / "checkpoint-3"
    saved, original = (torch.load(path / "checkpoint-3" / "optimizer.pt", weights_only=False)["state"]
                       for path in (out, first_out))
    assert saved.keys() == original.keys() and all(
        torch.equal(saved[k]["exp_avg"], original[k]["exp_avg"]) for k in original)


class SignalInTheBackward(TrainerCallback):
    """Sends SIGTERM from a gradient hook during step 5's backward (a torch call the exception must leave)."""

    sent = False

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        def hook(grad):
            if state.global_step == 4 and not self.sent:
                self.sent = True
                signal.raise_signal(signal.SIGTERM)

        next(p for p in model.parameters() if p.requires_grad).register_hook(hook)


def test_a_signal_during_the_backward_drops_the_step_and_the_resume_plays_it_again(uninterrupted, tmp_path):
    out = tmp_path / "run"
    backward = SignalInTheBackward()
    stop = stopped_run(out, RecordingLetters(turns=1, num_tasks=4), [backward])
    assert backward.sent and stop.exit_code == 143 and stop.checkpoint == out / "checkpoint-4"
    assert sorted(metrics(out)) == [1, 2, 3, 4]
    assert_resume_replays_the_rest(out, uninterrupted)


class SignalsDuringTheOptimizerStep(TrainerCallback):
    """Sends `signals` to this process just before step `step`'s optimizer step (after SignalStop's own
    `on_pre_optimizer_step`, which runs first: build_trainer puts callers' callbacks last)."""

    def __init__(self, step: int, signals: list[int]):
        self.step, self.signals = step, signals

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step == self.step - 1:
            for signum in self.signals:
                signal.raise_signal(signum)
        return control


def test_a_signal_during_the_optimizer_step_lets_that_step_finish_and_saves_it(tmp_path):
    out = tmp_path / "run"
    stop = stopped_run(out, RecordingLetters(turns=1, num_tasks=4), [SignalsDuringTheOptimizerStep(2, [signal.SIGTERM])])
    # Cut there, the weights would have moved without the step counting: the step is finished instead.
    assert stop.reason == "stopped by SIGTERM after step 2" and stop.exit_code == 143
    assert stop.checkpoint == out / "checkpoint-2" and sorted(metrics(out)) == [1, 2]


def test_a_second_signal_stops_at_once_without_a_new_checkpoint(tmp_path):
    out = tmp_path / "run"
    from aitrain_grpo.training.trainer import train

    twice = SignalsDuringTheOptimizerStep(2, [signal.SIGINT, signal.SIGINT])
    with pytest.raises(KeyboardInterrupt):
        train(letters_config(out), env=RecordingLetters(turns=1, num_tasks=4), callbacks=[twice])
    assert sorted(metrics(out)) == [1] and not complete_checkpoints(out)


def test_a_signal_during_an_agents_request_ends_its_rollout_and_closes_the_endpoint(tmp_path):
    require("openai", "pip install openai")
    from envs_fixtures.agents import WeatherAgent

    class SignalledAgent(WeatherAgent):
        """WeatherAgent that sends SIGTERM as a rollout of step 2 (4 episodes a step) makes a request,
        while the other episodes of the step have theirs in flight."""

        sent, started, ended, base_url = False, 0, 0, None

        async def rollout(self, client, row):
            SignalledAgent.started += 1
            SignalledAgent.base_url = str(client.base_url)
            try:
                return await super().rollout(client, row)
            finally:
                SignalledAgent.ended += 1

        async def ask(self, client, **request):
            if SignalledAgent.started > 4 and not SignalledAgent.sent:
                SignalledAgent.sent = True
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, in this agent's coroutine
            return await client.chat.completions.create(**request)

    out = tmp_path / "run"
    config = RunConfig(model="tiny", output_dir=str(out), batch_size=4, rl_num_generations=2, rl_max_new_tokens=24,
                       max_steps=3)
    from aitrain_grpo.training.trainer import train

    with pytest.raises(TrainingStopped) as stopped:
        train(config, env=SignalledAgent(episodes=8))
    assert stopped.value.checkpoint == out / "checkpoint-1" and sorted(metrics(out)) == [1]
    # Every agent rollout that began has ended (cancelled mid-request, its `finally` run), and the
    # endpoint no longer answers: nothing of the dropped step runs on.
    assert SignalledAgent.started > 4 and SignalledAgent.ended == SignalledAgent.started
    with pytest.raises(OSError):
        urllib.request.urlopen(SignalledAgent.base_url + "/models", timeout=5)


def test_a_signal_while_waiting_for_a_lost_vllm_server_stops_at_once(tmp_path, refused_url):
    """Two steps are played on the tiny model, then every request goes to a pool whose only server is
    gone: the run waits for it to return (here up to 30 s). A SIGTERM during that wait stops the run
    at once with the last finished step saved, rather than after the wait."""
    from aitrain_grpo.engine.backends.base import GenerationBackend
    from aitrain_grpo.engine.backends.choice import build_backend
    from aitrain_grpo.engine.backends.server_pool import ServerPool
    from aitrain_grpo.engine.rollout import RolloutEngine
    from aitrain_grpo.engine.settings import EpisodeSettings
    from aitrain_grpo.models.loading import stop_token_ids
    from aitrain_grpo.training.run.stopping import clean_stops
    from aitrain_grpo.training.trainer import build_trainer
    from aitrain_grpo.training.trl.access import generation_handles

    class ServerLostAtStep3(GenerationBackend):
        def __init__(self, alive: GenerationBackend, pool: ServerPool):
            self.alive, self.pool, self.calls, self.sent = alive, pool, 0, None
            self.stop_ids = alive.stop_ids

        def generate(self, prompts, max_tokens, sampling):
            self.calls += 1
            if self.calls <= 2:
                return self.alive.generate(prompts, max_tokens, sampling)
            if self.sent is None:
                self.sent = time.monotonic()
                threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()  # well into the wait
            return self.pool.generate(prompts, max_tokens, sampling)

    out = tmp_path / "run"
    config = RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(out), max_steps=6,
                       batch_size=8, rl_max_new_tokens=16)
    env = LetterEnv(turns=1, num_tasks=8)
    trainer = build_trainer(config, env=env)
    stop_ids = stop_token_ids(trainer.model, trainer.processing_class)
    pool = ServerPool([refused_url], "tiny", stop_ids, wait_timeout=30)
    pool.servers[0].live = False  # lost: the pool waits for it to answer /health again
    backend = ServerLostAtStep3(build_backend("hf", stop_ids, **generation_handles(trainer, "hf")), pool)
    trainer.rollout.engine = RolloutEngine(env, trainer.processing_class, backend, EpisodeSettings(max_new_tokens=16))
    with pytest.raises(TrainingStopped) as caught:
        with clean_stops(trainer):
            trainer.train()
    seconds = time.monotonic() - backend.sent
    trainer.rollout_parts.close()
    stop = caught.value
    assert stop.reason == "stopped by SIGTERM during step 3, which a resume plays again", stop.reason
    assert seconds < 10 and stop.checkpoint == out / "checkpoint-2"
