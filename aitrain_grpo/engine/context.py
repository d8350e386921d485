"""An environment episode's token budgets and its context strategy: how its history is kept as it
outgrows the context.

The budgets are engine/budgets.py's, the arithmetic agent episodes share: the tokens of one model turn
(`max_new_tokens`), the model tokens of the whole episode (`max_episode_tokens`, summed over its
sequences), and what one sequence may hold: its completion (`max_completion_length`, what TRL pads each
training row to) and the model's context window (prompt plus completion). Before each turn
`ContextKeeper.limit` gives the turn the smallest of what is left; at 0 the episode stops, scored as it
stands, with the reason of the limit that ran out (`turn_tokens`, `completion_budget`, or `context` for
the window). A tool or environment result longer than `max_tool_result_tokens` is cut to its head and
tail with a marker between (`episode.log.tool_results_cut`).

The strategy (`--rl-context`, else the environment's `context_strategy`, else `compact` where it has the
hook, else `keep`) decides what happens when an environment reply would make the sequence too long. It is
per episode: a mixture's episode has its own member's strategy and hook (`resolve_strategies`), so a
long-horizon environment can summarize while a short one beside it keeps; `--rl-context` wins over all.
- `keep`: nothing; an episode that no longer fits stops (`completion_budget` or `context`).
- `drop-tool-results`: once the rendered context passes the threshold (or the next turn would not fit),
  every tool result but the last `context_keep_last` becomes a short stub (`DROPPED`).
- `summarize`: past the threshold, the reply is followed by a request for a summary (`SUMMARY_REQUEST`);
  the model's next turn, sampled like any turn under the same weights and sampler, is that summary, a
  model turn (mask 1) of the sequence it was asked in; the episode goes on from the task (the messages
  before the first model turn), the summary as an assistant turn and `SUMMARY_FOLLOW_UP`. The summary turn
  has its own token limit (`context_summary_tokens`, default the larger of `SUMMARY_TOKENS` and
  `max_new_tokens`: a short per-turn limit would cut most summaries), still bounded by the window and the
  budgets; a summary cut off ends the episode as an error.
- `compact`: the environment's `compact(episode)` hook, after every reply; None goes on unchanged. A hook
  that raises or returns something else ends that episode as an error, never the run.

A rewrite ends the episode's current `TokenTrace` (moved to `batch.earlier[i]`) and starts a new one
whose prompt is the chat template of the rewritten messages; sampled tokens stay in the sequence they
were sampled in, never re-tokenised. `episode.messages` becomes the rewritten messages (what the model
sees from then on), and the log keeps each earlier sequence's messages, the turn after which it was cut,
and the tokens the rewrites left out. The default threshold is three quarters of what a sequence may
hold (its prompt plus `max_completion_length`, or the window if smaller), which leaves room for a summary.

Left out: strategies for agent environments (their code owns its messages: a rewrite there is a new
segment, engine/agent_session.py; `resolve_strategy` refuses any but `keep`), text-level play (env
check's oracle and empty policies, sft: no tokens, so no budgets or strategies), and turns the
environment asks of the policy itself (not in the sequence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from aitrain_grpo.config import CONTEXT_STRATEGIES
from aitrain_grpo.engine.backends.base import Sample
from aitrain_grpo.engine.budgets import Budgets
from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.engine.runner import EpisodeRunner
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.engine.traces import TokenTrace
from aitrain_grpo.env.agent import is_agent_environment
from aitrain_grpo.env.base import Environment, Episode, Message, has_compact
from aitrain_grpo.errors import ConfigError

DROPPED = "[older tool result left out to save context]"
SUMMARY_REQUEST = ("Your context is nearly full. Write a summary of this episode so far: the task, what you have "
                   "found out, and what is left to do. It will replace the conversation so far, so keep everything "
                   "you still need. Do not call a tool in this message.")
SUMMARY_TOKENS = 256  # the summary turn's least default token limit (--rl-context-summary-tokens)
SUMMARY_FOLLOW_UP = "That is your summary of the episode so far; the conversation before it is gone. Continue the task."


def resolve_strategy(env: Environment, chosen: str | None) -> str:
    """The strategy in force: the option's, else the environment's `context_strategy`, else `compact`
    where the environment has the hook, else `keep`. An agent environment plays only `keep`: its code
    sends whole histories, so a rewrite of them here would be undone by its next request."""
    name = type(env).__name__
    strategy = chosen or getattr(env, "context_strategy", None) or ("compact" if has_compact(env) else "keep")
    if strategy not in CONTEXT_STRATEGIES:
        raise ConfigError(f"{name}.context_strategy {strategy!r} is not one of {', '.join(CONTEXT_STRATEGIES)}")
    if strategy != "keep" and is_agent_environment(env):
        source = (f"--rl-context {strategy}" if chosen else f"{name}.context_strategy {strategy!r}"
                  if getattr(env, "context_strategy", None) else f"{name}.compact")
        fix = "leave out --rl-context (or pass keep)" if chosen else "remove it"
        raise ConfigError(f"{source} does not apply to {name}, an agent environment: its rollout sends the "
                          f"history itself (a rewritten one starts a new sequence); {fix} and shorten the "
                          f"history in rollout")
    if strategy == "compact" and not has_compact(env):
        raise ConfigError(f"--rl-context compact needs {name}.compact(self, episode) returning messages or None; "
                          f"define it, or choose keep, drop-tool-results or summarize")
    return strategy


def resolve_strategies(env: Environment, chosen: str | None) -> dict[str | None, str]:
    """The strategy of each environment that plays episodes, resolved (and refused) before any is played:
    a mixture's members by name (env/adapters/mixture.py: `members`, `member(row)`), else `env`'s under None."""
    members = getattr(env, "members", None)
    if isinstance(members, dict) and callable(getattr(env, "member", None)):
        return {name: resolve_strategy(member, chosen) for name, member in members.items()}
    return {None: resolve_strategy(env, chosen)}


def cuts_history(env: Environment, settings) -> bool:
    """Whether an episode of `env` under `settings` (an `EpisodeSettings`) may be cut or rewritten by the
    engine: a context strategy other than `keep`, tool results cut to a limit, or a token budget beyond the
    turn's (the window, the episode's model tokens). A text policy played where this holds (an oracle, a
    probe) must go through the token-level engine to be played as training plays it (sft, env check)."""
    budgets = (settings.max_tool_result_tokens, settings.context_window, settings.max_episode_tokens)
    return any(budget is not None for budget in budgets) or \
        any(strategy != "keep" for strategy in resolve_strategies(env, settings.context).values())


def task_messages(messages: list[Message]) -> list[Message]:
    """The messages before the model's first turn: the system prompt and the task."""
    first = next((at for at, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return [dict(m) for m in messages[:first]]


def drop_tool_results(messages: list[Message], keep_last: int) -> list[Message] | None:
    """`messages` with every tool result but the last `keep_last` replaced by `DROPPED`; None when none is left."""
    results = [at for at, m in enumerate(messages) if m.get("role") == "tool"]
    older = [at for at in results[:max(len(results) - keep_last, 0)] if messages[at].get("content") != DROPPED]
    if not older:
        return None
    out = [dict(m) for m in messages]
    for at in older:
        out[at]["content"] = DROPPED
    return out


def with_summary_request(reply: list[Message]) -> list[Message]:
    """The reply followed by `SUMMARY_REQUEST`, inside its last user message where it ends with one (a
    template that wants roles to alternate then still renders it)."""
    last = reply[-1]
    if last.get("role") == "user":
        return [*reply[:-1], {**last, "content": f"{last.get('content') or ''}\n\n{SUMMARY_REQUEST}"}]
    return [*reply, {"role": "user", "content": SUMMARY_REQUEST}]


def summarized(messages: list[Message], summary: str) -> list[Message]:
    """What the episode goes on from after a summary: the task, the summary, and `SUMMARY_FOLLOW_UP`."""
    return [*task_messages(messages), {"role": "assistant", "content": summary},
            {"role": "user", "content": SUMMARY_FOLLOW_UP}]


@dataclass
class RecordedTurn:
    """One model turn as recorded: the text to decode, whether it ended with a stop token, and which
    limit cut it off (None, "turn_tokens", "summary_tokens", "completion_budget" or "context")."""

    text_ids: list[int]
    ended_with_eos: bool
    cut: str | None


class ContextKeeper:
    """The budgets and context strategy of one engine's episodes (see the module docstring). The engine
    calls, per turn: `limit`, `record_turn`, `answer`, then for a reply `cut_results` and `place_reply`."""

    def __init__(self, env: Environment, tokenizer, runner: EpisodeRunner, settings: EpisodeSettings,
                 renderer_for: Callable[[Episode], ChatRenderer], stop_ids: set[int]):
        self.env, self.tokenizer, self.runner, self.renderer_for = env, tokenizer, runner, renderer_for
        self.strategies = resolve_strategies(env, settings.context)
        self.keep_last = settings.context_keep_last
        self.summary_tokens = settings.context_summary_tokens or max(SUMMARY_TOKENS, settings.max_new_tokens)
        self.budgets = Budgets.of(settings, tokenizer)
        self.threshold = settings.context_threshold
        self.stop_ids = stop_ids

    @property
    def strategy(self) -> str | None:
        """The one strategy of every episode; None where a mixture's members differ."""
        return next(iter(self.strategies.values())) if len(set(self.strategies.values())) == 1 else None

    def strategy_of(self, episode: Episode) -> str:
        """The strategy of `episode`: its mixture member's, else the environment's."""
        return self.strategies[None] if None in self.strategies else self.strategies[self.env.member(episode.row)[0]]

    @staticmethod
    def stop(episode: Episode, reason: str) -> None:
        episode.truncated = episode.done = True
        episode.stop_reason = reason

    def _failed(self, episode: Episode, detail: str) -> None:
        """The strategy failed for this episode: it ends as an environment error, scored 0."""
        episode.error = f"context strategy {self.strategy_of(episode)}: {detail}".replace("\n", " ")
        episode.stop_reason = "error"
        episode.done = True
        episode.score = 0.0

    def limit(self, episode: Episode, trace: TokenTrace) -> tuple[int, str]:
        """Tokens the episode's next turn may take, and the limit that sets it; at 0 the episode stops
        here (scored as it stands) for that limit's reason."""
        turn = (self.summary_tokens, "summary_tokens") if episode.log.summarizing else None
        left, reason = self.budgets.turn_limit(trace, episode.log.model_tokens, turn)
        if left <= 0:
            self.stop(episode, reason)
        return left, reason

    def record_turn(self, episode: Episode, trace: TokenTrace, sample: Sample, left: int, reason: str) -> RecordedTurn:
        """A sampled turn into the trace (at most `left` tokens), exactly as sampled."""
        ids, logprobs = sample.token_ids, sample.logprobs
        cut = None if sample.finish_reason == "stop" else "turn_tokens"
        if len(ids) > left:  # a lockstep call's limit is the largest of its episodes'
            ids, logprobs, cut = ids[:left], logprobs[:left], "turn_tokens"
        if cut and reason != "turn_tokens":
            cut = reason  # a budget or the window, not --rl-max-new-tokens, set this turn's limit
        trace.add_model_tokens(ids, logprobs, turn=episode.turns)
        episode.log.model_tokens += len(ids)
        ended_with_eos = bool(ids) and ids[-1] in self.stop_ids
        return RecordedTurn(ids[:-1] if ended_with_eos else ids, ended_with_eos, cut)

    async def answer(self, batch, i: int, text: str, turn: RecordedTurn) -> list[Message] | None:
        """The environment's reply to episode `i`'s turn, or None when it is over; a summary turn is not
        shown to the environment: the episode goes on from it instead (a new sequence)."""
        episode = batch.episodes[i]
        if episode.log.summarizing:
            self._summarized(batch, i, text, turn)
            return None
        # A cut turn ends the episode here (runner.respond with cut_off), or with `cut_turn="continue"`
        # is shown to the environment and counted in `episode.truncated_turns`; a turn cut by a budget
        # then stops at the next `limit` (no room is left for another turn).
        reply = await self.runner.respond(episode, text, cut_off=turn.cut is not None)
        if turn.cut is not None and episode.stop_reason == "turn_tokens":
            episode.stop_reason = turn.cut
        return reply

    def cut_results(self, episode: Episode, reply: list[Message]) -> list[Message]:
        """`reply` with each message longer than `max_tool_result_tokens` cut to its head and tail."""
        reply, cut = self.budgets.cut_results(reply, self.tokenizer)
        episode.log.tool_results_cut += cut
        return reply

    def _threshold(self, trace: TokenTrace) -> int:
        if self.threshold is not None:
            return self.threshold
        return 3 * min(self.budgets.window, len(trace.prompt_ids) + self.budgets.max_completion_length) // 4

    async def place_reply(self, batch, i: int, reply: list[Message], suffix: list[int], ended_with_eos: bool) -> None:
        """Episode `i`'s reply (its template suffix `suffix`) into its sequence, or into a new sequence its
        strategy rewrites the history into; where neither fits, the episode stops here, scored as it stands."""
        episode, trace = batch.episodes[i], batch.traces[i]
        if self.budgets.episode_spent(episode.log.model_tokens):
            self.stop(episode, "completion_budget")  # no turn is left to answer it: no rewrite for nothing
            return
        seen = list(episode.messages)  # what the model has seen: the current sequence's messages
        length = trace.length + len(suffix)
        over = self.budgets.reply_overflow(trace, len(suffix))
        self.runner.accept(episode, reply)
        episode.log.context_tokens = length
        rewritten, strategy = None, self.strategy_of(episode)
        if strategy == "compact":
            rewritten = await self.runner.compact(episode)
            if episode.error is not None:  # the hook raised or returned something else
                return
        elif strategy != "keep" and (over or length > self._threshold(trace)):
            if strategy == "drop-tool-results":
                rewritten = drop_tool_results(episode.messages, self.keep_last)
            elif self._ask_for_summary(episode, trace, reply, ended_with_eos, len(seen)):
                return
        if rewritten is not None:
            if self._rewrite(batch, i, rewritten, seen, length) or episode.done:
                return
            over = "context"  # the rewritten messages alone do not fit
        if over:
            del episode.messages[len(seen):]  # the model never sees this reply
            self.stop(episode, over)
            return
        trace.add_env_tokens(suffix)

    def _ask_for_summary(self, episode: Episode, trace: TokenTrace, reply: list[Message], ended_with_eos: bool,
                         seen: int) -> bool:
        """Append the reply and `SUMMARY_REQUEST` to the sequence, where they and a turn fit."""
        asked = with_summary_request(reply)
        suffix = self.renderer_for(episode).reply_ids(asked, ended_with_eos)
        if self.budgets.reply_overflow(trace, len(suffix)):
            return False
        episode.messages[seen:] = asked
        trace.add_env_tokens(suffix)
        episode.log.summarizing = True
        return True

    def _summarized(self, batch, i: int, text: str, turn: RecordedTurn) -> None:
        episode = batch.episodes[i]
        episode.log.summarizing = False
        if turn.cut is not None:
            self._failed(episode, f"the summary turn was cut off by its token limit ({turn.cut}); raise "
                                  f"--rl-context-summary-tokens or lower --rl-context-threshold")
            return
        episode.messages.append({"role": "assistant", "content": text, "summary": True})  # for transcripts
        if not self._rewrite(batch, i, summarized(episode.messages, text), list(episode.messages),
                             batch.traces[i].length) and not episode.done:
            self.stop(episode, "context")

    def _rewrite(self, batch, i: int, messages: list[Message], seen: list[Message], length: int) -> bool:
        """End episode `i`'s sequence and start the next from `messages`; False when they do not fit."""
        episode = batch.episodes[i]
        try:
            prompt = self.renderer_for(episode).prompt_ids(messages)
        except Exception as exc:  # a template that refuses the rewritten conversation (roles out of order)
            self._failed(episode, f"the chat template cannot render the rewritten messages: {type(exc).__name__}: {exc}")
            return False
        if not self.budgets.fits_window(len(prompt)):
            return False
        episode.log.earlier_messages.append(seen)
        episode.log.rewrite_turns.append(episode.turns)
        episode.log.tokens_saved += max(length - len(prompt), 0)
        batch.earlier[i].append(batch.traces[i])
        batch.traces[i] = TokenTrace(prompt_ids=prompt)
        episode.messages = [dict(m) for m in messages]
        return True
