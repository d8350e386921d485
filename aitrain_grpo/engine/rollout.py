"""The rollout engine: plays a batch of episodes and returns their tokens, masks and scores.

Two schedules. Continuous (the default where the backend takes one request at a time: the vLLM
backends): every episode advances on its own; as soon as its environment reply is ready its next turn
is submitted, and a finished episode frees its slot for the next one (at most
`max_concurrent_episodes` in play), so no episode waits for the slowest of the batch. Lockstep (the hf
backend, whose batched turns continue one key-value cache; or on request): each turn makes one batched
`generate` call for all episodes still running, then answers all of them at once. Environment calls
overlap either way on the `EpisodeRunner`'s event loop, with its timeouts and fault handling.

Episodes are kept as token ids from start to finish: the prompt rendered once, each model turn exactly
as sampled (mask 1, with its log-probabilities), each environment reply as the chat template's suffix
(mask 0, log-prob 0). Nothing generated is ever decoded and re-encoded into the token stream. Turns an
environment asks of the policy itself (`episode.policy_turn`: a self-play opponent) are drawn the same way
and stay out of the sequence (engine/policy_turns.py).

Budgets and history (engine/context.py's `ContextKeeper`, as engine/settings.py's `EpisodeSettings` say;
its budgets, engine/budgets.py, are an agent's too): `max_new_tokens` per model turn, `max_turns`,
`max_completion_length` for everything after a sequence's prompt, the episode's model tokens and the
context window; the context strategy may rewrite an episode's history, which starts a new sequence
(`RolloutBatch.earlier`). A turn that hits its token limit ends the
episode as truncated (`cut_turn="end"`) or is answered by the environment as it stands (`cut_turn="continue"`);
a reply that would overflow a budget, with no rewrite that fits, ends the episode as truncated; it is
scored as it stands. Each episode's `stop_reason` says which of these ended it (or the environment, or an error).

`on_episode_done`, when set, is called with the batch and an episode's index as soon as that episode is
scored (either schedule, agents too; an episode replayed after its server was lost: once, when its replay
is), so a caller can start work on finished episodes while the rest still play (training/rewards/judge.py's
early judge calls). It runs on the engine's event loop: it must return at once.

Left out: the trainer (see training/) and anything backend-specific (see backends/).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from aitrain_grpo.engine.agent_rollout import AgentLimits, AgentPlayer, renderer_cache
from aitrain_grpo.engine.backends.base import GenerationBackend, ReplayEpisode, RequestBackend, Sample
from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.engine.context import ContextKeeper
from aitrain_grpo.engine.policy_turns import Draw, give_policy_turns, open_sampler
from aitrain_grpo.env.agent import is_agent_environment
from aitrain_grpo.env.base import Environment, Episode, tools_for_row, tools_vary_by_row
from aitrain_grpo.engine.runner import EpisodeRunner
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.engine.stats import BusyClock, EpisodeSummary, episode_scores
from aitrain_grpo.engine.traces import TokenTrace  # noqa: F401  (its home before engine/traces.py)


@dataclass
class RolloutBatch:
    """The result of `RolloutEngine.run`, in batch order. `generate_seconds` and `env_seconds` are wall
    time during which at least one generate (environment) call was under way, so under the continuous
    schedule they overlap; `generate_calls` counts backend calls (continuous on a `RequestBackend`:
    one per episode turn)."""

    episodes: list[Episode]
    traces: list[TokenTrace]
    generate_seconds: float = 0.0
    env_seconds: float = 0.0
    wall_seconds: float = 0.0
    generate_calls: int = 0
    replayed_episodes: int = 0  # episodes played again from their start after their server was lost
    agent_counts: dict[str, int] = field(default_factory=dict)  # agent environments' requests (agent_rollout.py)
    # Per episode, the sequences it played before the one in `traces` (its history was rewritten: a context
    # strategy, engine/context.py; an agent's new segment); empty where the episode is one sequence. Same
    # length as `episodes` once run.
    earlier: list[list[TokenTrace]] = field(default_factory=list)

    @property
    def scores(self) -> list[float]:
        return episode_scores(self.episodes)

    def summaries(self) -> list[EpisodeSummary]:
        return [EpisodeSummary.of(ep) for ep in self.episodes]


class RolloutEngine:
    """Runs episodes of one environment with one generation backend, as `settings` say (engine/settings.py:
    budgets, sampling, timeouts, tool parser, agent endpoint).

    `settings.schedule`: "continuous" (each episode on its own), "lockstep" (turn by turn for all), or
    "auto": continuous where the backend takes one request at a time (`RequestBackend`: the vLLM
    backends), lockstep otherwise (the hf backend, whose batched turns continue one key-value cache).
    `settings.max_concurrent_episodes` bounds the episodes in play at once: continuous, a finished
    episode frees its slot for the next; lockstep, the rows are played in waves of that size."""

    def __init__(self, env: Environment, tokenizer, backend: GenerationBackend,
                 settings: EpisodeSettings = EpisodeSettings()):
        self.env = env
        self.tokenizer = tokenizer
        self.backend = backend
        self.settings = settings
        self.template_kwargs = settings.template_kwargs
        self.renderer = ChatRenderer(tokenizer, tools=env.tools, template_kwargs=self.template_kwargs)
        # A mixture offers each row its own environment's tools: one renderer per set of tools.
        self._tools_vary = tools_vary_by_row(env)
        self._renderers: dict[str, ChatRenderer] = {}
        self.runner = EpisodeRunner(env, max_turns=settings.max_turns, timeout=settings.env_timeout,
                                    cut_turn=settings.cut_turn, tool_parser=settings.tool_parser)
        self.max_new_tokens = settings.max_new_tokens
        self.max_completion_length = settings.max_completion_length
        self.sampling = settings.sampling
        self.stop_ids = set(backend.stop_ids)
        schedule = settings.schedule
        if schedule == "auto":
            schedule = "continuous" if isinstance(backend, RequestBackend) else "lockstep"
        self.context = ContextKeeper(env, tokenizer, self.runner, settings, self.renderer_for, self.stop_ids)
        self.agents: AgentPlayer | None = None
        if is_agent_environment(env):  # the agent drives its episode: its requests come one at a time
            schedule = "continuous"
            limits = AgentLimits(settings.model_name, self.runner.max_turns, self.context.budgets, settings.tool_parser)
            host, port = settings.agent_address
            self.agents = AgentPlayer(self.runner, tokenizer, limits, renderer_cache(tokenizer, self.template_kwargs),
                                      stop_ids=self.stop_ids, host=host, port=port)
        self.schedule = schedule
        self.max_concurrent_episodes = max(1, settings.max_concurrent_episodes)
        self.on_episode_done: Callable[[RolloutBatch, int], None] | None = None  # see the module docstring

    def _episode_done(self, batch: RolloutBatch, i: int) -> None:
        if self.on_episode_done is not None:
            self.on_episode_done(batch, i)

    def renderer_for(self, episode: Episode) -> ChatRenderer:
        """The renderer of `episode`'s tools: the environment's, or its row's where they vary by row (fixed
        when the episode started, `episode.log.tools`)."""
        if not self._tools_vary:
            return self.renderer
        tools = episode.log.tools if episode.log.tools is not None else tools_for_row(self.env, episode.row)
        key = json.dumps(tools, sort_keys=True, default=str)
        if key not in self._renderers:
            self._renderers[key] = ChatRenderer(self.tokenizer, tools=tools, template_kwargs=self.template_kwargs)
        return self._renderers[key]

    @property
    def max_turns(self) -> int:
        return self.runner.max_turns

    def close(self) -> None:
        if self.agents is not None:
            self.agents.close()
        self.runner.close()

    def __enter__(self) -> RolloutEngine:  # `with RolloutEngine(...) as engine:` closes it however the block ends
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def run(self, rows: list[dict[str, Any]]) -> RolloutBatch:
        # A backend may carry state from one turn of this rollout to the next (the hf backend: its
        # key-value cache), which holds only while the weights stay as they are, i.e. for one rollout.
        # An episode whose server was lost is replayed on its own under the continuous schedule; where
        # it cannot be (a lockstep batch, an agent's requests), the whole rollout is played again.
        while True:
            with self.backend.rollout_session():
                try:
                    return self._run(rows)
                except ReplayEpisode:
                    continue

    def _prompt_ids(self, episodes: list[Episode]) -> list[list[int]]:
        """Each episode's rendered prompt, one batched template call per renderer."""
        by_renderer: dict[int, list[int]] = {}
        renderers = [self.renderer_for(ep) for ep in episodes]
        for i, renderer in enumerate(renderers):
            by_renderer.setdefault(id(renderer), []).append(i)
        ids: list[list[int]] = [[] for _ in episodes]
        for indices in by_renderer.values():
            rendered = renderers[indices[0]].prompt_ids_many([episodes[i].messages for i in indices])
            for i, prompt in zip(indices, rendered):
                ids[i] = prompt
        return ids

    def _run(self, rows: list[dict[str, Any]]) -> RolloutBatch:
        started = time.perf_counter()
        episodes = [self.runner.new_episode(row) for row in rows]
        # Tokenizer and template calls are batched per phase: each call costs more than the texts in it.
        traces = [TokenTrace(prompt_ids=ids) for ids in self._prompt_ids(episodes)]
        batch = RolloutBatch(episodes=episodes, traces=traces, earlier=[[] for _ in episodes])
        bind = getattr(self.backend, "bind_batch", None)
        if bind is not None:  # a backend that writes each episode's turns from the episode (backends/scripted.py)
            bind(batch)
        sample, batcher = open_sampler(self.backend, self.sampling)
        give_policy_turns(episodes, sample, self.renderer_for, self.tokenizer, batch,  # engine/policy_turns.py
                          max_new_tokens=self.max_new_tokens, stop_ids=self.stop_ids)
        try:
            if self.schedule == "continuous":
                self.runner.run(self._continuous(batch, sample))
            else:
                for start in range(0, len(episodes), self.max_concurrent_episodes):
                    self._lockstep(batch, range(start, min(start + self.max_concurrent_episodes, len(episodes))))
        finally:
            if batcher is not None:
                self.runner.run(batcher.close())  # nothing of it runs on after this rollout
            for episode in episodes:
                episode.policy_turn = None
        for i, trace in enumerate(batch.traces):
            if not trace.completion_ids and batch.earlier[i]:  # rewritten, then stopped before a turn
                batch.traces[i] = trace = batch.earlier[i].pop()
            batch.episodes[i].log.sequences = 1 + len(batch.earlier[i])  # a strategy's rewrites and an agent's
            if not trace.completion_ids:
                # An episode that failed before the model's first turn (reset raised) has nothing after
                # its prompt, and TRL indexes the last completion token: give it one EOS, masked out.
                trace.add_env_tokens([self.tokenizer.eos_token_id])
        if self.agents is not None:
            batch.agent_counts = self.agents.take_counts()
        batch.wall_seconds = time.perf_counter() - started
        return batch

    # ------------------------------------------------------------------------ lockstep

    def _lockstep(self, batch: RolloutBatch, wave: range) -> None:
        """One batched generate call per turn for every running episode of the wave, then every reply."""
        runner, context, episodes, traces = self.runner, self.context, batch.episodes, batch.traces
        t0 = time.perf_counter()
        runner.gather(runner.reset(episodes[i]) for i in wave)
        batch.env_seconds += time.perf_counter() - t0
        while True:  # `traces` is `batch.traces`, whose items a rewrite replaces
            limits = {i: context.limit(episodes[i], traces[i]) for i in wave if not episodes[i].done}
            running = [i for i, (left, _) in limits.items() if left > 0]
            if not running:
                break
            max_tokens = max(limits[i][0] for i in running)
            t0 = time.perf_counter()
            prompts = [traces[i].prompt_ids + traces[i].completion_ids for i in running]
            keys = {"episodes": running} if getattr(self.backend, "episode_affinity", False) else {}
            samples = self.backend.generate(prompts, max_tokens, self.sampling, **keys)
            batch.generate_seconds += time.perf_counter() - t0
            batch.generate_calls += 1

            turns = {i: context.record_turn(episodes[i], traces[i], sample, *limits[i]) for i, sample in zip(running, samples)}
            texts = self.tokenizer.batch_decode([turns[i].text_ids for i in running], skip_special_tokens=False,
                                                clean_up_tokenization_spaces=False)
            t0 = time.perf_counter()
            replies = runner.gather(context.answer(batch, i, text, turns[i]) for i, text in zip(running, texts))
            batch.env_seconds += time.perf_counter() - t0

            answered = [(i, context.cut_results(episodes[i], reply)) for i, reply in zip(running, replies) if reply is not None]
            suffixes = self.renderer.encode_many([self.renderer_for(episodes[i]).reply_text(reply, turns[i].ended_with_eos)
                                                  for i, reply in answered])
            t0 = time.perf_counter()
            runner.gather(context.place_reply(batch, i, reply, suffix, turns[i].ended_with_eos)
                          for (i, reply), suffix in zip(answered, suffixes))
            batch.env_seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        runner.gather(runner.score(episodes[i]) for i in wave)
        batch.env_seconds += time.perf_counter() - t0
        for i in wave:
            self._episode_done(batch, i)

    # ------------------------------------------------------------------------ continuous

    async def _continuous(self, batch: RolloutBatch, sample: Draw) -> None:
        """Every episode plays on its own, up to `max_concurrent_episodes` at once, its turns drawn by `sample`."""
        slots = asyncio.Semaphore(self.max_concurrent_episodes)
        generating, answering = BusyClock(), BusyClock()

        async def play_agent(i: int) -> None:
            async def draw(prompt: list[int], max_tokens: int) -> Sample:
                with generating.running():
                    drawn = await sample(i, prompt, max_tokens)
                batch.generate_calls += 1
                return drawn

            async with slots:
                session = await self.agents.play(batch.episodes[i], sample=draw, new_trace=TokenTrace)
            if session.segments:  # the last sequence is the episode's own; earlier ones in `batch.earlier`
                batch.traces[i] = session.segments[-1].trace
                batch.earlier[i] = [segment.trace for segment in session.segments[:-1]]
            self._episode_done(batch, i)

        async def play(i: int) -> None:
            if self.agents is not None:
                return await play_agent(i)
            async with slots:
                while True:
                    try:
                        return await play_once(i)
                    except ReplayEpisode:  # its server was lost: play it again from its start, elsewhere
                        old = batch.episodes[i]
                        batch.episodes[i] = self.runner.new_episode(old.row)
                        batch.episodes[i].policy_turn, old.policy_turn = old.policy_turn, None
                        first = batch.earlier[i][0] if batch.earlier[i] else batch.traces[i]
                        batch.traces[i], batch.earlier[i] = TokenTrace(prompt_ids=first.prompt_ids), []
                        batch.replayed_episodes += 1

        async def play_once(i: int) -> None:
            episode, context = batch.episodes[i], self.context
            with answering.running():
                await self.runner.reset(episode)
            while not episode.done:
                trace = batch.traces[i]  # a rewrite starts a new one
                left, limiter = context.limit(episode, trace)
                if left <= 0:
                    break
                with generating.running():
                    drawn = await sample(i, trace.prompt_ids + trace.completion_ids, left)
                batch.generate_calls += 1
                turn = context.record_turn(episode, trace, drawn, left, limiter)
                text = self.tokenizer.decode(turn.text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                with answering.running():
                    reply = await context.answer(batch, i, text, turn)
                if reply is not None:
                    reply = context.cut_results(episode, reply)
                    (suffix,) = self.renderer.encode_many([self.renderer_for(episode).reply_text(reply, turn.ended_with_eos)])
                    with answering.running():
                        await context.place_reply(batch, i, reply, suffix, turn.ended_with_eos)
            with answering.running():
                await self.runner.score(episode)
            self._episode_done(batch, i)

        tasks = [asyncio.ensure_future(play(i)) for i in range(len(batch.episodes))]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            # One failure (the generation backend gone) ends the rollout: stop the other episodes too,
            # or they would resume on this event loop during the next rollout.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            batch.generate_seconds, batch.env_seconds = generating.seconds, answering.seconds
