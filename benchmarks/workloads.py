"""The workloads of the rollout benchmark, and the means of making every episode do the same work.

- `ChatterEnv` / `AsyncChatterEnv` (workloads A and B): a plain conversation of exactly `turns` model
  turns; every environment reply is about 20 tokens, and every `step` may sleep `latency` seconds
  (time.sleep in the sync class, asyncio.sleep in the async one), like an I/O-bound tool.
- `StragglerEnv` (workload S): one episode in eight plays four times the turns of the others (8, not
  2), and every `step` awaits a latency drawn from 0-100 ms; what continuous rollouts are for.
- `group_rows` (workload P): GRPO groups, each prompt (a ~300-token system prompt and a task) repeated
  8 times, for the hf backend's shared group prefill.
- `LookupToolEnv` (workload C, our contract) and `TRLLookupEnv` (the same environment written for
  TRL's `environment_factory`): one `lookup` tool with the same schema and the same replies.
- `FullLengthTurns`: wraps a backend so that every model turn is exactly `max_tokens` tokens: the
  backend samples `max_tokens - 1` tokens with its stop tokens suppressed (`HFNoStop`, `ColocateNoStop`,
  `ServerNoStop`) and the turn is closed with the stop token. A random tiny model would otherwise end
  its turns at random lengths, and the compared runs would not do the same work.
- `scripted_turns`: for workload C, where the model must call the tool on its first three turns and
  answer on the fourth in both trainers, a logits processor that forces a fixed token script onto
  `generate` (installed for the duration of a `with` block). The model still computes every forward
  pass over the full vocabulary; only the choice of token is fixed.

Left out: anything that times or reports (rollout.py, trl_step.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time

import torch

from aitrain_grpo import Environment, Episode, ToolEnvironment, tool
from aitrain_grpo.engine.backends.base import Sample, SamplingParams
from aitrain_grpo.engine.backends.hf import HFBackend

WORDS = (
    "hotel room guest night booking city rating price search check available date lisbon porto madrid "
    "paris berlin cheap quiet garden harbour central golden suite house lodge breakfast window view"
).split()

TURNS = 4
NEW_TOKENS = 32


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def task_rows(num_tasks: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"prompt": [{"role": "user", "content": f"Task {i}: {_words(rng, 12)}."}], "task": i}
        for i in range(num_tasks)
    ]


# Real replies rarely repeat, so neither must these (a repeated reply would hit the renderer's cache).
_serials = itertools.count()


def reply_text(task: int, turn: int) -> str:
    """About 20 tokens with the tiny tokenizer, different on every call."""
    rng = random.Random(task * 100 + turn)
    return f"Noted {next(_serials)}: {_words(rng, 7)}."


class ChatterEnv(Environment):
    """Workload A (latency 0) and B (latency 0.05, blocking): `turns` model turns, then the end."""

    def __init__(self, num_tasks: int = 64, turns: int = TURNS, latency: float = 0.0, seed: int = 0):
        self.num_tasks, self.turns, self.latency, self.seed = num_tasks, turns, latency, seed
        self.max_turns = turns

    def build_dataset(self, tokenizer):
        return task_rows(self.num_tasks, self.seed)

    def step(self, episode: Episode, completion: str):
        if self.latency:
            time.sleep(self.latency)
        if episode.turns >= self.turns:
            return None
        return reply_text(episode.row["task"], episode.turns)

    def score_episode(self, episode: Episode) -> float:
        return (episode.row["task"] % 10) / 10


class AsyncChatterEnv(ChatterEnv):
    """Workload B with a non-blocking environment: `step` awaits asyncio.sleep."""

    async def step(self, episode: Episode, completion: str):
        if self.latency:
            await asyncio.sleep(self.latency)
        if episode.turns >= self.turns:
            return None
        return reply_text(episode.row["task"], episode.turns)


STRAGGLER_EVERY, SHORT_TURNS, LONG_TURNS, MAX_LATENCY = 8, 2, 8, 0.1


class StragglerEnv(Environment):
    """Workload S: task i plays LONG_TURNS turns if i % STRAGGLER_EVERY == 0, else SHORT_TURNS; each
    `step` awaits a latency from 0 to MAX_LATENCY seconds, fixed per task and turn."""

    max_turns = LONG_TURNS

    def __init__(self, num_tasks: int = 64, seed: int = 0):
        self.num_tasks, self.seed = num_tasks, seed

    def build_dataset(self, tokenizer):
        return task_rows(self.num_tasks, self.seed)

    @staticmethod
    def turns(task: int) -> int:
        return LONG_TURNS if task % STRAGGLER_EVERY == 0 else SHORT_TURNS

    @staticmethod
    def latency(task: int, turn: int) -> float:
        return random.Random(task * 1000 + turn).uniform(0.0, MAX_LATENCY)

    async def step(self, episode: Episode, completion: str):
        task = episode.row["task"]
        await asyncio.sleep(self.latency(task, episode.turns))
        if episode.turns >= self.turns(task):
            return None
        return reply_text(task, episode.turns)

    def score_episode(self, episode: Episode) -> float:
        return 1.0


def straggler_wait_bound(num_tasks: int) -> dict[str, float]:
    """What S's environment waits allow with every episode in play, were generation free: lockstep waits
    for the slowest reply of each turn, continuous for the episode whose own replies add up the most.
    Both schedules play the stragglers' LONG_TURNS turns one after another, so their generation time
    is the same and `lockstep / continuous` bounds the speed-up from above."""
    lockstep = sum(max(StragglerEnv.latency(t, turn) for t in range(num_tasks) if StragglerEnv.turns(t) >= turn)
                   for turn in range(1, LONG_TURNS + 1))
    continuous = max(sum(StragglerEnv.latency(t, turn) for turn in range(1, StragglerEnv.turns(t) + 1))
                     for t in range(num_tasks))
    return {"lockstep": lockstep, "continuous": continuous}


GROUP_SIZE = 8
SYSTEM_PROMPT = ("You are the booking assistant of a hotel chain. Answer in one short paragraph, name the hotel, the "
                 "city, the price per night and whether breakfast is included. ") * 8


def group_rows(num_prompts: int, seed: int = 0) -> list[dict]:
    """Workload P: `num_prompts` prompts, each repeated GROUP_SIZE times in a row, as TRL hands them."""
    return [{"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, *row["prompt"]], "task": row["task"]}
            for row in task_rows(num_prompts, seed) for _ in range(GROUP_SIZE)]


def lookup_result(key: str, calls: int) -> str:
    rng = random.Random(f"{key}:{calls}")
    return f"Entry {next(_serials)}: {_words(rng, 7)}."


class LookupToolEnv(ToolEnvironment):
    """Workload C in this project's contract: the model calls `lookup` until it answers in plain text."""

    max_turns = TURNS

    def __init__(self, num_tasks: int = 16, seed: int = 0):
        self.num_tasks, self.seed = num_tasks, seed

    def build_dataset(self, tokenizer):
        return task_rows(self.num_tasks, self.seed)

    @property
    def tools(self):
        # TRL renders transformers' schema, which adds the return type: render the same prompt.
        return [{**s, "function": {**s["function"], "return": {"type": "string"}}} for s in super().tools]

    def reset(self, episode: Episode) -> None:
        episode.state["calls"] = 0

    @tool
    def lookup(self, key: str, episode: Episode) -> str:
        """Look up a key in the knowledge base.

        Args:
            key: The key to look up.
        """
        episode.state["calls"] += 1
        return lookup_result(key, episode.state["calls"])

    def score_episode(self, episode: Episode) -> float:
        return min(episode.state["calls"], 3) / 3


class TRLLookupEnv:
    """Workload C for TRL's `environment_factory`: the same tool, replies and score."""

    def reset(self, **row) -> None:
        self.calls = 0

    def lookup(self, key: str) -> str:
        """Look up a key in the knowledge base.

        Args:
            key: The key to look up.
        """
        self.calls += 1
        return lookup_result(key, self.calls)

    def get_reward(self) -> float:
        return min(self.calls, 3) / 3


# ------------------------------------------------------------------------------ fixed-length turns


class HFNoStop(HFBackend):
    def _generation_config(self, max_tokens: int, sampling: SamplingParams):
        config = super()._generation_config(max_tokens, sampling)
        config.min_new_tokens = max_tokens
        return config


def colocate_no_stop_class():
    from aitrain_grpo.engine.backends.vllm_colocate import VLLMColocateRequests

    class ColocateNoStop(VLLMColocateRequests):
        def _sampling_params(self, max_tokens: int, sampling: SamplingParams):
            params = super()._sampling_params(max_tokens, sampling)
            params.min_tokens = max_tokens
            return params

    return ColocateNoStop


def server_no_stop_client(url: str):
    from aitrain_grpo.engine.backends.vllm_server import VLLMServerClient

    class ServerNoStop(VLLMServerClient):
        def completion_body(self, *args, **kwargs):
            body = super().completion_body(*args, **kwargs)
            return {**body, "min_tokens": body["max_tokens"]}

    return ServerNoStop(url)


class FullLengthTurns:
    """Every turn exactly `max_tokens` tokens, the last one the stop token (log-prob 0, not sampled)."""

    def __init__(self, backend, stop_id: int, *, sessions: bool = True):
        self.backend = backend
        self.stop_id = stop_id
        self.sessions = sessions  # False: no rollout_session, so the hf backend prefills every turn afresh
        self.stop_ids = [stop_id]
        self.sampled_tokens = 0

    def rollout_session(self):
        return self.backend.rollout_session() if self.sessions else contextlib.nullcontext()

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams) -> list[Sample]:
        return self._closed(self.backend.generate(prompts, max_tokens - 1, sampling), max_tokens)

    def _closed(self, samples: list[Sample], max_tokens: int) -> list[Sample]:
        out = []
        for sample in samples:
            if len(sample.token_ids) != max_tokens - 1:
                raise RuntimeError(f"the backend ignored min_tokens: {len(sample.token_ids)} of {max_tokens - 1} tokens")
            self.sampled_tokens += len(sample.token_ids)
            out.append(Sample(sample.token_ids + [self.stop_id], sample.logprobs + [0.0], "stop"))
        return out


# ------------------------------------------------------------------------------ scripted turns (C)


def turn_scripts(tokenizer, new_tokens: int = NEW_TOKENS, turns: int = TURNS) -> list[list[int]]:
    """Token scripts: a `lookup` call on every turn but the last, a plain answer on the last; each
    exactly `new_tokens` tokens including the closing EOS."""
    eos = tokenizer.eos_token_id
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    filler = encode(" ".join(WORDS * 4))
    open_call, close_call = tokenizer.convert_tokens_to_ids("<tool_call>"), tokenizer.convert_tokens_to_ids("</tool_call>")
    head, tail = encode('{"name": "lookup", "arguments": {"key": "'), encode('"}}')
    scripts = []
    for turn in range(turns):
        if turn < turns - 1:
            room = new_tokens - 1 - (2 + len(head) + len(tail))
            script = [open_call, *head, *filler[turn: turn + room], *tail, close_call]
        else:
            script = filler[turn: turn + new_tokens - 1]
        scripts.append(script + [eos])
        assert len(scripts[-1]) == new_tokens, len(scripts[-1])
    return scripts


class ScriptedTurns:
    """A logits processor: row r's next token is script[t][j], where t is the number of tool responses
    already in row r (its turn) and j the number of tokens generated in this `generate` call."""

    def __init__(self, scripts: list[list[int]], turn_marker_id: int, start: int):
        self.scripts = torch.tensor(scripts, dtype=torch.long)
        self.turn_marker_id = turn_marker_id
        self.start = start

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        turn = (input_ids == self.turn_marker_id).sum(dim=1).clamp(max=self.scripts.size(0) - 1)
        position = min(input_ids.size(1) - self.start, self.scripts.size(1) - 1)
        forced = self.scripts[turn.cpu(), position].to(scores.device)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, forced.unsqueeze(1), 0.0)
        return out


@contextlib.contextmanager
def scripted_turns(model_class, scripts: list[list[int]], turn_marker_id: int):
    """Within the block, every `model_class.generate` call samples the scripted tokens."""
    from transformers import LogitsProcessorList

    original = model_class.generate

    def generate(self, *args, **kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(ScriptedTurns(scripts, turn_marker_id, input_ids.size(1)))
        return original(self, *args, logits_processor=processors, **kwargs)

    model_class.generate = generate
    try:
        yield
    finally:
        model_class.generate = original


class FullLengthRequests(FullLengthTurns):
    """`FullLengthTurns` for a backend that also takes one turn at a time (the continuous schedule)."""

    async def generate_one(self, prompt: list[int], max_tokens: int, sampling: SamplingParams) -> Sample:
        sample = await self.backend.generate_one(prompt, max_tokens - 1, sampling)
        return self._closed([sample], max_tokens)[0]
