"""Prompts that cannot fit the model's context are refused before training, in one line.

A dataset whose prompts ran to 200k tokens against a 4,096-token model printed one transformers warning
("Token indices sequence length is longer than ...") and then ran for minutes with no output: every
generation call went past the position embeddings. A prompt plus the reply of one turn
(`--rl-max-new-tokens`) must fit the context, or no episode of that row can be played. Refused rather than
truncated: a prompt cut at the start or the end loses the task or its question, and which part is safe
to drop is the environment's to say (in `build_dataset`).

The context is the smaller of the model's `max_position_embeddings` and the tokenizer's
`model_max_length` (the latter is a huge sentinel when a tokenizer sets none). Rows are measured as the
rollout renders them (engine/chat.py's ChatRenderer): the chat template with the row's tools (in the
template, or described in a message where the template drops them) and `--chat-template-kwargs`. Only rows
whose UTF-8 length, the tools' schemas included, could exceed the limit are tokenized (a token covers at
least one byte), so a large dataset of short prompts costs nothing.

`--rl-context-window` is held to the same two limits (`check_context_window`): past the model's context it
is refused (a window of 10^8 on a 4,096-position model was accepted, and generation would run past the
position embeddings), and a window that cannot hold a prompt plus one reply is refused (a window of 10
played 0 turns an episode, trained on zero rewards and exited 0). `model_context` reads a model or just
its config (`AutoConfig`), so `aitrain grpo` checks the window before the weights load (preflight/run_checks.py).

Left out: episodes that grow past the context over their turns (the rollout cuts those, as truncated).
"""

from __future__ import annotations

import json
from typing import Any

from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.env.base import prompt_messages, tools_for_row
from aitrain_grpo.errors import ConfigError

# Tokens a chat template may add per message (role markers, separators) and once (a system preamble).
_TEMPLATE_TOKENS_PER_MESSAGE = 16
_TEMPLATE_TOKENS = 256
_NO_LIMIT = 10**8  # a tokenizer's model_max_length above this is transformers' "not set" sentinel


def model_context(model: Any, tokenizer: Any) -> int | None:
    """The longest sequence the model takes, in tokens; None when neither the model (or its config, which
    needs no weights loaded) nor the tokenizer says."""
    limits = [getattr(getattr(model, "config", model), "max_position_embeddings", None),
              getattr(tokenizer, "model_max_length", None)]
    sane = [int(n) for n in limits if isinstance(n, int) and 0 < n < _NO_LIMIT]
    return min(sane) if sane else None


def _byte_bound(messages: list[dict]) -> int:
    text = sum(len(str(m.get("content") or "").encode()) for m in messages)
    return text + _TEMPLATE_TOKENS_PER_MESSAGE * len(messages) + _TEMPLATE_TOKENS


def prompt_tokens(messages: list[dict], tokenizer: Any, renderer: Any = None) -> int | None:
    """The prompt's length in tokens as the chat template renders it (through `renderer`, the rollout's
    ChatRenderer with the row's tools and the template's variables, when given); None when the template
    will not."""
    try:
        text = (renderer.render(messages, add_generation_prompt=True) if renderer is not None
                else tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    except Exception:  # a template that rejects the prompt: the rollout says so in its own words
        return None
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


class _Renderers:
    """The rollout's renderer for each set of tools the rows offer (engine/chat.py: the tools in the
    template, or described in a message where the template drops them, and --chat-template-kwargs), made
    once per set; None where the tokenizer has no chat template to render with (the rollout says so)."""

    def __init__(self, env: Any, tokenizer: Any, template_kwargs: dict | None):
        self.env, self.tokenizer, self.template_kwargs = env, tokenizer, template_kwargs
        self.made: dict[str, Any] = {}

    def tools(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return tools_for_row(self.env, row) if self.env is not None else []

    def for_row(self, row: dict[str, Any]) -> Any:
        tools = self.tools(row)
        key = json.dumps(tools, sort_keys=True, default=str)
        if key not in self.made:
            try:
                self.made[key] = ChatRenderer(self.tokenizer, tools, self.template_kwargs)
            except Exception:  # no chat template, or one the renderer refuses: measured without, as before
                self.made[key] = None
        return self.made[key]


def check_context_window(window: int, model: Any, tokenizer: Any, *, model_name: str) -> None:
    """Refuse `--rl-context-window` past the model's context (`model_context`)."""
    context = model_context(model, tokenizer)
    if context is not None and window > context:
        raise ConfigError(f"--rl-context-window {window} is past {model_name}'s context of {context} tokens (what its "
                          f"positions and tokenizer take); give at most {context}, or leave the option out for the "
                          f"model's own")


def check_prompt_lengths(rows: list[dict[str, Any]], tokenizer: Any, model: Any, *, reply_tokens: int,
                         model_name: str, window: int | None = None, env: Any = None,
                         template_kwargs: dict | None = None) -> None:
    """Refuse the dataset when a prompt plus one reply of `reply_tokens` does not fit the context, or the
    `--rl-context-window` when that is what it does not fit (`window`, where given and smaller). Prompts are
    rendered as the rollout renders them: with `env`'s tools for the row and the template's variables."""
    context = model_context(model, tokenizer)
    renderers = _Renderers(env, tokenizer, template_kwargs)
    if window is not None and (context is None or window < context):
        _check_fit(rows, tokenizer, renderers, window - reply_tokens, lambda count, index, tokens: (
            f"--rl-context-window {window} cannot hold {count} of {len(rows)} dataset prompts with room for a "
            f"{reply_tokens}-token reply (the longest, row {index}, is {tokens} tokens): their episodes would be "
            f"cut at the first turn; give a window of at least {tokens + reply_tokens} tokens, or leave the option out"))
    if context is not None:
        _check_fit(rows, tokenizer, renderers, context - reply_tokens, lambda count, index, tokens: (
            f"{count} of {len(rows)} dataset prompts do not fit {model_name}'s context of {context} tokens with "
            f"room for a {reply_tokens}-token reply (the longest, row {index}, is {tokens} tokens); shorten or drop "
            f"them in build_dataset (at most {max(context - reply_tokens, 0)} tokens), or use a model with a longer "
            f"context"))


def _check_fit(rows: list[dict[str, Any]], tokenizer: Any, renderers: _Renderers, limit: int, message) -> None:
    """Raise `ConfigError(message(count, row, tokens))` naming the longest prompt over `limit` tokens."""
    too_long: list[tuple[int, int]] = []  # (row index, tokens)
    extra = _TEMPLATE_TOKENS if renderers.template_kwargs else 0  # what a template's variables may add
    for index, row in enumerate(rows):
        messages = prompt_messages(row["prompt"])
        tools = renderers.tools(row)
        if _byte_bound(messages) + (len(json.dumps(tools, default=str).encode()) if tools else 0) + extra <= limit:
            continue
        tokens = prompt_tokens(messages, tokenizer, renderers.for_row(row))
        if tokens is not None and tokens > limit:
            too_long.append((index, tokens))
    if not too_long:
        return
    index, tokens = max(too_long, key=lambda item: item[1])
    raise ConfigError(message(len(too_long), index, tokens))
