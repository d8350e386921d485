"""An episode's token budgets, as one piece of arithmetic that every way of playing an episode shares.

Environment episodes (engine/context.py's `ContextKeeper`) and agent episodes (engine/agent_session.py,
each request of the agent's code) are cut by the same rules, so an option means one thing for both:

- a model turn may take the smallest of what is left (`turn_limit`): its own limit (`--rl-max-new-tokens`,
  or the summary turn's), the sequence's completion budget (`--rl-max-completion-length` after its
  prompt, what TRL pads a row to), the context window (`--rl-context-window`, else the tokenizer's
  `model_max_length`; prompt plus completion) and the model tokens left to the whole episode
  (`--rl-max-episode-tokens`, summed over its sequences). At 0 the episode stops for that limit's reason:
  `turn_tokens`, `completion_budget` (either budget) or `context` (the window).
- a reply (an environment's, or the new messages of an agent's request) enters the sequence only where
  it leaves room for one more token (`reply_overflow`), and no reply is placed once the episode's model
  tokens are spent (`episode_spent`): the model would have no turn left to read it.
- a new sequence (a history rewritten by a strategy or by the agent) starts only from a prompt the
  window holds (`fits_window`).
- a tool or environment result longer than `--rl-max-tool-result-tokens` is cut to its head and tail with
  a marker between (`cut_results`); that is environment text, so re-encoding it breaks no token rule.

Left out: what happens when a budget runs out (the engine stops the episode; the agent endpoint answers
the request with an empty reply, `finish_reason` "length"), the turn cap (`--rl-max-turns`, counted by
whoever plays the episode) and context strategies (engine/context.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from aitrain_grpo.engine.traces import TokenTrace
from aitrain_grpo.env.base import Message

_NO_LIMIT = 10**8  # a tokenizer's model_max_length above this is transformers' "not set" sentinel


def model_window(tokenizer) -> int:
    """The tokenizer's `model_max_length`, or no limit where it sets none."""
    length = getattr(tokenizer, "model_max_length", None)
    return int(length) if isinstance(length, int) and 0 < length < _NO_LIMIT else _NO_LIMIT


@dataclass(frozen=True)
class Budgets:
    """The budgets of one engine's episodes (see the module docstring); None is no limit."""

    max_new_tokens: int
    max_completion_length: int
    window: int = _NO_LIMIT
    max_episode_tokens: int | None = None
    max_result_tokens: int | None = None

    @classmethod
    def of(cls, settings, tokenizer) -> Budgets:
        """The budgets `settings` (engine/settings.py `EpisodeSettings`) give, the window defaulting to
        the tokenizer's."""
        return cls(settings.max_new_tokens, settings.max_completion_length,
                   settings.context_window or model_window(tokenizer), settings.max_episode_tokens,
                   settings.max_tool_result_tokens)

    def turn_limit(self, trace: TokenTrace, model_tokens: int, turn: tuple[int, str] | None = None) -> tuple[int, str]:
        """Tokens the next model turn of `trace` may take, and the reason of the limit that sets it;
        `model_tokens` is what the episode has sampled so far, `turn` the turn's own limit and reason
        (default `max_new_tokens`, "turn_tokens"). Of equal limits the turn's own is named."""
        limits = [turn or (self.max_new_tokens, "turn_tokens"),
                  (self.max_completion_length - len(trace.completion_ids), "completion_budget"),
                  (self.window - trace.length, "context")]
        if self.max_episode_tokens is not None:
            limits.append((self.max_episode_tokens - model_tokens, "completion_budget"))
        return min(limits, key=lambda item: item[0])

    def episode_spent(self, model_tokens: int) -> bool:
        """Whether the episode's model tokens are spent: no turn is left to read another reply."""
        return self.max_episode_tokens is not None and model_tokens >= self.max_episode_tokens

    def reply_overflow(self, trace: TokenTrace, reply_tokens: int) -> str | None:
        """Why `reply_tokens` more tokens in `trace` would leave no room for a turn after them
        ("completion_budget" or "context"); None where they fit."""
        if len(trace.completion_ids) + reply_tokens >= self.max_completion_length:
            return "completion_budget"
        return "context" if trace.length + reply_tokens >= self.window else None

    def fits_window(self, prompt_tokens: int) -> bool:
        """Whether a new sequence of this prompt leaves the window room for a turn."""
        return prompt_tokens < self.window

    def cut_results(self, messages: list[Message], tokenizer) -> tuple[list[Message], int]:
        """`messages` with each one longer than `max_result_tokens` cut to its head and tail (a marker
        saying how many tokens were left out between), and how many were cut."""
        if self.max_result_tokens is None or not messages:
            return messages, 0
        limit = self.max_result_tokens
        encoded = tokenizer([str(m.get("content") or "") for m in messages], add_special_tokens=False)["input_ids"]
        out, cut = [], 0
        for message, ids in zip(messages, encoded):
            if len(ids) > limit:
                head, tail = ids[:limit // 2], ids[len(ids) - (limit - limit // 2):]
                marker = f"\n[... {len(ids) - limit} tokens cut ...]\n"
                text = _decode(tokenizer, head) + marker + _decode(tokenizer, tail)
                message, cut = {**message, "content": text}, cut + 1
            out.append(message)
        return out, cut


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


__all__ = ["Budgets", "model_window"]
