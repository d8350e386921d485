"""The environment contract: `Environment`, `Episode`, and the message types that cross it.

A user subclasses `Environment` (free-form replies) or `ToolEnvironment` (env/tools.py: replies are the
results of the model's tool calls). The rollout engine owns the loop: it samples a model turn, stores
it in `episode.messages`, parses tool calls into `episode.tool_calls`, calls `step` for the reply, and
calls `score_episode` once the episode ends. What the engine records while it plays (why the episode
ended, tool-call forms and counts, the episode's tools) is kept apart from what the author writes, in
`episode.log` (`EpisodeLog`). Nothing here knows about tokens, TRL or generation backends.

Left out: tools (env/tools.py), loading a user's class (env/loading.py), checking the rows it builds
(env/dataset.py), and running the calls with timeouts and fault handling (engine/runner.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, NotRequired, Required, TypedDict

MESSAGE_ROLES = ("system", "user", "assistant", "tool")


class Message(TypedDict, total=False):
    """One chat message, as chat templates take it: `role` and `content`, and for a `tool` message the
    `name` of the tool it answers. Other keys a template understands pass through untouched."""

    role: Required[str]
    content: str | None
    name: NotRequired[str]


def prompt_messages(prompt: str | list[Message]) -> list[Message]:
    """A dataset row's `prompt` as chat messages: a bare string is one user message. A key other than `content`
    whose value is None is left out: the rows as stored (env/arrow_rows.py) give every message every key any
    message of the column has (`tool_calls`, `name`, `tool_call_id`), and a template that tests `'tool_calls'
    in message` would read a user message as a tool call."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{k: v for k, v in m.items() if v is not None or k == "content"} for m in prompt]


class ToolCall(TypedDict):
    """One tool call parsed from a model turn: the tool's name and its JSON-object arguments."""

    name: str
    arguments: dict[str, Any]


EnvReply = str | list[Message] | None
# The policy being played, for an environment's own code (see `Episode.policy_turn`).
PolicyTurn = Callable[[list[Message]], Awaitable[str]]
# Why an episode ended: the environment ended it (`step` returned None, or a single-turn episode), the
# turn cap, a model turn cut off by --rl-max-new-tokens, a token budget (a sequence's completion length,
# the episode's model tokens), the model's context window (its next turn would not fit, even after the
# context strategy: engine/context.py), or an error.
STOP_REASONS = ("env", "max_turns", "turn_tokens", "completion_budget", "context", "error")


@dataclass
class EpisodeLog:
    """What whoever plays an episode records about it while playing, beside what its author writes on
    `Episode`: why it ended, the form each turn's tool calls were read in, the tool-call counters, the
    turns cut off by their token limit that it went on after, the tools it was offered (fixed when it
    starts), and the policy an environment may ask for turns. `Episode` keeps the old names
    (`episode.stop_reason`, `episode.num_tool_errors`, `episode.policy_turn`, ...) as properties over it,
    so authors and callers read them as before; the counters change only through `turn_read` and
    `tool_failed`, the one place tool calls and errors are counted."""

    # Why the episode ended: one of STOP_REASONS (None while it runs).
    stop_reason: str | None = None
    # Per model turn, the form its tool calls were read in ("hermes", "json", ...; None for prose).
    tool_call_forms: list[str | None] = field(default_factory=list)
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    # Model turns cut off by the per-turn token limit that the episode went on after (--rl-cut-turn continue).
    truncated_turns: int = 0
    # The tools the episode offers and the names its tool calls are read against, fixed when it starts
    # (a mixture's row's own); None for an episode built outside a runner.
    tools: list[dict[str, Any]] | None = None
    tool_names: Any = None
    # `await episode.policy_turn(messages)`: see `Episode.policy_turn`.
    policy_turn: PolicyTurn | None = field(default=None, repr=False, compare=False)
    # Context strategies (engine/context.py): the turn after which each rewrite of the history happened,
    # the messages of each sequence before the current one (as the model saw them), the tokens the
    # rewrites left out, tool/environment results cut to --rl-max-tool-result-tokens, the tokens of the
    # current sequence (what `Environment.compact` may look at), and whether a summary turn is asked for.
    model_tokens: int = 0  # tokens the model sampled in this episode, over all its sequences
    rewrite_turns: list[int] = field(default_factory=list)
    sequences: int = 1  # the token sequences it played, whichever rewrite made them (engine/rollout.py)
    earlier_messages: list[list[Message]] = field(default_factory=list, repr=False)
    tokens_saved: int = 0
    tool_results_cut: int = 0
    context_tokens: int = 0
    summarizing: bool = False

    def turn_read(self, parsed: Any, *, unreadable_are_errors: bool = False) -> None:
        """Count one model turn's tool calls as read (engine/tool_parsers.ParsedTurn: `calls`, `problems`,
        `form`): a call that could not be read counts as a call, and as an error where nothing else will
        answer it (an agent's request; a `ToolEnvironment` counts it when it replies)."""
        self.tool_call_forms.append(parsed.form)
        self.num_tool_calls += len(parsed.calls) + len(parsed.problems)
        if unreadable_are_errors:
            self.num_tool_errors += len(parsed.problems)

    def tool_failed(self) -> None:
        """One tool call that failed: unreadable, refused (unknown tool, bad arguments) or raising."""
        self.num_tool_errors += 1


def _logged(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.log, name), lambda self, value: setattr(self.log, name, value), doc=doc)


@dataclass
class Episode:
    """One conversation between the model and an environment, from prompt to score.

    `messages` is the conversation exactly as the model saw it: the prompt messages, then each
    assistant turn's raw text (tool calls included, as written) and each environment reply. What the
    author writes is here (`state`, `metrics`, `reward_turn`, `max_turns` in `reset`); what the engine
    records while playing is `log` (an `EpisodeLog`), its fields readable here under their own names.
    """

    row: dict[str, Any]
    messages: list[Message]
    state: dict[str, Any] = field(default_factory=dict)
    turns: int = 0
    done: bool = False
    truncated: bool = False
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # The latest turn's tool calls, as read for `step`, and the problems found reading them (bad JSON, ...).
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_errors: list[str] = field(default_factory=list)
    score: float | None = None
    # The turn cap in force for this episode (the environment's, or lower if the run config says so).
    max_turns: int | None = None
    # Per model turn, the reward the environment gave it (`reward_turn`); empty when it gave none.
    turn_rewards: list[float] = field(default_factory=list)
    log: EpisodeLog = field(default_factory=EpisodeLog, repr=False)

    stop_reason = _logged("stop_reason", "Why the episode ended, set by the engine: one of STOP_REASONS.")
    tool_call_forms = _logged("tool_call_forms", "Per model turn, the form its tool calls were read in.")
    num_tool_calls = _logged("num_tool_calls", "Tool calls the model wrote, unreadable ones included.")
    num_tool_errors = _logged("num_tool_errors", "Tool calls that failed (see EpisodeLog.tool_failed).")
    truncated_turns = _logged("truncated_turns", "Turns cut off by their token limit that the episode went on after.")
    policy_turn = _logged("policy_turn", """Set before `reset` by whoever plays the episode: `await
    episode.policy_turn(messages)` is the reply of the policy being played to another conversation (a self-play
    opponent's seat): the run's model, backend and sampling in training and eval, the text policy under env
    check's oracle/empty and sft. Those turns are not part of this episode's trained sequence
    (engine/policy_turns.py).""")

    def reward_turn(self, value: float, turn: int | None = None) -> None:
        """Reward one model turn, beside the episode's score: the latest turn by default (so `step`, which
        answers that turn, needs one line: `episode.reward_turn(0.5)`), or model turn `turn` (0-based, e.g.
        from `score_episode`). Rewards given to the same turn add up. Logged as `env/turn_reward_mean`,
        shown per turn in transcripts, and with `--rl-advantage turn` credited to that turn's tokens and the
        turns before it; with the default `outcome` only the score trains. Raises ValueError for a value that
        is not a finite number or a turn the model has not played."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"reward_turn takes a finite number, got {value!r}")
        index = self.turns - 1 if turn is None else turn
        if not 0 <= index < self.turns:
            raise ValueError(f"reward_turn: turn {index} has not been played (the model has played {self.turns} turn(s))")
        if len(self.turn_rewards) < self.turns:
            self.turn_rewards.extend([0.0] * (self.turns - len(self.turn_rewards)))
        self.turn_rewards[index] += float(value)

    @property
    def last_completion(self) -> str:
        """The text of the model's latest turn ('' before the first one)."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return str(message.get("content") or "")
        return ""


class Environment:
    """Base class for a training environment. Subclass it and implement the methods below.

    Required: `build_dataset(tokenizer)` and `score_episode(episode)`.
    Optional: `reset(episode)`, `step(episode, completion)` (without it an episode is one model turn),
    `solve(episode)` (an expert's next message: env check's oracle, sft's demonstrations), `probes()`
    (known shortcuts, for env check) and `tools` (JSON schemas rendered into the prompt). `reset`, `step` and `score_episode` may be `async def`.
    """

    #: Upper bound on model turns per episode; the run config may lower it.
    max_turns: int = 10
    #: True when `score_episode` needs the policy model itself (AITraining's interface, a judge that is the
    #: policy): training, eval and env check then call `use_policy` with the live model before scoring.
    needs_policy: bool = False

    def use_policy(self, model, tokenizer) -> None:
        """Receive the policy model (unwrapped, as it is now) and its tokenizer; only called when
        `needs_policy` is true. Such an environment cannot be trained with --rl-async-steps."""
        return None

    def build_dataset(self, tokenizer) -> Any:
        """Return a `datasets.Dataset` or a list of dicts, each with a `prompt` (a string or a list of
        `{"role", "content"}` messages) and any other columns; they reach `episode.row`."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_dataset(self, tokenizer)")

    def reset(self, episode: Episode) -> None:
        """Per-episode setup, e.g. filling `episode.state`. Called before the first model turn."""
        return None

    def step(self, episode: Episode, completion: str) -> EnvReply:
        """Answer the model's latest turn: a string (one user message), a list of messages
        (`user`/`tool`), or None to end the episode. The default ends after one turn."""
        return None

    def score_episode(self, episode: Episode) -> float:
        """Score the finished episode from 0.0 to 1.0."""
        raise NotImplementedError(f"{type(self).__name__} must implement score_episode(self, episode)")

    def solve(self, episode: Episode) -> str:
        """Optional: an expert's next message in `episode` (its conversation so far in `episode.messages`).
        `aitrain env check` plays it as the oracle, which should score 1.0; `aitrain sft` learns from its
        episodes. Not overriding it means no oracle (`has_solve`): both say so instead of calling this."""
        raise NotImplementedError(f"{type(self).__name__} has no solve(episode) -> str")

    def probes(self) -> dict[str, Callable[[Episode], str] | list[str]]:
        """Optional: shortcuts you know of, as scripted replies an honest score must keep low, by name. Each is
        a policy like `solve` (`episode -> next message`) or a list of replies, one per turn (empty after
        the last). `aitrain env check` plays them beside its generic probes (evaluation/probes.py) and
        warns, naming the probe, when one scores near the oracle or well above an empty reply."""
        return {}

    @property
    def tools(self) -> list[dict[str, Any]]:
        """JSON schemas of the tools offered to the model (rendered through the chat template)."""
        return []

    #: The context strategy of this environment's episodes when `--rl-context` is not given: "keep",
    #: "drop-tool-results", "summarize" or "compact" (None: "compact" where `compact` is overridden, else "keep").
    context_strategy: str | None = None

    def compact(self, episode: Episode) -> list[Message] | None:
        """Optional, under the "compact" context strategy: called after each environment reply the episode
        goes on from, with `episode.messages` holding the conversation so far (that reply included) and
        `episode.log.context_tokens` the tokens the model's next turn would see. Return the messages the
        episode goes on from instead (a new training sequence starts from their chat template), or None to
        go on as it is. A hook that raises or returns something else ends that episode as an error."""
        return None

    def tools_for_row(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The tools offered in the episodes of dataset row `row`: `tools` unless overridden. A mixture of
        environments (env/adapters/mixture.py) offers each row its own environment's tools."""
        return self.tools


def with_environment_defaults(cls: type) -> type:
    """A duck-typed class (our methods, not our base class) as a subclass of it and `Environment`: its own
    methods first, the base's defaults for the optional ones it lacks (`tools`, `reset`, `step`, `probes`, ...),
    which the engine, env check and sft call. Its name, module and constructor stay its own. A class that
    cannot be combined (a metaclass or layout conflict) is returned as it is."""
    if issubclass(cls, Environment):
        return cls
    # `tools` is a read-only property on the base: a class that sets self.tools in __init__ needs a plain default.
    namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                 **({} if hasattr(cls, "tools") else {"tools": []})}
    try:
        return type(cls.__name__, (cls, Environment), namespace)
    except TypeError:
        return cls


def tools_for_row(env: Any, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools of `row`'s episodes, for an `Environment` or a duck-typed class the loader accepted."""
    per_row = getattr(env, "tools_for_row", None)
    return list(per_row(row) if callable(per_row) else getattr(env, "tools", None) or [])


def tools_vary_by_row(env: Any) -> bool:
    """Whether `env` overrides `tools_for_row`, so renderers and tool names are chosen per episode."""
    method = getattr(type(env), "tools_for_row", None)
    return method is not None and method is not Environment.tools_for_row


def has_solve(env: Any) -> bool:
    """Whether `env` has an oracle: a `solve` of its own (an override, a duck-typed class's method, or one an
    instance sets, as a mixture does when each of its environments has one); the base class's says none."""
    solve = getattr(env, "solve", None)
    return callable(solve) and getattr(solve, "__func__", solve) is not Environment.solve


def has_compact(env: Any) -> bool:
    """Whether `env` has a `compact` hook of its own (an override, or a duck-typed class's method)."""
    compact = getattr(env, "compact", None)
    return callable(compact) and getattr(compact, "__func__", compact) is not Environment.compact


def needs_policy(env: Any) -> bool:
    """Whether `env` (an `Environment`, or a duck-typed class the loader accepted) scores with the policy."""
    return bool(getattr(env, "needs_policy", False))
