"""Scripted rollouts to compare: `StaggeredEnv`, whose tasks play 1-4 turns with replies that come back
out of order, `play` to run it under either schedule on a backend, `assert_same_rollouts` for two
schedules' results, `OracleBackend`, which replays an SFT dataset's assistant turns token for token, and
`model_spans`, a trace's runs of sampled tokens."""

from __future__ import annotations

import asyncio
import contextlib

from aitrain_grpo import Environment
from aitrain_grpo.engine.backends.base import Sample, SamplingParams
from aitrain_grpo.engine.backends.hf import HFBackend
from aitrain_grpo.engine.rollout import RolloutBatch, RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings

GREEDY = SamplingParams(temperature=0.0)
NEW_TOKENS = 8

def model_spans(trace) -> list[list[int]]:
    """The runs of model tokens in a trace (env_mask 1), in order."""
    spans, current = [], []
    for token, mask in zip(trace.completion_ids, trace.env_mask):
        if mask:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


def staggered_rows(groups: int = 6, group_size: int = 2) -> list[dict]:
    """`groups` prompts, each repeated `group_size` times as TRL hands them; task i plays 1 + i % 4 turns."""
    return [{"prompt": [{"role": "user", "content": f"Task {task}: tell me about room {task * 7}."}], "task": task}
            for task in range(groups) for _ in range(group_size)]


class StaggeredEnv(Environment):
    """Deterministic: task i wants 1 + i % 4 model turns; replies depend only on the task and the turn;
    async `step` with a task-dependent delay, so replies come back in another order than they went out."""

    max_turns = 6

    def __init__(self, fail_task: int | None = None):
        self.fail_task = fail_task

    def build_dataset(self, tokenizer):
        return staggered_rows()

    async def step(self, episode, completion):
        task = episode.row["task"]
        await asyncio.sleep(0.002 * ((task * 5) % 7))
        if task == self.fail_task:
            raise RuntimeError("the booking service is down")
        if episode.turns >= 1 + task % 4:
            return None
        return f"Reply {episode.turns} to task {task}: room {task * 7 + episode.turns} is free."

    def score_episode(self, episode):
        return episode.turns / self.max_turns


class TurnEndingHF(HFBackend):
    def _generation_config(self, max_tokens, sampling):
        config = super()._generation_config(max_tokens, sampling)
        config.forced_eos_token_id = self.stop_ids[0]
        return config


def play(model, tokenizer, schedule: str, *, env: Environment | None = None, backend=None, slots: int = 5,
         **engine_options) -> RolloutBatch:
    env = env or StaggeredEnv()
    backend = backend or TurnEndingHF.for_model(model, tokenizer)
    settings = EpisodeSettings(**{"max_new_tokens": NEW_TOKENS, "sampling": GREEDY, **engine_options},
                               schedule=schedule, max_concurrent_episodes=slots)
    engine = RolloutEngine(env, tokenizer, backend, settings)
    with engine:
        return engine.run(env.build_dataset(tokenizer))


def assert_same_rollouts(lockstep: RolloutBatch, continuous: RolloutBatch, logprob_tolerance: float) -> None:
    for a, b in zip(lockstep.episodes, continuous.episodes):
        assert a.messages == b.messages
        assert (a.turns, a.stop_reason, a.score) == (b.turns, b.stop_reason, b.score)
    for a, b in zip(lockstep.traces, continuous.traces):
        assert a.prompt_ids == b.prompt_ids
        assert a.completion_ids == b.completion_ids
        assert a.env_mask == b.env_mask
        assert len(a.logprobs) == len(b.logprobs)
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= logprob_tolerance



class OracleBackend:
    """A generation backend that 'samples', for each prompt, the next assistant turn of the
    demonstration whose tokens it continues: any difference between the SFT tokens and the engine's
    is a prompt it has never seen."""

    def __init__(self, dataset, eos: int):
        self.stop_ids = [eos]
        self.turns: dict[tuple[int, ...], list[int]] = {}
        for ids, mask in zip(dataset["input_ids"], dataset["assistant_masks"]):
            start = None
            for i, bit in enumerate(mask + [0]):
                if bit and start is None:
                    start = i
                elif not bit and start is not None:
                    self.turns[tuple(ids[:start])] = ids[start:i]
                    start = None

    def generate(self, prompts, max_tokens, sampling):
        unknown = [p for p in prompts if tuple(p) not in self.turns]
        assert not unknown, f"the engine built {len(unknown[0])} tokens that no SFT sequence starts with"
        return [Sample(self.turns[tuple(p)], [0.0] * len(self.turns[tuple(p)]), "stop") for p in prompts]

    def rollout_session(self):
        return contextlib.nullcontext()


def as_on_a_vllm_server(trainer, shift: float = 0.4) -> None:
    """Before training: the importance-sampling correction on (token level, truncated), as the trainer turns it
    on where this package moves vLLM's weights, and sampler log-probabilities moved off the trainer's by up to
    `shift` a token, as a server's are: benchmarks/loss_pass_weights.py's `off_policy`, the one copy."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "loss_pass_weights.py"
    spec = importlib.util.spec_from_file_location("loss_pass_weights", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.off_policy(trainer, shift)
