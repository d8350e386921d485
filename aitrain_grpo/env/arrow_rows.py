"""The rows `build_dataset` returned, as the `datasets.Dataset` training samples from, or one line saying why not.

TRL trains from a `datasets.Dataset`, which stores each column as one Arrow type. Rows that Python holds
happily can have no such type: an `answer` that is 2 in one row and "four" in another, a `prompt` that is a
string in one row and a list of messages in another. `Dataset.from_list` then raised a pyarrow traceback
after the model had loaded, while `env check` and `eval` (which never build the table) passed the same rows.
`arrow_dataset` is the one place the table is built, and `env check` calls it too:

- prompts mixing both valid forms become messages throughout (a string is one user message), as the
  rollout reads them anyway (`prompt_messages`);
- any other column Arrow cannot type is refused in one line naming the column, the two rows whose values
  differ and the fix; a failure it cannot pin on a top-level column keeps Arrow's own message, on one line.

What Arrow does to rows it can store (a set becomes a list, ints beside floats become floats, a nested dict
column gets every row's keys, missing ones as None) is what the environment's episodes see in training;
`stored_rows` hands every command the rows in that form (env/dataset.build_rows), so `env check` and `eval`
do not pass rows training then plays differently.
"""

from __future__ import annotations

from typing import Any

from aitrain_grpo.env.base import prompt_messages
from aitrain_grpo.errors import EnvLoadError, one_line


def _kind(value: Any) -> str | None:
    """The Arrow-relevant kind of a value; None (null) fits any column, and ints fit beside floats."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return type(value).__name__


def _first_mixed_column(rows: list[dict[str, Any]]) -> tuple[str, tuple[int, str], tuple[int, str]] | None:
    """(column, (row, kind), (row, other kind)) for the first column whose values are of two kinds."""
    seen: dict[str, tuple[int, str]] = {}
    for index, row in enumerate(rows):
        for column, value in row.items():
            kind = _kind(value)
            if kind is None:
                continue
            first = seen.setdefault(column, (index, kind))
            if first[1] != kind:
                return column, first, (index, kind)
    return None


def _one_prompt_form(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with every prompt as messages where some are strings and some messages; else as given."""
    forms = {type(row["prompt"]) is str for row in rows}
    if len(forms) < 2:
        return rows
    return [{**row, "prompt": prompt_messages(row["prompt"])} for row in rows]


def _first_unencodable(rows: list[dict[str, Any]]) -> tuple[int, str, str] | None:
    """(row, column, character) of the first string, at any depth, that UTF-8 cannot encode (a lone surrogate,
    as `json.loads` makes of a cut emoji escape)."""
    def bad(value: Any) -> str | None:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return value[exc.start]
            return None
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        return next((char for char in map(bad, items) if char is not None), None)

    for i, row in enumerate(rows):
        for column, value in row.items():
            char = bad(value)
            if char is not None:
                return i, column, char
    return None


def arrow_dataset(rows: list[dict[str, Any]], source: str = "build_dataset"):
    """`rows` (validated by env/dataset.py) as a `datasets.Dataset`, or `EnvLoadError` in one line."""
    import pyarrow
    from datasets import Dataset

    rows = _one_prompt_form(rows)
    try:
        return Dataset.from_list(rows)
    except (pyarrow.ArrowException, TypeError, ValueError, OverflowError) as exc:
        bad_text = _first_unencodable(rows) if isinstance(exc, UnicodeEncodeError) else None
        if bad_text is not None:
            (row, column, char) = bad_text
            raise EnvLoadError(f"{source}: row {row}'s {column!r} holds {char!r}, a lone surrogate, which is not text "
                               f"UTF-8 can store; drop it, or read the source text with errors='replace'") from None
        mixed = _first_mixed_column(rows)
        if mixed is not None:
            column, (first, kind), (other, other_kind) = mixed
            raise EnvLoadError(
                f"{source}: column {column!r} is {kind} in row {first} and {other_kind} in row {other}; training "
                f"stores each column as one type (a datasets.Dataset), so give every row's {column!r} the same "
                f"type (e.g. str(value) throughout, or a JSON string for varied data)") from None
        raise EnvLoadError(f"{source}: its rows cannot be stored as a datasets.Dataset for training "
                           f"({type(exc).__name__}: {one_line(str(exc), 300)}); give each column one type in "
                           f"every row") from None


def stored_rows(rows: list[dict[str, Any]], source: str = "build_dataset") -> list[dict[str, Any]]:
    """`rows` as training's episodes get them: stored as the `datasets.Dataset` (`arrow_dataset`) and read back."""
    return arrow_dataset(rows, source).to_list()
