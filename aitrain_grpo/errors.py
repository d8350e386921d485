"""The error hierarchy a user sees, and the helper that makes any message one line.

Every mistake a user can fix (a bad flag, an environment that does not load, a chat template that
cannot keep token rules) is a `UserError`: its message is one line, "problem; fix", and the CLI prints
it as `error: ...` and exits 2 without a traceback (with `--debug`, the traceback too). Faults that
happen mid-run (a dead generation server) are not user errors: they stop training with a checkpoint
(train/stopping.py) and exit 1.

Left out: printing (commands/cli.py) and the exit codes of early stops (train/stopping.py).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

EXIT_USAGE = 2
MAX_DETAIL = 300  # characters of an embedded message; the CLI shows one line
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def one_line(text: Any, limit: int = MAX_DETAIL) -> str:
    """Collapse a message to one line; a long one is cut (with "...") so the line stays readable."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def describe_exception(exc: BaseException, limit: int = MAX_DETAIL) -> str:
    """`Type: message` on one line (just `Type` when the message is empty)."""
    message = one_line(exc, limit)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _is_library_file(filename: str) -> bool:
    # Frames in this package, the standard library, site-packages or importlib say little about the
    # user's bug.
    if filename.startswith("<") or filename.startswith(_PACKAGE_DIR):
        return True
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return any(filename.startswith(os.path.join(p, "lib")) for p in prefixes)


def user_location(exc: BaseException) -> str | None:
    """'file:line' of the innermost traceback frame in the user's code (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in frames if not f.filename.startswith("<")]
    if not frames:
        return None
    user = [f for f in frames if not _is_library_file(f.filename)]
    frame = (user or frames)[-1]
    return f"{frame.filename}:{frame.lineno}"


def raised_message(what: str, exc: BaseException) -> str:
    """"WHAT raised Type: message (at file:line)": how an error names a user callable that failed."""
    location = user_location(exc)
    return f"{what} raised {describe_exception(exc)}" + (f" (at {location})" if location else "")


class UserError(ValueError):
    """A problem the user can fix. The message is one line: what is wrong; how to fix it."""

    exit_code = EXIT_USAGE


class ConfigError(UserError):
    """A run option (flag, config file, model name) is invalid."""


class EnvLoadError(UserError):
    """An environment could not be loaded, built or validated."""


class EnvFailedError(UserError):
    """Every episode of an evaluation ended in an environment error: its scores say nothing of the model."""

    exit_code = 1


class TemplateError(UserError):
    """The chat template cannot be used for token-in/token-out episodes."""


def parsed_json(text: str, what: str, fix: str, error: type[UserError] = ConfigError) -> Any:
    """`text` read as JSON, or `error` saying "WHAT is not valid JSON: <why> at line L, column C; FIX"."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}; {fix}") from None
