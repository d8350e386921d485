"""Tool calls read from a model turn's text, in the forms real models write (`--rl-tool-parser`).

Every form ends in the same place: a list of `{"name", "arguments"}` calls and a list of problems (a
malformed call, which the environment answers with an `Error: ...` message). Model text is parsed as
JSON, or as a Python expression tree whose values must be literals; it is never evaluated.

Forms (vLLM's tool-parser names where they exist):
- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen, Hermes, our tiny model);
- `json`: a JSON object with `name` and `arguments` (or `parameters`), or a list of them, bare or in a
  ```json code block (small instruct models often answer so, without tags);
- `llama3_json`: Llama 3's `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`, several
  separated by `;`;
- `mistral`: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`, or the newer `[TOOL_CALLS]name[ARGS]{...}`;
- `pythonic`: `[get_weather(city="Lisbon"), other(x=1)]` (Llama 3.2/4's form), keyword literals only.
`auto` (the default) reads Hermes blocks, then the explicit markers of Mistral and Llama 3, and only
where a turn has none of those, one call in the JSON or pythonic form, and only if every call in it names
a tool of the environment: a JSON object in an answer that names no tool stays prose.

Left out: forms that need the tokenizer's special-token ids rather than text (e.g. gpt-oss's harmony
channels), XML tool formats, and streaming (a turn is parsed once it is complete).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable, Iterable, NamedTuple

from aitrain_grpo.env.base import ToolCall

MAX_TOOL_CALL_CHARS = 16_000

_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_CODE_BLOCK = re.compile(r"```(?:json|python|tool_code)?\s*\n?(.*?)```", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_TAG = "[TOOL_CALLS]"
_TRAILING_SPECIAL = re.compile(r"(\s*(<\|[^|<>]{1,40}\|>|</s>))+\s*$")
_MISTRAL_NAMED = re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z_][\w.\-]*)\s*\[ARGS\]")


class ParsedTurn(NamedTuple):
    """What one model turn was read as: its calls, the problems found, and the form that matched
    (None when the turn is prose)."""

    calls: list[ToolCall]
    problems: list[str]
    form: str | None


_PROSE = ParsedTurn([], [], None)


def call_from_data(data: Any) -> tuple[ToolCall | None, str | None]:
    """A decoded JSON value as one call, or the reason it is not one."""
    if not isinstance(data, dict):
        return None, f'tool call must be a JSON object with "name" and "arguments", got {type(data).__name__}'
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return None, 'tool call has no "name" string'
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None, f'"arguments" of {name} is a string that is not valid JSON'
    if not isinstance(arguments, dict):
        return None, f'"arguments" of {name} must be a JSON object, got {type(arguments).__name__}'
    return {"name": name, "arguments": arguments}, None


def _decode(body: str) -> tuple[Any, str | None]:
    body = body.strip()
    if len(body) > MAX_TOOL_CALL_CHARS:
        return None, f"tool call is too long ({len(body)} characters; the limit is {MAX_TOOL_CALL_CHARS})"
    try:
        return json.loads(body), None
    except json.JSONDecodeError as exc:
        return None, f"tool call is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except RecursionError:
        return None, "tool call JSON is nested too deeply"


def _calls_from_json(body: str) -> tuple[list[ToolCall], list[str]]:
    """One JSON object or a list of them, as calls; every item that is not a call is a problem."""
    data, problem = _decode(body)
    if problem:
        return [], [problem]
    calls, problems = [], []
    for item in data if isinstance(data, list) else [data]:
        call, problem = call_from_data(item)
        if call is not None:
            calls.append(call)
        else:
            problems.append(problem)
    return calls, problems


# ------------------------------------------------------------------------------------- the forms


def parse_hermes(text: str) -> ParsedTurn:
    calls: list[ToolCall] = []
    problems: list[str] = []
    end = 0
    for match in _HERMES_CALL.finditer(text):
        found, trouble = _calls_from_json(match.group(1))
        calls.extend(found)
        problems.extend(trouble)
        end = match.end()
    if "<tool_call>" in text[end:]:
        problems.append("unterminated <tool_call> (missing </tool_call>)")
    return ParsedTurn(calls, problems, "hermes") if calls or problems else _PROSE


def _json_candidates(text: str) -> list[str]:
    """Where a JSON call may sit in a turn: the code blocks, else the whole text."""
    blocks = [b for b in _CODE_BLOCK.findall(text) if b.strip()]
    return blocks or [text]


def parse_json(text: str) -> ParsedTurn:
    calls: list[ToolCall] = []
    problems: list[str] = []
    for candidate in _json_candidates(text):
        stripped = _TRAILING_SPECIAL.sub("", candidate.strip())  # `{...}<|im_end|>` when specials are kept
        if not stripped.startswith(("{", "[")):
            continue
        found, trouble = _calls_from_json(stripped)
        calls.extend(found)
        problems.extend(trouble)
    return ParsedTurn(calls, problems, "json") if calls or problems else _PROSE


def parse_llama3_json(text: str) -> ParsedTurn:
    body = text.split(_PYTHON_TAG, 1)[1] if _PYTHON_TAG in text else text
    body = body.strip()
    if not body.startswith("{"):
        return ParsedTurn([], [f"expected a JSON call after {_PYTHON_TAG}"], "llama3_json") if _PYTHON_TAG in text else _PROSE
    calls: list[ToolCall] = []
    problems: list[str] = []
    for part in _split_top_level(body, ";"):
        found, trouble = _calls_from_json(part)
        calls.extend(found)
        problems.extend(trouble)
    return ParsedTurn(calls, problems, "llama3_json")


def parse_mistral(text: str) -> ParsedTurn:
    if _MISTRAL_TAG not in text:
        return _PROSE
    named = list(_MISTRAL_NAMED.finditer(text))
    calls: list[ToolCall] = []
    problems: list[str] = []
    if named:  # [TOOL_CALLS]name[ARGS]{...}, possibly several
        for i, match in enumerate(named):
            end = named[i + 1].start() if i + 1 < len(named) else len(text)
            arguments, problem = _decode(text[match.end():end])
            call, problem = (None, problem) if problem else call_from_data({"name": match.group(1), "arguments": arguments})
            if call is not None:
                calls.append(call)
            else:
                problems.append(problem)
    else:
        calls, problems = _calls_from_json(text.split(_MISTRAL_TAG, 1)[1])
    return ParsedTurn(calls, problems, "mistral")


def parse_pythonic(text: str) -> ParsedTurn:
    """`[f(a=1), g(b="x")]`: the expression tree is read, never run; every value must be a literal."""
    body = text.strip()
    blocks = _CODE_BLOCK.findall(body)
    if blocks:
        body = blocks[0].strip()
    if not (body.startswith("[") and body.endswith("]")) or len(body) > MAX_TOOL_CALL_CHARS:
        return _PROSE
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return _PROSE
    if not isinstance(tree, ast.List) or not tree.elts or not all(isinstance(e, ast.Call) for e in tree.elts):
        return _PROSE
    calls: list[ToolCall] = []
    problems: list[str] = []
    for node in tree.elts:
        if not isinstance(node.func, ast.Name):
            problems.append(f"tool call {ast.unparse(node.func)[:60]!r} is not a plain function name")
            continue
        if node.args:
            problems.append(f"tool call {node.func.id} passes arguments by position; name each one (x=...)")
            continue
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except (ValueError, TypeError, SyntaxError, RecursionError):
            problems.append(f"an argument of {node.func.id} is not a literal value (a string, number, list or dict)")
            continue
        calls.append({"name": node.func.id, "arguments": arguments})
    return ParsedTurn(calls, problems, "pythonic")


def _split_top_level(text: str, separator: str) -> list[str]:
    """`text` split at `separator` outside JSON strings and brackets."""
    parts, depth, start, in_string, escaped = [], 0, 0, False, False
    for i, char in enumerate(text):
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


FORMS: dict[str, Callable[[str], ParsedTurn]] = {
    "hermes": parse_hermes,
    "json": parse_json,
    "llama3_json": parse_llama3_json,
    "mistral": parse_mistral,
    "pythonic": parse_pythonic,
}


def read_tool_calls(text: str, parser: str = "auto", tool_names: Iterable[str] = ()) -> ParsedTurn:
    """Read one model turn with `parser` ("auto" or a key of FORMS; config.TOOL_PARSERS). Never raises. Under `auto`, a turn
    without an explicit marker is a call only when every call it holds names one of `tool_names`."""
    if parser != "auto":
        return FORMS[parser](text)
    for form, marker in (("hermes", "<tool_call>"), ("mistral", _MISTRAL_TAG), ("llama3_json", _PYTHON_TAG)):
        if marker in text:
            return FORMS[form](text)
    known = set(tool_names)
    for form in ("json", "pythonic"):
        parsed = FORMS[form](text)
        if parsed.calls and not parsed.problems and all(call["name"] in known for call in parsed.calls):
            return parsed
    return _PROSE


def parse_tool_calls(text: str, fmt: str = "hermes", tool_names: Iterable[str] = ()) -> tuple[list[ToolCall], list[str]]:
    """(calls, problems) of one model turn: `read_tool_calls` without the form."""
    parsed = read_tool_calls(text, fmt, tool_names)
    return parsed.calls, parsed.problems


def tool_names_of(schemas: Iterable[dict[str, Any]]) -> list[str]:
    """The function names of chat-template tool schemas (`{"type": "function", "function": {...}}` or bare)."""
    names = []
    for schema in schemas:
        function = schema.get("function", schema) if isinstance(schema, dict) else {}
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.append(function["name"])
    return names
