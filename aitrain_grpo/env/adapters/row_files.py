"""Reading a file of rows (`rows='data/train.jsonl'`, `--rl-env dataset:FILE`): what `load_rows` hands on.

`.parquet` and `.csv` go through `datasets`, whose readers type their columns. `.jsonl` and `.json` are read
here with the json module: `datasets.Dataset.from_json` answered a malformed line with
"DatasetGenerationError: An error occurred while generating the dataset" (neither the line nor the cause)
and an empty file with "StopIteration", and it wrote an Arrow cache for a file that is read once. Here a
bad line is named with its number, column and JSON's reason, and an empty file is called empty. A `.json`
file is an array of row objects, an object of equal-length columns, or JSON lines (as `datasets` took it).
Rows keep their Python types; a column of two types is refused where training stores the rows
(env/arrow_rows.py), with the column and rows named.

Left out: compressed files and `datasets`' `field=` (rows under a key of a larger document: read them in a
`module:function`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from aitrain_grpo.errors import EnvLoadError, describe_exception, one_line

ROW_FILES = (".parquet", ".json", ".jsonl", ".csv")
_FIX = f"give a {', '.join(ROW_FILES)} file of rows with a 'prompt' column"


def read_row_file(name: str, path: str) -> Any:
    """The rows of the file `path` (given as `name`): a list of dicts, or a `datasets.Dataset`."""
    extension = os.path.splitext(path)[1]
    if extension in (".json", ".jsonl"):
        try:
            with open(path, encoding="utf-8", errors="replace") as file:
                text = file.read()
        except OSError as exc:
            raise EnvLoadError(f"rows file {name!r} could not be read: {describe_exception(exc)}; {_FIX}") from exc
        if not text.strip():
            raise EnvLoadError(f"rows file {name!r} is empty; {_FIX}")
        return _json_rows(name, text, lines_only=extension == ".jsonl")
    import datasets

    reader = datasets.Dataset.from_parquet if extension == ".parquet" else datasets.Dataset.from_csv
    try:
        return reader(path)
    except Exception as exc:
        raise EnvLoadError(f"rows file {name!r} could not be read: {describe_exception(exc)}; {_FIX}") from exc


def _json_rows(name: str, text: str, *, lines_only: bool) -> list[Any]:
    if not lines_only:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # more than one value: JSON lines, read below
                raise _bad_json(name, exc, exc.lineno, text.splitlines()[exc.lineno - 1]) from None
        else:
            return _document_rows(name, document)
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise _bad_json(name, exc, number, line) from None
    return rows


def _document_rows(name: str, document: Any) -> list[Any]:
    """A whole `.json` document as rows: an array of rows, or an object of equal-length columns."""
    if isinstance(document, list):
        return document
    if isinstance(document, dict) and document and all(isinstance(v, list) for v in document.values()):
        lengths = {len(v) for v in document.values()}
        if len(lengths) == 1:
            return [dict(zip(document, values)) for values in zip(*document.values())]
    raise EnvLoadError(f"rows file {name!r} holds a JSON {type(document).__name__}, not rows; give an array of "
                       f"row objects, an object of equal-length column arrays, or one row object a line (.jsonl)")


def _bad_json(name: str, exc: json.JSONDecodeError, number: int, line: str) -> EnvLoadError:
    return EnvLoadError(f"rows file {name!r} line {number} is not JSON ({exc.msg} at column {exc.colno}: "
                        f"{one_line(line.strip(), 60)!r}); fix that line (each row one JSON object with a 'prompt')")
