"""How episodes are played, as one value: `EpisodeSettings`, which the `RolloutEngine`, `evaluate` and
`env check` all take, so that what a run, an evaluation and a check mean by "an episode" is said in one
place and travels as one object instead of a dozen keyword arguments through each caller.

It holds the per-episode budgets (tokens per model turn, model turns, the completion budget of a sequence,
the model tokens of an episode, the context window), how its history is kept as it grows (the context
strategy and its numbers, engine/context.py), how turns
are sampled, how long an environment call may take, the schedule and how many episodes play at once, what
a turn cut off by its token limit does, how tool calls are read, chat-template extras, and what an agent
environment's endpoint is called and where it listens. Its defaults are the library's defaults (a Python
caller that builds an engine and says nothing); `from_options` is the one place a run's option names
(RunConfig's fields, `rl_*`) become these settings, and a name it does not find keeps the default here.
The two agree except `sampling.top_k`: `SamplingParams`'s 50 here, the command line's `--rl-top-k` 0.

Left out: the generation backend and the tokenizer (what plays, not how), the environment, and checking
an option's range (config.py's `check_options`, before these are built; only the schedule, which
chooses a code path, is checked here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aitrain_grpo.config import DEFAULT_CONTEXT_KEEP_LAST, DEFAULT_CUT_TURN, DEFAULT_TOOL_PARSER, ROLLOUT_SCHEDULES
from aitrain_grpo.engine.agent_endpoint import LOCAL_HOST
from aitrain_grpo.option_rules import template_kwargs
from aitrain_grpo.engine.backends.base import SamplingParams


@dataclass(frozen=True)
class EpisodeSettings:
    """How the episodes of one engine are played (see the module docstring).

    `max_turns` None: the environment's own `max_turns`. `env_timeout` None: no limit. `schedule`:
    "continuous", "lockstep", or "auto" (continuous on a backend taking one request at a time: vLLM;
    lockstep on hf). `max_concurrent_episodes` bounds the episodes in play at once. `model_name` is the
    name an agent environment's requests must use (`client.model`); `agent_address` is where its
    endpoint listens (port 0: any free port). The context fields are engine/context.py's: `context` None
    is the environment's `context_strategy` (else keep), `context_threshold` None three quarters of the
    smaller of `max_completion_length` and the window, `context_summary_tokens` None the larger of 256 and
    `max_new_tokens` (engine/context.py `SUMMARY_TOKENS`), `context_window` None the tokenizer's
    `model_max_length`, and None for `max_tool_result_tokens` and `max_episode_tokens` is no limit."""

    max_new_tokens: int = 128
    max_turns: int | None = None
    max_completion_length: int = 1024
    sampling: SamplingParams = field(default_factory=SamplingParams)
    env_timeout: float | None = 60.0
    schedule: str = "auto"
    max_concurrent_episodes: int = 256
    cut_turn: str = DEFAULT_CUT_TURN
    tool_parser: str = DEFAULT_TOOL_PARSER
    template_kwargs: Mapping[str, Any] | None = None  # extra chat-template arguments (e.g. enable_thinking)
    model_name: str = "policy"
    agent_address: tuple[str, int] = (LOCAL_HOST, 0)
    context: str | None = None
    context_keep_last: int = DEFAULT_CONTEXT_KEEP_LAST
    context_threshold: int | None = None
    context_summary_tokens: int | None = None
    context_window: int | None = None
    max_tool_result_tokens: int | None = None
    max_episode_tokens: int | None = None

    def __post_init__(self):
        if self.schedule not in ROLLOUT_SCHEDULES:  # a Python caller's typo; options are checked in config.py
            raise ValueError(f"schedule must be one of {ROLLOUT_SCHEDULES}, not {self.schedule!r}")

    @classmethod
    def from_options(cls, options: Any) -> EpisodeSettings:
        """The settings a run's options give: `options` is a RunConfig or any object with its field names
        as attributes, or a mapping of those names (`aitrain eval`'s flags merged with a training run's
        `run_config.json`). A name it lacks, or holds as None, keeps this class's default; `model` (the
        policy's name) becomes `model_name`. Options are read by name, not as a RunConfig, so a partial
        set works and this module need not know how options are parsed."""
        default = cls()

        def get(name: str, fallback: Any) -> Any:
            value = options.get(name) if isinstance(options, Mapping) else getattr(options, name, None)
            return fallback if value is None else value

        sampling = default.sampling
        return cls(
            max_new_tokens=get("rl_max_new_tokens", default.max_new_tokens),
            max_turns=get("rl_max_turns", default.max_turns),
            max_completion_length=get("rl_max_completion_length", default.max_completion_length),
            sampling=SamplingParams(get("rl_temperature", sampling.temperature), get("rl_top_k", sampling.top_k),
                                    get("rl_top_p", sampling.top_p), get("rl_min_p", sampling.min_p),
                                    get("rl_repetition_penalty", sampling.repetition_penalty)),
            env_timeout=get("rl_env_timeout", default.env_timeout),
            schedule=get("rl_rollout_schedule", default.schedule),
            cut_turn=get("rl_cut_turn", default.cut_turn),
            tool_parser=get("rl_tool_parser", default.tool_parser),
            template_kwargs=template_kwargs(get("chat_template_kwargs", None)) or None,
            model_name=get("model", default.model_name),
            agent_address=(get("agent_host", default.agent_address[0]), get("agent_port", default.agent_address[1])),
            context=get("rl_context", default.context),
            context_keep_last=get("rl_context_keep_last", default.context_keep_last),
            context_threshold=get("rl_context_threshold", default.context_threshold),
            context_summary_tokens=get("rl_context_summary_tokens", default.context_summary_tokens),
            context_window=get("rl_context_window", default.context_window),
            max_tool_result_tokens=get("rl_max_tool_result_tokens", default.max_tool_result_tokens),
            max_episode_tokens=get("rl_max_episode_tokens", default.max_episode_tokens),
        )
