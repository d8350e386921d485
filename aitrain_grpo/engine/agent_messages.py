"""OpenAI chat-completions messages, as the agent endpoint reads and writes them.

Four jobs, all pure: comparing the messages of two requests (does this request extend the episode's
last one?), rewriting OpenAI-shaped messages into the plain messages a chat template renders (as a
`ToolEnvironment`'s episodes are rendered: tool results as `tool` messages naming their tool), writing
the OpenAI response and error bodies, and writing a response as the events of a streamed one.

Comparison is by meaning, not bytes: agent frameworks send our reply back in their own shape (content
None or "", arguments re-serialised, content as a list of parts), so messages are reduced to role, text
and tool calls with decoded arguments before they are compared.

Left out: images and audio in content (their parts are dropped from the text), and legacy `function_call`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aitrain_grpo.env.base import Message, ToolCall

ROLES = ("system", "developer", "user", "assistant", "tool")


class EndpointError(Exception):
    """A request the endpoint refuses: answered with `status` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.code, self.param = status, kind, code, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


def text_of(content: Any) -> str:
    """A message's content as text: a string, None, or a list of parts (their `text` joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return str(content)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw
    return raw


def calls_of(message: dict[str, Any]) -> list[ToolCall]:
    """The tool calls of an assistant message in OpenAI shape, arguments decoded."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        calls.append({"name": function.get("name", ""), "arguments": _arguments(function.get("arguments"))})
    return calls


def meaning(message: dict[str, Any]) -> str:
    """A key equal for two messages that say the same thing. An assistant message with tool calls is
    known by its calls (frameworks disagree on the content that goes with them)."""
    role = message.get("role")
    if role == "developer":
        role = "system"
    if role == "assistant":
        calls = calls_of(message)
        if calls:
            return json.dumps(["assistant", calls], sort_keys=True, ensure_ascii=False)
        return json.dumps(["assistant", text_of(message.get("content")).strip()], ensure_ascii=False)
    return json.dumps([role, text_of(message.get("content"))], ensure_ascii=False)


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's `messages`, or an `EndpointError` saying what is wrong with them."""
    if not isinstance(messages, list) or not messages:
        raise EndpointError(400, "'messages' must be a non-empty list of chat messages", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise EndpointError(400, f"messages[{i}] needs a role of {', '.join(ROLES)}", param=f"messages[{i}]")
    if messages[-1]["role"] == "assistant":
        raise EndpointError(400, "the last message is the assistant's; continuing an assistant message is not "
                                 "supported, end with a user, tool or system message", param="messages")
    return messages


def hermes_text(calls: list[ToolCall]) -> str:
    """Tool calls written as `<tool_call>` blocks (the form described to models whose template drops tools)."""
    return "".join(f"\n<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>" for call in calls)


def template_messages(messages: list[dict[str, Any]], *, native_calls: bool,
                      raw_replies: dict[str, str] | None = None) -> list[Message]:
    """OpenAI messages as the plain messages a chat template renders.

    A `tool` message gets the `name` of the call it answers (looked up by `tool_call_id`), as a
    `ToolEnvironment`'s tool results carry it. An assistant message this endpoint wrote keeps the model's
    own text (`raw_replies`, by `meaning`); another one with tool calls gets them as the template's
    `tool_calls` (`native_calls`: the template renders tools) or as `<tool_call>` blocks after its text."""
    names: dict[str, str] = {}
    out: list[Message] = []
    for message in messages:
        role = "system" if message["role"] == "developer" else message["role"]
        text = text_of(message.get("content"))
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and call.get("id"):
                    names[call["id"]] = call.get("function", {}).get("name", "")
            raw = (raw_replies or {}).get(meaning(message))
            calls = calls_of(message)
            if raw is not None:
                out.append({"role": "assistant", "content": raw})
            elif calls and native_calls:
                out.append({"role": "assistant", "content": text,
                            "tool_calls": [{"type": "function", "function": call} for call in calls]})
            else:
                out.append({"role": "assistant", "content": text + hermes_text(calls)})
        elif role == "tool":
            name = names.get(message.get("tool_call_id") or "", message.get("name") or "tool")
            out.append({"role": "tool", "name": name, "content": text})
        else:
            out.append({"role": role, "content": text})
    return out


def reply_message(content: str | None, calls: list[ToolCall]) -> dict[str, Any]:
    """The assistant message of a response: its text and its tool calls in OpenAI shape."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
            for call in calls
        ]
    return message


def completion_body(model: str, message: dict[str, Any], finish_reason: str, prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    """An OpenAI `chat.completion` object with one choice."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def stream_events(completion: dict[str, Any], include_usage: bool = False) -> bytes:
    """A finished `chat.completion` as the server-sent events of a streamed one (`stream: true`): a chunk
    with the role and text, one with the tool calls (each with its index), one with the finish reason,
    the usage chunk when `stream_options.include_usage` asked for it, then `[DONE]`. The reply is
    generated whole before the first event: streaming changes the wire format, not the tokens."""
    choice, base = completion["choices"][0], {k: completion[k] for k in ("id", "created", "model")}
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        body = {**base, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        return {**body, "usage": None} if include_usage else body

    chunks = [chunk({"role": "assistant", "content": message.get("content") or ""}, None)]
    if message.get("tool_calls"):
        calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        chunks.append(chunk({"tool_calls": calls}, None))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": completion["usage"]})
    events = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return "".join(events).encode()


def models_body(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "aitrain"}]}
