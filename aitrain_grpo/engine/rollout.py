"""The rollout engine: plays a batch of episodes turn by turn and returns their tokens, masks and scores.

Every turn makes one batched `generate` call for all episodes still running, then answers all of them
at once (environment calls overlap on the `EpisodeRunner`'s event loop). Episodes are kept as token
ids from start to finish: the prompt rendered once, each model turn exactly as sampled (mask 1, with
its log-probabilities), each environment reply as the chat template's suffix (mask 0, log-prob 0).
Nothing generated is ever decoded and re-encoded into the token stream.

Budgets: `max_new_tokens` per model turn, `max_turns`, and `max_completion_length` for everything
after the prompt. A turn that hits its token limit, or a reply that would overflow the completion
budget, ends the episode as truncated; it is scored as it stands.

Left out: the trainer (see training.py) and anything backend-specific (see backends/).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from aitrain_grpo.engine.backends.base import GenerationBackend, SamplingParams
from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.env.base import Environment, Episode
from aitrain_grpo.engine.runner import EpisodeRunner, episode_summary


@dataclass
class TokenTrace:
    """One episode as tokens. `env_mask[i]` is 1 where the model sampled `completion_ids[i]`."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)

    def add_model_tokens(self, ids: list[int], logprobs: list[float]) -> None:
        self.completion_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.env_mask.extend([1] * len(ids))

    def add_env_tokens(self, ids: list[int]) -> None:
        self.completion_ids.extend(ids)
        self.logprobs.extend([0.0] * len(ids))
        self.env_mask.extend([0] * len(ids))


@dataclass
class RolloutBatch:
    """The result of `RolloutEngine.run`, in batch order."""

    episodes: list[Episode]
    traces: list[TokenTrace]
    generate_seconds: float = 0.0
    env_seconds: float = 0.0
    wall_seconds: float = 0.0
    generate_calls: int = 0

    @property
    def scores(self) -> list[float]:
        return [float(ep.score or 0.0) for ep in self.episodes]

    def summaries(self) -> list[dict[str, Any]]:
        return [episode_summary(ep) for ep in self.episodes]

    def for_trl(self) -> dict[str, Any]:
        """The dict TRL's `rollout_func` must return; extra keys reach reward functions per sample."""
        return {
            "prompt_ids": [t.prompt_ids for t in self.traces],
            "completion_ids": [t.completion_ids for t in self.traces],
            "logprobs": [t.logprobs for t in self.traces],
            "env_mask": [t.env_mask for t in self.traces],
            "episode_score": self.scores,
        }


class RolloutEngine:
    """Runs episodes of one environment with one generation backend."""

    def __init__(
        self,
        env: Environment,
        tokenizer,
        backend: GenerationBackend,
        *,
        max_new_tokens: int = 128,
        max_turns: int | None = None,
        max_completion_length: int = 1024,
        sampling: SamplingParams = SamplingParams(),
        env_timeout: float | None = 60.0,
        template_kwargs: dict | None = None,
    ):
        self.env = env
        self.tokenizer = tokenizer
        self.backend = backend
        self.renderer = ChatRenderer(tokenizer, tools=env.tools, template_kwargs=template_kwargs)
        self.runner = EpisodeRunner(env, max_turns=max_turns, timeout=env_timeout)
        self.max_new_tokens = max_new_tokens
        self.max_completion_length = max_completion_length
        self.sampling = sampling
        self.stop_ids = set(getattr(backend, "stop_ids", None) or [tokenizer.eos_token_id])

    @property
    def max_turns(self) -> int:
        return self.runner.max_turns

    def close(self) -> None:
        self.runner.close()

    def run(self, rows: list[dict[str, Any]]) -> RolloutBatch:
        # A backend may carry state from one turn of this rollout to the next (the hf backend: its
        # key-value cache), which holds only while the weights stay as they are, i.e. for one rollout.
        session = getattr(self.backend, "rollout_session", None)
        with session() if session is not None else contextlib.nullcontext():
            return self._run(rows)

    def _run(self, rows: list[dict[str, Any]]) -> RolloutBatch:
        started = time.perf_counter()
        runner = self.runner
        episodes = [runner.new_episode(row) for row in rows]
        # Tokenizer and template calls are batched per phase: each call costs more than the texts in it.
        traces = [TokenTrace(prompt_ids=ids) for ids in self.renderer.prompt_ids_many([ep.messages for ep in episodes])]
        batch = RolloutBatch(episodes=episodes, traces=traces)

        t0 = time.perf_counter()
        runner.gather(runner.reset(ep) for ep in episodes)
        batch.env_seconds += time.perf_counter() - t0

        while True:
            running = [i for i, ep in enumerate(episodes) if not ep.done]
            if not running:
                break
            budgets = {i: self.max_completion_length - len(traces[i].completion_ids) for i in running}
            for i in [i for i in running if budgets[i] <= 0]:
                episodes[i].truncated = episodes[i].done = True
            running = [i for i in running if budgets[i] > 0]
            if not running:
                break
            max_tokens = min(self.max_new_tokens, max(budgets[i] for i in running))
            t0 = time.perf_counter()
            samples = self.backend.generate(
                [traces[i].prompt_ids + traces[i].completion_ids for i in running], max_tokens, self.sampling
            )
            batch.generate_seconds += time.perf_counter() - t0
            batch.generate_calls += 1

            turn_ends: dict[int, bool] = {}
            cut_offs, text_ids = [], []
            for i, sample in zip(running, samples):
                ids, logprobs = sample.token_ids, sample.logprobs
                cut_off = sample.finish_reason != "stop"
                if len(ids) > budgets[i]:  # this episode's completion budget is below the batch's limit
                    ids, logprobs, cut_off = ids[: budgets[i]], logprobs[: budgets[i]], True
                traces[i].add_model_tokens(ids, logprobs)
                ended_with_eos = bool(ids) and ids[-1] in self.stop_ids
                turn_ends[i] = ended_with_eos
                cut_offs.append(cut_off)
                text_ids.append(ids[:-1] if ended_with_eos else ids)
            texts = self.tokenizer.batch_decode(text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            pending = [
                (i, runner.respond(episodes[i], text, cut_off=cut_off)) for i, text, cut_off in zip(running, texts, cut_offs)
            ]

            t0 = time.perf_counter()
            replies = runner.gather(coro for _, coro in pending)
            batch.env_seconds += time.perf_counter() - t0

            answered = [(i, reply) for (i, _), reply in zip(pending, replies) if reply is not None]
            suffixes = self.renderer.encode_many([self.renderer.reply_text(reply, turn_ends[i]) for i, reply in answered])
            for (i, reply), suffix in zip(answered, suffixes):
                if len(traces[i].completion_ids) + len(suffix) >= self.max_completion_length:
                    # No room for the reply and a next turn: stop here, scored as it stands.
                    episodes[i].truncated = episodes[i].done = True
                    continue
                traces[i].add_env_tokens(suffix)
                runner.accept(episodes[i], reply)

        t0 = time.perf_counter()
        runner.gather(runner.score(ep) for ep in episodes)
        batch.env_seconds += time.perf_counter() - t0
        for trace in traces:
            if not trace.completion_ids:
                # An episode that failed before the model's first turn (reset raised) has nothing after
                # its prompt, and TRL indexes the last completion token: give it one EOS, masked out.
                trace.add_env_tokens([self.tokenizer.eos_token_id])
        batch.wall_seconds = time.perf_counter() - started
        return batch


def batch_metrics(summaries: list[dict[str, Any]]) -> dict[str, float]:
    """Per-step `env/*` metrics from episode summaries (possibly gathered from several processes)."""
    n = max(len(summaries), 1)
    metrics = {
        "env/score_mean": sum(s["score"] for s in summaries) / n,
        "env/turns_mean": sum(s["turns"] for s in summaries) / n,
        "env/truncated_frac": sum(1 for s in summaries if s["truncated"]) / n,
        "env/errors": float(sum(1 for s in summaries if s["error"])),
        "env/tool_calls_mean": sum(s["tool_calls"] for s in summaries) / n,
        "env/tool_errors": float(sum(s["tool_errors"] for s in summaries)),
        "env/episodes": float(len(summaries)),
    }
    custom: dict[str, list[float]] = {}
    for s in summaries:
        for key, value in s["metrics"].items():
            custom.setdefault(key, []).append(value)
    for key, values in custom.items():
        metrics[f"env/{key}"] = sum(values) / len(values)
    return metrics
