"""One agent episode's requests, kept as the token sequences that train (the token rules of an episode).

Each chat-completions request of an episode is either an extension or a new start. An extension sends
the previous request's messages, the reply this endpoint gave, and new messages after it (the usual
agent loop): the new messages are rendered as the chat template's suffix after the model's turn, exactly
as an environment's reply is (engine/chat.py), and the model's sampled tokens stay as sampled. Anything
else (the agent rewrote or summarised its history, changed its tools, or branched) starts a new segment,
rendered from its messages, and counts as a history rewrite. Every segment trains: the last is the
episode's sequence (`RolloutBatch.traces`), the earlier ones (`RolloutBatch.earlier`) become training rows
of their own with the episode's score and advantage (training/step/records.py); their model tokens are
counted in `agent/earlier_segment_tokens`.

Budgets are the run's, applied by the arithmetic environment episodes use (engine/budgets.py):
`--rl-max-new-tokens` per reply (a request's `max_tokens` lowers it, never raises it; a request asking
for more is clipped and counted), `--rl-max-turns` replies, `--rl-max-completion-length` tokens after a
segment's prompt, the context window (`--rl-context-window`, else the tokenizer's), and
`--rl-max-episode-tokens` model tokens over all segments. A request whose new messages leave no room for
a reply, a new segment whose prompt fills the window, and a request past a budget get an empty reply
with `finish_reason` "length", which ends an agent loop; the episode is marked truncated with the stop
reason an environment's episode would get (`max_turns`, `completion_budget`, `context`). An agent that
answers by sending a shorter history (a new segment that fits) goes on. Tool and user messages after the
model's first turn longer than `--rl-max-tool-result-tokens` are cut in the sequence the model sees, as
an environment's replies are (`episode.log.tool_results_cut`, once per segment that holds them); the
agent's own copy is not, and requests are still compared with what it sent. Sampling settings other than
`max_tokens` and `stop` stay the run's (the loss assumes the run's temperature); requests that asked for
others are counted in `agent/ignored_sampling`.

A streamed request (`stream: true`) is answered the same way; the endpoint sends the finished reply as
stream events (agent_messages.stream_events).

Left out: `n > 1` and logprobs in the response (both refused by the endpoint), streaming token by token,
and context strategies (`--rl-context` other than keep is refused for agents: engine/context.py).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aitrain_grpo.engine.agent_messages import (EndpointError, check_messages, completion_body, meaning,
                                                reply_message, template_messages)
from aitrain_grpo.engine.backends.base import Sample
from aitrain_grpo.engine.budgets import Budgets
from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.engine.tool_parsers import ParsedTurn, read_tool_calls, tool_names_of
from aitrain_grpo.env.base import Episode

_HERMES_BLOCK = re.compile(r"\s*<tool_call>.*?</tool_call>\s*", re.DOTALL)
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty", "seed")

_PROSE = ParsedTurn([], [], None)
Sampler = Callable[[list[int], int], Awaitable[Sample]]
Policy = Callable[[Episode], str]


@dataclass
class AgentLimits:
    """The run's budgets and reading rules, as the endpoint applies them to each request (`budgets`
    None: text-level play, where no tokens are counted)."""

    model_name: str
    max_turns: int
    budgets: Budgets | None = None
    tool_parser: str = "auto"


@dataclass
class Segment:
    """One training sequence of an agent episode (see TokenTrace in engine/rollout.py for the fields)."""

    trace: Any
    tools_key: str
    previous: list[str] = field(default_factory=list)  # the meanings of the last request + our reply
    ended_with_eos: bool = True


def _native(renderer: ChatRenderer) -> bool:
    """Whether the renderer's template shows tools itself (and so renders `tool_calls` it is given)."""
    return renderer.tools_route is not None and renderer.tools_route.startswith("tools reach")


@dataclass
class Activity:
    """Requests being answered across a player's sessions, and when the latest ended (`idle_for`)."""

    in_flight: int = 0
    last_reply: float = 0.0


class AgentSession:
    """The requests of one episode. `sample` draws a model turn from token ids (training, eval); without
    it, `policy` writes each reply as text (an environment's `solve`, for env check and sft)."""

    def __init__(self, episode: Episode, limits: AgentLimits, tokenizer, renderer_for: Callable[[list | None], ChatRenderer] | None,
                 *, sample: Sampler | None = None, policy: Policy | None = None, stop_ids=(), new_trace=None,
                 activity: Activity | None = None):
        self.episode, self.limits, self.tokenizer = episode, limits, tokenizer
        self.renderer_for, self.sample, self.policy = renderer_for, sample, policy
        self.stop_ids = set(stop_ids)
        self.new_trace = new_trace
        self.segments: list[Segment] = []
        self._raw_replies: dict[str, str] = {}  # meaning of a reply we gave -> the model's own text
        self._text_previous: list[str] | None = None  # text-level sessions: extension check only
        self.counts = {"requests": 0, "history_rewrites": 0, "clipped_requests": 0, "ignored_sampling": 0}
        self.closed = False
        # An exception raised while answering (the backend gone, the oracle raising): the agent only sees an
        # error response, so the episode's player re-raises or reports this one.
        self.failure: BaseException | None = None
        self.activity = activity or Activity()
        self.idle_since = time.monotonic()  # when this episode's last request was answered (or it started)

    # ------------------------------------------------------------------------------- a request

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.activity.in_flight += 1
        try:
            return await self._complete(body)
        finally:
            self.activity.in_flight -= 1
            self.activity.last_reply = self.idle_since = time.monotonic()

    def idle_for(self) -> float:
        """Seconds the agent's own code has run since a reply (0 while any episode's request is answered):
        the time `AgentPlayer` bounds by `--rl-env-timeout`, the environment's side of an agent episode.
        Counted from the latest reply to any episode of the player, so an agent that waited for the event
        loop while the model generated for the others is not counted idle."""
        if self.activity.in_flight:
            return 0.0
        return time.monotonic() - max(self.idle_since, self.activity.last_reply)

    async def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.closed:
            raise EndpointError(409, "this episode has been scored; its requests are closed", code="episode_closed")
        model = body.get("model")
        if model != self.limits.model_name:
            raise EndpointError(404, f"the model {model!r} does not exist here; this run serves "
                                     f"{self.limits.model_name!r}", code="model_not_found", param="model")
        if body.get("n", 1) not in (1, None):
            raise EndpointError(400, "n must be 1 (each request is one turn of one episode)", param="n")
        if body.get("logprobs") or body.get("top_logprobs"):
            raise EndpointError(400, "logprobs are not returned by the aitrain endpoint (the trainer keeps the "
                                     "sampled tokens' own); send logprobs=false", param="logprobs")
        messages = check_messages(body.get("messages"))
        tools = body.get("tools") or None
        self.counts["requests"] += 1
        if any(body.get(key) is not None for key in _SAMPLING_KEYS):
            self.counts["ignored_sampling"] += 1
        if self.episode.turns >= self.limits.max_turns:
            return self._out_of_budget("max_turns")
        renderer = self.renderer_for(tools) if self.renderer_for is not None else None
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else [s for s in stops if isinstance(s, str) and s]
        if self.sample is None:
            return self._policy_reply(messages, tools, renderer)
        return await self._model_reply(messages, tools, renderer, asked, stops)

    def _out_of_budget(self, reason: str) -> dict[str, Any]:
        self.episode.truncated = True
        self.episode.stop_reason = self.episode.stop_reason or reason
        return completion_body(self.limits.model_name, reply_message("", []), "length", 0, 0)

    # ------------------------------------------------------------------------------- model replies

    def _extends(self, segment: Segment | None, meanings: list[str], tools_key: str) -> bool:
        if segment is None or segment.tools_key != tools_key:
            return False
        n = len(segment.previous)
        return len(meanings) > n and meanings[:n] == segment.previous

    def _cut_results(self, messages: list, start: int) -> tuple[list, int]:
        """`messages` with those from `start` on that are not the model's cut to `--rl-max-tool-result-tokens`,
        and how many were cut."""
        at = [i for i in range(start, len(messages)) if messages[i].get("role") != "assistant"]
        cut, count = self.limits.budgets.cut_results([messages[i] for i in at], self.tokenizer)
        out = list(messages)
        for i, message in zip(at, cut):
            out[i] = message
        return out, count

    async def _model_reply(self, messages, tools, renderer: ChatRenderer, asked, stops) -> dict[str, Any]:
        budgets, log = self.limits.budgets, self.episode.log
        if budgets.episode_spent(log.model_tokens):
            return self._out_of_budget("completion_budget")
        meanings = [meaning(m) for m in messages]
        tools_key = repr(tools)
        segment = self.segments[-1] if self.segments else None
        rendered = template_messages(messages, native_calls=_native(renderer), raw_replies=self._raw_replies)
        if self._extends(segment, meanings, tools_key):
            new, cut = self._cut_results(rendered[len(segment.previous):], 0)
            suffix = renderer.reply_ids(new, segment.ended_with_eos)
            over = budgets.reply_overflow(segment.trace, len(suffix))
            if over:
                return self._out_of_budget(over)
            segment.trace.add_env_tokens(suffix)
            self.episode.messages.extend(new)
        else:
            if segment is not None:
                self.counts["history_rewrites"] += 1
            first = next((i for i, m in enumerate(rendered) if m["role"] == "assistant"), len(rendered))
            rendered, cut = self._cut_results(rendered, first)  # the task is not a result: only what answers the model
            prompt = renderer.prompt_ids(rendered)
            if not budgets.fits_window(len(prompt)):
                return self._out_of_budget("context")
            segment = Segment(self.new_trace(prompt), tools_key)
            self.segments.append(segment)
            self.episode.messages = list(rendered)
        log.tool_results_cut += cut
        trace = segment.trace
        limit, reason = budgets.turn_limit(trace, log.model_tokens)
        if limit <= 0:
            return self._out_of_budget(reason)
        if isinstance(asked, int) and asked > 0:
            if asked > limit:
                self.counts["clipped_requests"] += 1
            limit = min(limit, asked)
        drawn = await self.sample(trace.prompt_ids + trace.completion_ids, limit)
        ids, logprobs, finish = list(drawn.token_ids[:limit]), list(drawn.logprobs[:limit]), drawn.finish_reason
        if len(drawn.token_ids) > limit:
            finish = "length"
        ended_with_eos = bool(ids) and ids[-1] in self.stop_ids
        text_ids = ids[:-1] if ended_with_eos else ids
        text = self._decode(text_ids)
        cut = self._stop_at(text_ids, text, stops)
        if cut is not None:
            keep, text = cut
            ids, logprobs, ended_with_eos, finish = ids[:keep], logprobs[:keep], False, "stop"
        trace.add_model_tokens(ids, logprobs)
        log.model_tokens += len(ids)
        segment.ended_with_eos = ended_with_eos
        if finish != "stop":
            self.episode.truncated_turns += 1
        message = self._record(text, tools, finish)
        segment.previous = meanings + [meaning(message["message"])]
        return completion_body(self.limits.model_name, message["message"], message["finish_reason"],
                               len(trace.prompt_ids), len(ids))

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _stop_at(self, ids: list[int], text: str, stops: list[str]) -> tuple[int, str] | None:
        """Where a `stop` string first appears: the sampled tokens up to the one that completes it, and
        the text before it; None when no stop string appears."""
        hits = [at for at in (text.find(s) for s in stops) if at >= 0]
        if not hits:
            return None
        at = min(hits)
        low, high = 1, len(ids)  # the fewest tokens whose text reaches past the stop string's start
        while low < high:
            mid = (low + high) // 2
            if len(self._decode(ids[:mid])) > at:
                high = mid
            else:
                low = mid + 1
        return low, text[:at]

    # ------------------------------------------------------------------------------- text replies

    def _policy_reply(self, messages, tools, renderer: ChatRenderer | None) -> dict[str, Any]:
        meanings = [meaning(m) for m in messages]
        previous = self._text_previous
        if previous is not None and not (len(meanings) > len(previous) and meanings[:len(previous)] == previous):
            self.counts["history_rewrites"] += 1
        native = renderer is not None and _native(renderer)
        self.episode.messages = template_messages(messages, native_calls=native, raw_replies=self._raw_replies)
        self.episode.state["agent_tools"] = tools or []
        text = self.policy(self.episode)
        if not isinstance(text, str):
            raise TypeError(f"solve returned {type(text).__name__}, not the text of the next message")
        message = self._record(text, tools, "stop")
        self._text_previous = meanings + [meaning(message["message"])]
        return completion_body(self.limits.model_name, message["message"], "stop", 0, 0)

    # ------------------------------------------------------------------------------- both

    def _record(self, text: str, tools, finish: str) -> dict[str, Any]:
        """Read the reply's tool calls, add the turn to the episode, and build the response message."""
        episode = self.episode
        # A request without tools gets text back, as from any OpenAI server, whatever the text looks like.
        parsed = read_tool_calls(text, self.limits.tool_parser, tool_names_of(tools)) if tools else _PROSE
        episode.messages.append({"role": "assistant", "content": text})
        episode.turns += 1
        episode.tool_calls, episode.tool_call_errors = parsed.calls, parsed.problems
        episode.log.turn_read(parsed, unreadable_are_errors=True)  # no step answers them: they are errors now
        content: str | None = text
        if parsed.calls:
            content = _HERMES_BLOCK.sub("\n", text).strip() if parsed.form == "hermes" else ""
            content = content or None
        message = reply_message(content, parsed.calls)
        self._raw_replies[meaning(message)] = text
        if parsed.calls and finish == "stop":
            finish = "tool_calls"
        return {"message": message, "finish_reason": finish}

    def earlier_segment_tokens(self) -> int:
        """Model tokens of the segments before the last (trained as rows of their own: training/step/records.py)."""
        return sum(sum(s.trace.env_mask) for s in self.segments[:-1])


__all__ = ["AgentLimits", "AgentSession", "Segment"]
