"""Demonstrations (whole conversations an oracle played) as the token ids the rollout engine builds.

A warm start by SFT (sft/trainer.py) must show the model exactly what GRPO will show it, token for
token, or the format it learns is not the one it is then asked to continue. `demo_tokens` builds a
finished conversation the way `RolloutEngine` builds an episode (rollout.py): the prompt messages
rendered once by `ChatRenderer` with the environment's tool schemas (through the chat template, or
described in the system message where the template drops them) plus the generation prompt; then each
assistant turn as its text's tokens followed by EOS, as if sampled (mask 1: what the model would
generate, and the only tokens an SFT loss should cover); then each environment reply as the
template's suffix with the next generation prompt (mask 0). The mask is the engine's `env_mask`.

An agent environment's oracle episode (env/agent.py) is the conversation of its last request plus the
reply: its prompt is the messages before the first assistant turn, and its tools are those the request
sent (`episode.state["agent_tools"]`), the tools the model saw when the endpoint rendered that request
(`demonstration` builds both kinds).

Where a context strategy rewrites an episode's history, the conversation alone does not say what the
model saw when; such an oracle episode is played by the engine itself (sft/oracle.py,
backends/scripted.py) and keeps the engine's sequences (`Demonstration.sequences`, each from a
`TokenTrace` by `trace_tokens`): a sequence is one SFT row, exactly as GRPO will show it.

Left out: playing the oracle (sft/oracle.py, through runner.play or the engine), sampled turns cut off
by a token limit in `demo_tokens` (a text-level demonstration's turns always end), and templates that
rewrite earlier turns (the suffix raises `TemplateError`, as `env check` reports).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.engine.traces import TokenTrace
from aitrain_grpo.env.agent import is_agent_environment
from aitrain_grpo.env.base import Environment, Episode, Message, prompt_messages, tools_for_row
from aitrain_grpo.errors import ConfigError


@dataclass(frozen=True)
class DemoTokens:
    """A demonstration as the model sees it: `assistant_masks[i]` is 1 where `input_ids[i]` is a
    token the model would sample (an assistant turn's text and its EOS)."""

    input_ids: list[int]
    assistant_masks: list[int]
    prompt_length: int  # tokens of the rendered prompt (with the generation prompt)


@dataclass(frozen=True)
class Demonstration:
    """One oracle episode: the whole conversation (prompt, assistant turns, tool and user replies),
    how many of its first messages are the prompt, its score, and the dataset row it played."""

    messages: list[Message]
    prompt_length: int
    score: float
    row: int
    tools: list[dict[str, Any]] = field(default_factory=list)  # the schemas offered in its episode (its requests')
    # Played by the token-level engine (a context strategy, sft/oracle.py): its sequences as the engine
    # built them, and the messages of each sequence before the last (`messages` holds the last one's).
    sequences: list[DemoTokens] = field(default_factory=list)
    earlier_messages: list[list[Message]] = field(default_factory=list)
    turns: int = 0  # the oracle's turns in the episode (a turn cap that ended it shows here)

    def record(self) -> dict[str, Any]:
        """Its line in demos.jsonl. `tools` is there so the file stands alone: TRL's conversational
        SFT datasets carry the schemas in a `tools` column. One a strategy cut into sequences also
        has `earlier_messages` (each earlier sequence's conversation, as the model saw it)."""
        record = {"messages": self.messages, "prompt_length": self.prompt_length, "score": self.score,
                  "row": self.row, "tools": self.tools}
        if self.sequences:
            record.update(sequences=len(self.sequences), earlier_messages=self.earlier_messages)
        return record

    def tokens(self, renderer: ChatRenderer) -> list[DemoTokens]:
        """Its training sequences: those the engine played, else its conversation rendered (`demo_tokens`)."""
        return list(self.sequences) or [demo_tokens(renderer, self)]


def demonstration(env: Environment, episode: Episode, row: dict[str, Any], index: int) -> Demonstration:
    """The oracle's finished `episode` of dataset row `index` as a `Demonstration`: prompt and tools are the
    row's (`tools_for_row`), or for an agent environment its request's (see the module doc)."""
    messages, score = list(episode.messages), float(episode.score or 0.0)
    if is_agent_environment(env):
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
        return Demonstration(messages, first, score, index, list(episode.state.get("agent_tools") or []),
                             turns=episode.turns)
    return Demonstration(messages, len(prompt_messages(row["prompt"])), score, index, tools_for_row(env, row),
                         turns=episode.turns)


def trace_tokens(trace: TokenTrace) -> DemoTokens | None:
    """One sequence the engine played as SFT's input: its tokens, the model's own marked; None where it
    holds no model token (nothing to learn from it)."""
    if not any(trace.env_mask):
        return None
    return DemoTokens(trace.prompt_ids + trace.completion_ids, [0] * len(trace.prompt_ids) + list(trace.env_mask),
                      len(trace.prompt_ids))


def has_turns(demo: Demonstration) -> bool:
    """Whether the demonstration has an assistant turn to learn from (an agent may score without asking)."""
    return any(m.get("role") == "assistant" for m in demo.messages[demo.prompt_length:])


def demo_tokens(renderer: ChatRenderer, demo: Demonstration) -> DemoTokens:
    """Token ids of `demo` built the way the rollout engine builds an episode (see the module doc)."""
    eos = renderer.eos_token_id
    if eos is None:
        raise ConfigError("the model's tokenizer has no EOS token, so a turn's end cannot be taught; set "
                          "tokenizer.eos_token to the token that ends an assistant turn")
    prompt = demo.messages[:demo.prompt_length]
    ids = renderer.prompt_ids(prompt)
    mask = [0] * len(ids)
    prompt_tokens = len(ids)
    rest = demo.messages[demo.prompt_length:]
    i = 0
    while i < len(rest):
        message = rest[i]
        if message.get("role") != "assistant":
            raise ConfigError(f"demonstration of row {demo.row}: message {demo.prompt_length + i} is a "
                              f"{message.get('role')} message where an assistant turn was expected")
        turn = renderer.encode(str(message.get("content") or "")) + [eos]
        ids += turn
        mask += [1] * len(turn)
        i += 1
        reply = []
        while i < len(rest) and rest[i].get("role") != "assistant":
            reply.append(rest[i])
            i += 1
        if reply:
            suffix = renderer.reply_ids(reply, ended_with_eos=True)
            ids += suffix
            mask += [0] * len(suffix)
    return DemoTokens(ids, mask, prompt_tokens)
