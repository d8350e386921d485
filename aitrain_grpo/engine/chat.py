"""Chat-template rendering for token-in/token-out episodes, and tool-call parsing.

Text is never re-tokenized once generated. The `ChatRenderer` turns the prompt messages into
`prompt_ids` once, and each environment reply into the *suffix* that the chat template would add after
the model's turn: the rendering of a fixed short conversation with and without the reply, differenced.
Rendering a constant-size conversation keeps the per-turn cost independent of how long the episode is.
`check_append_only` tests, up front, the assumption this rests on: that the template only appends.

Tool calls are read from model text in engine/tool_parsers.py; this module renders the Hermes form's
instructions for templates that drop the tools.

Tools on any template: many chat templates (SmolLM2's among them) silently drop the `tools` argument.
The renderer finds out by rendering with and without them; where they are dropped, it describes the
tools and the call format in the system message itself (schemas as JSON in `<tools>`, calls as
`<tool_call>` JSON) and, where the template cannot render a tool-role message either, sends tool
results as user messages wrapped in `<tool_response>`. Every rendering goes through the same message
rewrite, so prompts, reply suffixes and the append-only check agree token for token.
`ChatRenderer.tools_route` says which way the tools reach the model.

Template variables (`--chat-template-kwargs`, e.g. Qwen3's `enable_thinking`) go to every rendering;
`template_kwargs_note` names those the template does not read, for the commands to print.

Left out: templates without a chat format (raw-text prompts get wrapped as one user message),
multimodal content, and tool formats other than Hermes for templates that drop the tools.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Callable

from aitrain_grpo.env.base import Message
from aitrain_grpo.errors import TemplateError

# ------------------------------------------------------------------------------------- rendering


def _prompt_key(messages: list[Message]) -> str:
    try:
        return json.dumps(messages, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):  # content that is not JSON (an image object): never shared
        return f"object:{id(messages)}"


# Placeholders unlikely to be rewritten by any template, used to locate where content sits.
_USER_MARK = "aitrain-user-turn"
_ASSISTANT_MARK = "aitrain-assistant-turn"
_TOOL_MARK = "aitrain-tool-result"
_SYSTEM_MARK = "aitrain-system-turn"


def describe_tools(tools: list[dict[str, Any]], results_as_user: bool) -> str:
    """The tools and how to call them, in words, for a template that does not show them itself."""
    schemas = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in tools)
    results = ("in the next user message, inside <tool_response></tool_response>" if results_as_user
               else "in the next message, from the tool")
    return (
        "# Tools\n\nYou may call the functions below to help with the task. Each one is described by a "
        f"JSON schema inside <tools></tools>:\n<tools>\n{schemas}\n</tools>\n\n"
        "To call a function, write a JSON object with its name and its arguments between <tool_call> and "
        '</tool_call>, like this:\n<tool_call>\n{"name": "<function name>", "arguments": {<arguments as '
        f"JSON>}}}}\n</tool_call>\nEach result comes back {results}."
    )


def _renders(render: Callable[[list[Message]], str], messages: list[Message], mark: str) -> bool:
    """Whether the template renders `messages` and keeps the content `mark` (it may raise or drop it)."""
    try:
        return mark in render(messages)
    except Exception:  # a template that rejects a role raises whatever its author chose
        return False


_PROBE_CONVERSATION = [{"role": "system", "content": _SYSTEM_MARK}, {"role": "user", "content": _USER_MARK},
                       {"role": "assistant", "content": _ASSISTANT_MARK}, {"role": "user", "content": _USER_MARK}]


def template_kwargs_note(tokenizer, template_kwargs: dict | None) -> str | None:
    """A `note:` naming the `--chat-template-kwargs` variables that change nothing in the tokenizer's chat
    template (a misspelt `enable_thinking`, a Qwen3 flag given to another model): a short conversation
    rendered, with the generation prompt, with every variable and with each one left out."""
    if not template_kwargs or not getattr(tokenizer, "chat_template", None):
        return None

    def render(variables: dict) -> str | None:
        try:
            return tokenizer.apply_chat_template(_PROBE_CONVERSATION, tokenize=False, add_generation_prompt=True,
                                                 **variables)
        except Exception:  # a template that rejects the conversation: the renderer says so in its own words
            return None

    whole = render(template_kwargs)
    unread = [key for key in template_kwargs
              if whole is not None and render({k: v for k, v in template_kwargs.items() if k != key}) == whole]
    if not unread:
        return None
    names = ", ".join(unread)
    return (f"note: --chat-template-kwargs {names} change{'s' if len(unread) == 1 else ''} nothing in "
            f"{getattr(tokenizer, 'name_or_path', None) or 'the model'}'s chat template (it does not read "
            f"{'it' if len(unread) == 1 else 'them'}); check the name against the template, or leave "
            f"{'it' if len(unread) == 1 else 'them'} out")


class ChatRenderer:
    """Renders prompts and environment replies to token ids with a tokenizer's chat template."""

    def __init__(self, tokenizer, tools: list[dict[str, Any]] | None = None, template_kwargs: dict | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the model's tokenizer has no chat template; use a chat/instruct model or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.template_kwargs = dict(template_kwargs or {})
        self._plan_tools()
        self.eos_token_id = tokenizer.eos_token_id
        eos_text = tokenizer.eos_token or ""
        base = self._base_conversation()
        rendered = self.render(base, add_generation_prompt=False)
        at = rendered.rfind(_ASSISTANT_MARK)
        if at < 0:
            raise TemplateError("the chat template drops assistant message content; it cannot be used for RL")
        after_content = rendered[at + len(_ASSISTANT_MARK):]
        # What the template writes after an assistant turn's content. When the model stopped on EOS,
        # the EOS is already among the sampled tokens, and only the rest belongs to the environment.
        self._close_after_eos = after_content[len(eos_text):] if eos_text and after_content.startswith(eos_text) else None
        self._close_without_eos = after_content
        self._base_text = rendered
        self._suffix_cache = lru_cache(maxsize=4096)(self._suffix_text)

    def _base_conversation(self) -> list[Message]:
        return [{"role": "user", "content": _USER_MARK}, {"role": "assistant", "content": _ASSISTANT_MARK}]

    def _apply_template(self, messages: list[Message], tools, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def _plan_tools(self) -> None:
        """Decide how the tools and their results reach the model with this template (see the module doc)."""
        self._template_tools = self.tools
        self._tools_text: str | None = None
        self._tool_results_as_user = False
        self.tools_route: str | None = None
        if not self.tools:
            return
        probe = [{"role": "user", "content": _USER_MARK}]
        try:
            with_tools = self._apply_template(probe, self.tools, add_generation_prompt=False)
        except Exception:  # the template rejects the tools argument: treat it as one that drops them
            with_tools = None
        if with_tools is not None and with_tools != self._apply_template(probe, None, add_generation_prompt=False):
            self.tools_route = "tools reach the model through its chat template"
            return
        self._template_tools = None

        def plain(messages: list[Message]) -> str:
            return self._apply_template(messages, None, add_generation_prompt=False)

        self._system_role = _renders(plain, [{"role": "system", "content": _SYSTEM_MARK}] + probe, _SYSTEM_MARK)
        tool_reply = [{"role": "assistant", "content": _ASSISTANT_MARK}, {"role": "tool", "name": "f", "content": _TOOL_MARK}]
        self._tool_results_as_user = not _renders(plain, probe + tool_reply, _TOOL_MARK)
        self._tools_text = describe_tools(self.tools, self._tool_results_as_user)
        where = "system message" if self._system_role else "first user message (the template has no system role)"
        results = "user messages in <tool_response>" if self._tool_results_as_user else "tool messages"
        self.tools_route = (f"the chat template ignores tools: they are described in the {where} (JSON schemas in "
                            f"<tools>, calls as <tool_call>), and tool results are sent as {results}")

    def _with_tools_described(self, messages: list[Message]) -> list[Message]:
        """`messages` rewritten for a template that drops the tools (see `_plan_tools`)."""
        out: list[Message] = []
        after_result = False
        for message in messages:
            if message.get("role") == "tool" and self._tool_results_as_user:
                block = f"<tool_response>\n{message.get('content', '')}\n</tool_response>"
                if after_result:  # several results of one reply share one user message
                    out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{block}"}
                else:
                    out.append({"role": "user", "content": block})
                after_result = True
            else:
                out.append(message)
                after_result = False
        role = "system" if self._system_role else "user"
        at = 0 if self._system_role else next((i for i, m in enumerate(out) if m.get("role") == "user"), 0)
        if at < len(out) and out[at].get("role") == role and isinstance(out[at].get("content"), str):
            content = out[at]["content"]
            joined = f"{content}\n\n{self._tools_text}" if role == "system" else f"{self._tools_text}\n\n{content}"
            out[at] = {**out[at], "content": joined}
        else:
            out.insert(at, {"role": role, "content": self._tools_text})
        return out

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        if self._tools_text is not None:
            messages = self._with_tools_described(messages)
        return self._apply_template(messages, self._template_tools, add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """One tokenizer call for a batch: a call costs far more than the few short texts in it."""
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Token ids of the prompt messages followed by the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def prompt_ids_many(self, prompts: list[list[Message]]) -> list[list[int]]:
        """`prompt_ids` of each prompt; a prompt repeated in the batch (a GRPO group) is rendered once."""
        keys = [_prompt_key(messages) for messages in prompts]
        first: dict[str, list[Message]] = {}
        for key, messages in zip(keys, prompts):
            first.setdefault(key, messages)
        texts = [self.render(messages, add_generation_prompt=True) for messages in first.values()]
        encoded = dict(zip(first, self.encode_many(texts)))
        return [list(encoded[key]) for key in keys]

    def _suffix_text(self, reply_key: str) -> str:
        reply = json.loads(reply_key)
        full = self.render(self._base_conversation() + reply, add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise TemplateError("the chat template rewrites earlier turns when a reply is added")
        return full[len(self._base_text):]

    def closing_text(self, ended_with_eos: bool) -> str:
        """What the template writes after an assistant turn's content (beyond a sampled EOS)."""
        if ended_with_eos and self._close_after_eos is not None:
            return self._close_after_eos
        return self._close_without_eos

    def reply_text(self, reply: list[Message], ended_with_eos: bool) -> str:
        """The text that follows a model turn: the end of that turn as the template writes it, the
        environment's reply messages, and the next generation prompt."""
        return self.closing_text(ended_with_eos) + self._suffix_cache(json.dumps(reply, sort_keys=True, ensure_ascii=False))

    def reply_ids(self, reply: list[Message], ended_with_eos: bool) -> list[int]:
        """`reply_text` as token ids."""
        return self.encode(self.reply_text(reply, ended_with_eos))

    def check_append_only(self, prompt: list[Message]) -> str | None:
        """Render a short multi-turn episode both ways (suffixes vs the whole conversation) and return a
        description of the first difference, or None when the token rules hold exactly."""
        conversation = list(prompt)
        ids = self.prompt_ids(conversation)
        turns = [
            ("Let me check.", [{"role": "user", "content": "Please go on."}]),
            ('<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>', [{"role": "tool", "name": "lookup", "content": "{\"result\": 1}"}]),
            ("Done.", None),
        ]
        try:
            for text, reply in turns:
                ids = ids + self.encode(text) + ([self.eos_token_id] if self.eos_token_id is not None else [])
                conversation.append({"role": "assistant", "content": text})
                if reply is not None:
                    ids = ids + self.reply_ids(reply, ended_with_eos=True)
                    conversation.extend(reply)
        except TemplateError as exc:
            return str(exc)
        expected = self.render(conversation, add_generation_prompt=False)
        got = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        got += self.closing_text(ended_with_eos=True)
        if expected == got:
            return None
        at = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
        return (
            "the chat template is not append-only (it rewrites earlier turns); near character "
            f"{at} the full rendering has {expected[at:at + 40]!r} where the episode tokens have {got[at:at + 40]!r}"
        )
