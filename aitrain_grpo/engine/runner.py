"""The environment side of an episode: reset, answering each model turn, scoring, and fault handling.

`EpisodeRunner` is shared by the token-level `RolloutEngine` (training and evaluation) and by
text-level players (scripted turns, an environment's `solve` oracle), so every path through an episode
treats environments the same way: calls run concurrently on one event loop (async methods awaited,
sync ones in a thread pool), each call has a timeout, and an exception, a timeout or a bad return value
ends that episode with score 0 and `episode.error` naming the method, instead of stopping training.
It records how long each `step` call took (`step_seconds`), and names a failing text-level policy by
its label (`policy_name`, e.g. "solve" for the oracle), so callers need not wrap the environment.

Left out: tokens and budgets on tokens (the engine's job), and retries (a failed call is final).
"""

from __future__ import annotations

import asyncio
import copy
import decimal
import inspect
import math
import numbers
import time
from typing import Any, Awaitable, Callable, Iterable

from aitrain_grpo.config import DEFAULT_CUT_TURN, DEFAULT_TOOL_PARSER
from aitrain_grpo.engine.agent_rollout import play_agent_text
from aitrain_grpo.engine.env_threads import EnvCallPool
from aitrain_grpo.engine.policy_turns import text_policy_turn
from aitrain_grpo.engine.tool_parsers import read_tool_calls, tool_names_of
from aitrain_grpo.env.agent import is_agent_environment
from aitrain_grpo.env.base import MESSAGE_ROLES, Environment, Episode, Message, prompt_messages, tools_for_row, tools_vary_by_row

VALID_REPLY_ROLES = ("user", "tool", "system")


class EpisodeRunner:
    """Drives `Environment` calls for many episodes at once, on one long-lived event loop."""

    def __init__(
        self,
        env: Environment,
        *,
        max_turns: int | None = None,
        timeout: float | None = 60.0,
        workers: int = 64,
        tool_parser: str = DEFAULT_TOOL_PARSER,
        policy_name: str = "policy",
        cut_turn: str = DEFAULT_CUT_TURN,
    ):
        self.env = env
        # A model turn cut off by its token limit: "end" the episode there, or "continue" (the
        # environment answers the cut turn as it stands, and `episode.truncated_turns` counts it).
        self.cut_turn = cut_turn
        # How `episode.error` names a text-level policy that raises ("HotelEnv.solve raised ...").
        self.policy_name = policy_name
        # Seconds each `step` call took, in the order they finished (timeouts and failures included).
        self.step_seconds: list[float] = []
        env_cap = int(getattr(env, "max_turns", 10) or 10)
        self.max_turns = min(env_cap, max_turns) if max_turns else env_cap
        self.timeout = timeout
        # How tool calls are read from a turn (engine/tool_parsers.py), and the names `auto` accepts.
        self.tool_parser = tool_parser
        self.tools = list(env.tools)
        self.tool_names = tool_names_of(self.tools)
        self._tools_vary = tools_vary_by_row(env)  # a mixture: each row's own environment's tools
        self.loop = asyncio.new_event_loop()
        # The default executor has min(32, cores + 4) threads: six on these machines, which would
        # serialise a batch of slow sync environments. One thread per concurrent episode instead; the pool
        # knows which of its threads are inside a call (engine/env_threads.py: what a finished run waits for).
        self.executor = EnvCallPool(workers)
        self.loop.set_default_executor(self.executor)

    def close(self) -> None:
        # What is still pending (an agent framework's idle keep-alive connection to the endpoint) is
        # cancelled and finished first, as asyncio.run does: a loop closed under it warns at exit.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.loop.close()

    def __enter__(self) -> EpisodeRunner:  # `with EpisodeRunner(...) as runner:` closes it however the block ends
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -------------------------------------------------------------------------------- plumbing

    def run(self, awaitable: Awaitable) -> Any:
        return self.loop.run_until_complete(awaitable)

    def gather(self, coroutines: Iterable[Awaitable]) -> list[Any]:
        async def _all():
            return await asyncio.gather(*coroutines)

        return self.run(_all())

    async def _call(self, method: str, func: Callable, *args) -> Any:
        """Call an environment method (sync or async) with the timeout; exceptions propagate."""
        # asyncio.timeout rather than wait_for: no extra task per call, and a batch makes hundreds.
        async with asyncio.timeout(self.timeout or None):
            if inspect.iscoroutinefunction(func):
                result = await func(*args)
            else:
                result = await self.loop.run_in_executor(self.executor, func, *args)
            # A sync method may still hand back an awaitable (e.g. ToolEnvironment.no_tool_call).
            return await result if inspect.isawaitable(result) else result

    def _fail(self, episode: Episode, method: str, exc: BaseException) -> None:
        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
            detail = f"timed out after {self.timeout:g}s"
        elif isinstance(exc, BadReturnValue):
            detail = str(exc)
        else:
            detail = f"raised {type(exc).__name__}: {exc}"
        episode.error = f"{type(self.env).__name__}.{method} {detail}".replace("\n", " ")
        if episode.stop_reason is None:  # a score_episode failure keeps the reason the episode ended for
            episode.stop_reason = "error"
        episode.done = True
        episode.score = 0.0

    # -------------------------------------------------------------------------------- episodes

    def new_episode(self, row: dict[str, Any]) -> Episode:
        """A fresh episode of `row`, its tools fixed now (`episode.log.tools`, the names calls are read against)."""
        # Its own copy of the row, as training's samples are: what reset or step change in it stays in this
        # episode (env check's next policy, a group's next episode, start from the row as built).
        try:
            row = copy.deepcopy(row)
        except Exception:  # a value that cannot be copied (rows that Arrow stored always can): a shallow copy
            row = dict(row)
        episode = Episode(row=row, messages=prompt_messages(row["prompt"]), max_turns=self.max_turns)
        if self._tools_vary:
            episode.log.tools = tools_for_row(self.env, row)
            episode.log.tool_names = tool_names_of(episode.log.tools)
        else:
            episode.log.tools, episode.log.tool_names = self.tools, self.tool_names
        return episode

    async def reset(self, episode: Episode) -> None:
        if type(self.env).reset is Environment.reset:
            return  # the base class's reset does nothing: skip the round trip to a worker thread
        try:
            await self._call("reset", self.env.reset, episode)
        except Exception as exc:
            self._fail(episode, "reset", exc)
            return
        # reset may lower the episode's turn cap, never raise it past the run's (--rl-max-turns, the class's).
        cap = episode.max_turns
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            self._fail(episode, "reset", BadReturnValue(f"set episode.max_turns to {cap!r}; set an integer from 1 to "
                                                        f"{self.max_turns} (the run's cap), or leave it as it is"))
        elif cap > self.max_turns:
            episode.max_turns = self.max_turns

    async def respond(self, episode: Episode, completion: str, *, cut_off: bool = False) -> list[Message] | None:
        """Record a model turn and get the environment's reply (not yet appended to the conversation).

        Returns None when the episode is over: the environment ended it, a budget did (`cut_off`:
        the turn hit its token limit, unless `cut_turn` is "continue"; or the turn cap), or a call failed."""
        episode.messages.append({"role": "assistant", "content": completion})
        episode.turns += 1
        if cut_off:
            if self.cut_turn == "end":
                episode.truncated = True
                episode.done = True
                episode.stop_reason = "turn_tokens"
                return None
            episode.truncated_turns += 1
        names = self.tool_names if episode.log.tool_names is None else episode.log.tool_names
        parsed = read_tool_calls(completion, self.tool_parser, names)
        episode.tool_calls, episode.tool_call_errors = parsed.calls, parsed.problems
        episode.log.turn_read(parsed)  # a ToolEnvironment's step counts the unreadable ones as errors
        started = time.perf_counter()
        try:
            reply = await self._call("step", self.env.step, episode, completion)
            reply = normalize_reply(reply)
        except Exception as exc:
            self._fail(episode, "step", exc)
            return None
        finally:
            self.step_seconds.append(time.perf_counter() - started)
        if reply is None:
            episode.done = True
            episode.stop_reason = "env"
            return None
        if episode.turns >= (episode.max_turns or self.max_turns):
            # The environment wanted to go on; the turn cap (which `reset` may have lowered) stops it.
            episode.truncated = True
            episode.done = True
            episode.stop_reason = "max_turns"
            return None
        return reply

    def accept(self, episode: Episode, reply: list[Message]) -> None:
        episode.messages.extend(reply)

    async def compact(self, episode: Episode) -> list[Message] | None:
        """The environment's `compact(episode)` (the "compact" context strategy, engine/context.py): the
        messages the episode goes on from, or None. A hook that raises, times out or returns something
        else ends the episode as an error (`episode.error`) and gives None."""
        try:
            return normalize_messages(await self._call("compact", self.env.compact, episode))
        except Exception as exc:
            self._fail(episode, "compact", exc)
            return None

    async def score(self, episode: Episode) -> float:
        if episode.error is not None:
            episode.score = 0.0
            return 0.0
        try:
            value = await self._call("score_episode", self.env.score_episode, episode)
            episode.score = check_score(value)
        except Exception as exc:
            self._fail(episode, "score_episode", exc)
        return episode.score


class BadReturnValue(ValueError):
    """An environment method returned something outside the contract."""


def normalize_reply(reply: Any) -> list[Message] | None:
    """`step`'s return value as a list of messages, or None to end the episode."""
    if reply is None:
        return None
    if isinstance(reply, str):
        return [{"role": "user", "content": reply}]
    if isinstance(reply, dict):
        reply = [reply]
    if not isinstance(reply, list):
        raise BadReturnValue(f"returned {type(reply).__name__}; return a string, a list of messages, or None")
    if not reply:
        raise BadReturnValue("returned an empty list; return None to end the episode")
    messages = []
    for message in reply:
        if not isinstance(message, dict) or message.get("role") not in VALID_REPLY_ROLES:
            raise BadReturnValue(f"returned a message {str(message)[:80]!r}; each needs a role of {VALID_REPLY_ROLES}")
        content = message.get("content")
        if not isinstance(content, str):
            raise BadReturnValue(f"returned a {message['role']} message whose content is {type(content).__name__}, not str")
        messages.append(dict(message))
    return messages


def normalize_messages(value: Any) -> list[Message] | None:
    """`compact`'s return value: None, or a non-empty list of messages with text content that the model
    answers next (not ending with its own turn)."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise BadReturnValue(f"returned {str(value)[:80]!r}; return a non-empty list of messages, or None")
    for message in value:
        if not isinstance(message, dict) or message.get("role") not in MESSAGE_ROLES or not isinstance(message.get("content"), str):
            raise BadReturnValue(f"returned a message {str(message)[:80]!r}; each needs a role of {MESSAGE_ROLES} and text content")
    if value[-1]["role"] == "assistant":
        raise BadReturnValue("returned messages that end with an assistant turn; end with the message the model answers")
    return [dict(m) for m in value]


def check_score(value: Any) -> float:
    """A score must be a finite number in [0, 1]; anything else is the environment's error."""
    if not isinstance(value, (int, float)) and callable(getattr(value, "item", None)):
        # numpy and torch scalars (and one-element tensors) are numbers too, read through `.item()`.
        try:
            value = value.item()
        except (ValueError, RuntimeError, TypeError):  # several elements: reported as not a number below
            pass
    if isinstance(value, (numbers.Rational, decimal.Decimal)) and not isinstance(value, (bool, int)):
        value = float(value)  # a Fraction or a Decimal (an exact grader's arithmetic): its nearest float
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadReturnValue(f"returned {type(value).__name__} {str(value)[:40]!r}, not a number in [0, 1]")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise BadReturnValue(f"returned {value!r}, outside [0, 1]")
    return float(value)


def play_text(runner: EpisodeRunner, rows: list[dict[str, Any]], policy: Callable[[Episode], str]) -> list[Episode]:
    """Play episodes at the text level with `policy(episode) -> next assistant message` standing in
    for the model (scripted tests, an environment's `solve` oracle, an always-empty policy); it also answers
    the turns the environment asks of the policy (`episode.policy_turn`, engine/policy_turns.py). A policy
    that raises ends its episode like an environment fault, named `runner.policy_name`. An agent
    environment's episodes are its own code's requests, each answered by `policy` (agent_rollout.py)."""
    if is_agent_environment(runner.env):
        return play_agent_text(runner, rows, policy)
    episodes = [runner.new_episode(row) for row in rows]
    for ep in episodes:  # an environment that asks for the policy's turns (a self-play opponent) gets `policy`'s
        ep.policy_turn = text_policy_turn(policy, ep)
    runner.gather(runner.reset(ep) for ep in episodes)

    async def one(ep: Episode) -> None:
        while not ep.done:
            try:
                text = policy(ep)
            except Exception as exc:  # a broken policy is reported like an environment fault
                runner._fail(ep, runner.policy_name, exc)
                return
            reply = await runner.respond(ep, text)
            if reply is not None:
                runner.accept(ep, reply)
        await runner.score(ep)

    runner.gather(one(ep) for ep in episodes if not ep.done)
    for ep in episodes:
        ep.policy_turn = None
        if ep.score is None:
            ep.score = 0.0
    return episodes


def oracle_policy(env: Environment) -> Callable[[Episode], str]:
    """The environment's `solve` as a text-level policy (env check's oracle, sft's demonstrations)."""
    def policy(episode: Episode) -> str:
        message = env.solve(episode)
        if inspect.iscoroutine(message):
            message.close()  # never awaited: the policy is called where nothing can await it
            raise BadReturnValue("is async def; make it a plain def returning the text of the next message (only "
                                 "reset, step and score_episode may be async)")
        if not isinstance(message, str):
            raise BadReturnValue(f"returned {type(message).__name__}, not the text of the next message")
        return message

    return policy


def play(
    env: Environment,
    rows: list[dict[str, Any]],
    policy: Callable[[Episode], str],
    *,
    max_turns: int | None = None,
    timeout: float | None = 60.0,
    policy_name: str = "policy",
    tool_parser: str = DEFAULT_TOOL_PARSER,
) -> list[Episode]:
    """`play_text` on a runner of its own, closed afterwards."""
    with EpisodeRunner(env, max_turns=max_turns, timeout=timeout, policy_name=policy_name, tool_parser=tool_parser) as runner:
        return play_text(runner, rows, policy)
