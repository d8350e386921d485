"""Checking the rows an environment's `build_dataset` returns: every row a dict with a usable `prompt`.

`build_rows(env, tokenizer)` calls `build_dataset` and `validate_dataset` converts what it returned (a
`datasets.Dataset`, a list of dicts, any iterable of mappings) into a list of plain dicts, raising
`EnvLoadError` with one line naming the row and the fix; the rows come back as training stores them
(env/arrow_rows.py), so env check, eval and sft play the values training's episodes get (the round trip
takes about a second for 100k rows). The valid case is checked with exact types first so that 100k rows
stay cheap; only a row that fails it goes through the slow, explaining path.

Left out: columns other than `prompt` (they are the environment's own business), and prefills (a prompt
ending with an assistant message that the model would continue, as TRL does): such a prompt is refused,
since the engine's turns start after the prompt.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from aitrain_grpo.env.arrow_rows import stored_rows
from aitrain_grpo.env.base import MESSAGE_ROLES
from aitrain_grpo.errors import EnvLoadError, one_line, raised_message

_ROLE_LIST = ", ".join(MESSAGE_ROLES)


def _is_plain_prompt(prompt: Any) -> bool:
    """The common, valid case, checked with exact types only (no ABC isinstance) so 100k rows stay cheap."""
    if type(prompt) is str:
        return bool(prompt) and not prompt.isspace()
    if type(prompt) is not list or not prompt:
        return False
    for message in prompt:
        if type(message) is not dict or type(message.get("content")) is not str:
            return False
        role = message.get("role")
        if type(role) is not str or role not in MESSAGE_ROLES:
            return False
    return role != "assistant"  # the last message's


def _check_prompt(prompt: Any, index: int, source: str) -> None:
    """The slow path: find what is wrong with a prompt (or accept an unusual but valid one)."""
    where = f"row {index} from {source}"
    if isinstance(prompt, str):
        if not prompt.strip():
            raise EnvLoadError(f"{where} has an empty 'prompt' string; give it the task text")
        return
    if not isinstance(prompt, list):
        raise EnvLoadError(f"{where} has a 'prompt' of type {type(prompt).__name__}; it must be a string or "
                           f"a list of {{'role', 'content'}} messages")
    if not prompt:
        raise EnvLoadError(f"{where} has an empty 'prompt' list; add at least one message such as "
                           f"{{'role': 'user', 'content': '...'}}")
    for j, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            raise EnvLoadError(f"{where}: prompt message {j} is a {type(message).__name__}, not a dict; "
                               f"write {{'role': 'user', 'content': '...'}}")
        role = message.get("role")
        if not isinstance(role, str) or role not in MESSAGE_ROLES:
            problem = "has no 'role'" if role is None else f"has role {one_line(repr(role), 40)}"
            raise EnvLoadError(f"{where}: prompt message {j} {problem}; roles must be one of "
                               f"{_ROLE_LIST}")
        content = message.get("content")
        if isinstance(content, str):
            continue
        # An assistant message that only calls tools legitimately has no text.
        if content is None and role == "assistant" and message.get("tool_calls"):
            continue
        problem = "has no 'content'" if content is None else f"has 'content' of type {type(content).__name__}"
        raise EnvLoadError(f"{where}: prompt message {j} ({role}) {problem}; content must be a string")
    if prompt[-1].get("role") == "assistant":
        # Rendered, it is a finished assistant turn and the model would start another (TRL continues it).
        raise EnvLoadError(f"{where}: the prompt ends with an assistant message, which would be sent as a finished "
                           f"turn; a prefill is not continued: end the prompt with the user's message (an answer "
                           f"to grade belongs in another column)")


def validate_dataset(rows: Any, source: str = "build_dataset") -> list[dict[str, Any]]:
    """Check the rows an environment built and return them as a list of plain dicts.

    Accepts a `datasets.Dataset`, a list of dicts, or any iterable of mappings. `source` names where the
    rows came from in error messages (e.g. 'HotelEnv.build_dataset').
    """
    returned = f"{source} returned {type(rows).__name__}"
    datasets = sys.modules.get("datasets")  # a Dataset can only exist if datasets is imported
    if datasets is not None and isinstance(rows, getattr(datasets, "Dataset", ())):
        if "prompt" not in rows.column_names:
            raise EnvLoadError(f"{source} returned a Dataset without a 'prompt' column (columns: "
                               f"{', '.join(rows.column_names) or 'none'}); add a 'prompt' column")
        converted = rows.to_list()  # Arrow -> fresh Python dicts in one pass
    elif rows is None:
        raise EnvLoadError(f"{returned}; return a list of dicts or a datasets.Dataset (is a `return` "
                           f"statement missing?)")
    elif isinstance(rows, Mapping):
        splits = ", ".join(map(str, rows)) if type(rows).__name__ == "DatasetDict" else ""
        hint = f"pick one split, e.g. ds[{next(iter(rows))!r}] (splits: {splits})" if splits else \
            "return a list of row dicts, or datasets.Dataset.from_dict(columns) for a dict of columns"
        raise EnvLoadError(f"{returned}, a mapping, not a list of rows; {hint}")
    elif type(rows).__name__ == "DataFrame":
        raise EnvLoadError(f"{returned}; return df.to_dict('records') or datasets.Dataset.from_pandas(df)")
    elif isinstance(rows, (str, bytes)) or not isinstance(rows, Iterable):
        raise EnvLoadError(f"{returned}; return a list of dicts (each with a 'prompt') or a datasets.Dataset")
    else:
        converted = []
        for index, row in enumerate(rows):
            if type(row) is not dict and not isinstance(row, Mapping):
                raise EnvLoadError(f"row {index} from {source} is a {type(row).__name__}, not a dict; each "
                                   f"row must be a dict with a 'prompt'")
            converted.append(dict(row))  # shallow: the caller's row objects are never mutated
    if not converted:
        raise EnvLoadError(f"{source} returned no rows; return at least one row with a 'prompt'")
    for index, row in enumerate(converted):
        if "prompt" not in row:
            columns = ", ".join(map(str, row)) or "none"
            raise EnvLoadError(f"row {index} from {source} has no 'prompt' (columns: {one_line(columns, 120)})"
                               f"; add 'prompt': a string or a list of {{'role', 'content'}} messages")
        if not _is_plain_prompt(row["prompt"]):
            _check_prompt(row["prompt"], index, source)
    return converted


def _takes_tokenizer(method: Any) -> bool:
    """Whether `method` (bound) takes an argument: `def build_dataset(self)`, written by an environment
    that needs no tokenizer, is called without one (the call failed, located in this file)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): call it as documented
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    return any(p.kind in positional for p in parameters)


def build_rows(env: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """Call `env.build_dataset(tokenizer)` (or `build_dataset()`, where it takes no tokenizer) and validate
    what it returns."""
    name = type(env).__name__
    try:
        method = env.build_dataset
        rows = method(tokenizer) if _takes_tokenizer(method) else method()
        if inspect.isawaitable(rows):  # an `async def build_dataset` is accepted
            rows = asyncio.run(rows)
    except Exception as exc:
        raise EnvLoadError(f"{raised_message(f'build_dataset of {name}', exc)}; fix {name}.build_dataset") from exc
    rows = validate_dataset(rows, source=f"{name}.build_dataset")
    return stored_rows(rows, f"{name}.build_dataset")
