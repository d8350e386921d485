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

Left out: what Arrow does to rows it can store (a nested dict column gets every row's keys, missing ones as
None; ints beside floats become floats). The environment sees its rows back in that form.
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


def arrow_dataset(rows: list[dict[str, Any]], source: str = "build_dataset"):
    """`rows` (validated by env/dataset.py) as a `datasets.Dataset`, or `EnvLoadError` in one line."""
    import pyarrow
    from datasets import Dataset

    rows = _one_prompt_form(rows)
    try:
        return Dataset.from_list(rows)
    except (pyarrow.ArrowException, TypeError, ValueError, OverflowError) as exc:
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
