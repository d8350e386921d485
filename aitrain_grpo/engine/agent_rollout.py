"""Playing an agent environment's episode: its `rollout(client, row)` against the run's endpoint.

The rollout engine hands each episode of an `AgentEnvironment` (env/agent.py) to `AgentPlayer.play`,
which opens a session on the endpoint (engine/agent_endpoint.py), gives the agent a client whose base
URL names that session, awaits the agent, and scores the episode with what it returned. The same player
serves text-level play (`policy`: an environment's `solve`), which is how env check and sft run agents.

Faults are an episode's, as for any environment: a rollout that raises (or returns a score outside
[0, 1]) scores 0 with the error recorded as `<Class>.rollout raised ...`; an oracle that raises is named
by the runner's `policy_name`. A generation backend that is gone (`GenerationBackendError`) is the run's
fault, not the episode's, and is raised to stop training as it would from any episode.

A sync `rollout` (agent code on a blocking client) runs in a worker thread with a blocking
`openai.OpenAI` client; an async one gets `openai.AsyncOpenAI`. Either carries `client.model`, the name
the endpoint serves.

Waits: each reply the agent waits for is bounded by the run's budgets; the agent's own code between replies
(its tools, a sandbox) by `--rl-env-timeout`, as any environment call is: past it the episode fails with
that named (`AgentIdle`). Left out: a timeout on the whole rollout (a long episode of quick steps is fine).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import TYPE_CHECKING, Callable

from aitrain_grpo.engine.agent_endpoint import LOCAL_HOST, AgentEndpoint
from aitrain_grpo.engine.agent_session import Activity, AgentLimits, AgentSession, Policy, Sampler
from aitrain_grpo.engine.backends.base import GenerationBackendError
from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.env.agent import AGENT_SCORE_KEY, split_result
from aitrain_grpo.env.base import Episode
from aitrain_grpo.errors import ConfigError

if TYPE_CHECKING:  # the runner hands itself in: this module is below it (runner.play_text plays agents here)
    from aitrain_grpo.engine.runner import EpisodeRunner

class AgentIdle(Exception):
    """The agent's own code went `--rl-env-timeout` seconds without a request (`AgentPlayer._watched`)."""


# Seconds a client waits for one reply: a CPU turn of a full batch can take minutes.
CLIENT_TIMEOUT_S = 3600.0


def agent_client(base_url: str, key: str, model: str, *, blocking: bool = False, http_client=None):
    """An OpenAI client (async, or `blocking`) for one episode, with `client.model` set. `http_client`, when
    given, is shared: an OpenAI client builds its own otherwise, with a TLS context that takes ~40 ms."""
    openai = _openai()
    cls = openai.OpenAI if blocking else openai.AsyncOpenAI
    client = cls(base_url=base_url, api_key=key, max_retries=0, timeout=CLIENT_TIMEOUT_S, http_client=http_client)
    client.model = model
    return client


def _openai():
    try:
        import openai
    except ImportError:
        raise ConfigError("agent environments need the openai package; pip install 'aitrain-grpo[agents]'") from None
    return openai


class AgentPlayer:
    """Plays agent episodes for one engine (or one text-level runner); owns the endpoint."""

    def __init__(self, runner: EpisodeRunner, tokenizer, limits: AgentLimits,
                 renderer_for: Callable[[list | None], ChatRenderer] | None, *, stop_ids=(),
                 host: str = LOCAL_HOST, port: int = 0, allow_remote: bool | None = None):
        self.runner, self.tokenizer, self.limits = runner, tokenizer, limits
        self.renderer_for, self.stop_ids = renderer_for, stop_ids
        self.endpoint = AgentEndpoint(limits.model_name, host=host, port=port, allow_remote=allow_remote)
        self.counts: dict[str, int] = {}
        self.activity = Activity()  # requests in flight across this player's episodes (AgentSession.idle_for)
        self._http: dict[bool, object] = {}  # one HTTP client (blocking or not) shared by the episodes' clients

    def _http_client(self, blocking: bool):
        if blocking not in self._http:
            openai = _openai()
            timeout = openai.Timeout(CLIENT_TIMEOUT_S)
            self._http[blocking] = (openai.DefaultHttpxClient(timeout=timeout) if blocking
                                    else openai.DefaultAsyncHttpxClient(timeout=timeout))
        return self._http[blocking]

    async def play(self, episode: Episode, *, sample: Sampler | None = None, policy: Policy | None = None,
                   new_trace=None) -> AgentSession:
        """Play one episode to its score; return its session (the token segments and counts)."""
        await self.endpoint.start()
        env, runner = self.runner.env, self.runner
        session = AgentSession(episode, self.limits, self.tokenizer, self.renderer_for, sample=sample,
                               policy=policy, stop_ids=self.stop_ids, new_trace=new_trace, activity=self.activity)
        key = self.endpoint.open(session)
        blocking = not inspect.iscoroutinefunction(env.rollout)
        client = agent_client(self.endpoint.base_url(key), key, self.limits.model_name, blocking=blocking,
                              http_client=self._http_client(blocking))
        try:
            if blocking:
                work = runner.loop.run_in_executor(runner.executor, env.rollout, client, episode.row)
            else:
                work = asyncio.ensure_future(env.rollout(client, episode.row))
            result = await self._watched(work, session, runner.timeout)
            score, metrics = split_result(result)
            episode.state[AGENT_SCORE_KEY] = score
            episode.metrics.update(metrics)
        except AgentIdle as idle:
            runner._fail(episode, "rollout", idle)
            episode.error = f"{type(env).__name__}.rollout {idle}"
        except Exception as exc:
            if not isinstance(session.failure, GenerationBackendError):
                runner._fail(episode, "rollout", exc)
        finally:
            self.endpoint.close_session(key)  # the client stays open: its HTTP client is shared
        if isinstance(session.failure, GenerationBackendError):
            raise session.failure
        if session.failure is not None and episode.error is None:
            runner._fail(episode, runner.policy_name if policy else "rollout", session.failure)
        episode.done = True
        episode.stop_reason = episode.stop_reason or "env"
        session.counts["earlier_segment_tokens"] = session.earlier_segment_tokens()
        for name, value in session.counts.items():
            self.counts[name] = self.counts.get(name, 0) + value
        await runner.score(episode)
        return session

    @staticmethod
    async def _watched(work: asyncio.Future, session: AgentSession, limit: float | None):
        """`work`'s result, or `AgentIdle` once the agent's own code has gone `limit` seconds (--rl-env-timeout)
        without a request since the last reply: a hung tool or sandbox inside the agent once held the
        whole rollout without a word. An async rollout is cancelled; a blocking one's thread runs on, its
        client's next request refused once the session closes."""
        if not limit:
            return await work
        while True:
            done, _ = await asyncio.wait({work}, timeout=max(limit - session.idle_for(), 0.05))
            if done:
                return work.result()
            if session.idle_for() >= limit:
                work.cancel()
                raise AgentIdle(f"made no request for {limit:g}s after the model's last reply (--rl-env-timeout "
                                f"{limit:g}s); the agent's own code (a tool, a sandbox, a lock) is waiting on "
                                f"something, or raise the timeout")

    def take_counts(self) -> dict[str, int]:
        """The counts summed over the episodes played since the last call (logged as `agent/<name>`)."""
        counts, self.counts = self.counts, {}
        return counts

    def close(self) -> None:
        if self.runner.loop.is_closed():
            return
        for blocking, http in self._http.items():
            self.runner.run(http.aclose()) if not blocking else http.close()
        self._http = {}
        self.runner.run(self.endpoint.close())


def play_agent_text(runner: EpisodeRunner, rows: list[dict], policy: Policy) -> list[Episode]:
    """`play_text` for an agent environment: each request answered by `policy` (runner.play_text)."""
    limits = AgentLimits("policy", runner.max_turns, tool_parser=runner.tool_parser)
    player = AgentPlayer(runner, None, limits, None)
    episodes = [runner.new_episode(row) for row in rows]
    try:
        runner.gather(player.play(episode, policy=policy) for episode in episodes)
    finally:
        player.close()
    return episodes


def renderer_cache(tokenizer, template_kwargs: dict | None) -> Callable[[list | None], ChatRenderer]:
    """One `ChatRenderer` per set of tools a request sends, built once."""
    renderers: dict[str, ChatRenderer] = {}

    def renderer_for(tools: list | None) -> ChatRenderer:
        key = json.dumps(tools or [], sort_keys=True, default=str)
        if key not in renderers:
            renderers[key] = ChatRenderer(tokenizer, tools=tools or None, template_kwargs=template_kwargs)
        return renderers[key]

    return renderer_for


__all__ = ["AgentPlayer", "agent_client", "renderer_cache", "CLIENT_TIMEOUT_S"]
