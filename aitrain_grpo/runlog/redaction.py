"""Keeping secrets out of the files a run writes (`run_config.json`, transcripts).

Secrets reach a run's options in three ways, and `redact` replaces each with "<redacted>" in any
JSON-like value (dicts, lists, strings; an `--rl-env-config` JSON string is parsed, redacted and
written back as JSON); `redact_strings`, for transcripts, does the first and the last only:

- the value of a secret environment variable (`HF_TOKEN`, `WANDB_API_KEY`, anything whose name has a
  part such as TOKEN, SECRET, PASSWORD or API_KEY) pasted into an option;
- a string under a key that names a secret (`api_key`, `hf_token`, `password`, ...), except a key
  ending in `_env` (`rl_judge_api_key_env`), whose value names the variable that holds the secret;
- credentials inside a URL (`https://user:pass@host`).

Left out: guessing secrets from their shape alone (entropy checks would also hide harmless ids), and
numbers under secret-sounding keys (`token_budget: 100` is a budget, not a token).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

REDACTED = "<redacted>"
_SECRET_PARTS = {"token", "secret", "password", "passwd", "apikey", "credential", "credentials", "auth"}
# "key" alone is too common (`sort_key`, `answer_key`); these qualify it.
_KEY_KINDS = {"api", "access", "private", "secret", "ssh", "signing"}
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@:]+:[^/\s@]+@")
MIN_SECRET_LENGTH = 8  # shorter values ("1", "true") would blank out ordinary text


def is_secret_name(name: str) -> bool:
    parts = re.split(r"[^a-z0-9]+", name.lower())
    if any(part in _SECRET_PARTS for part in parts):
        return True
    return any(a in _KEY_KINDS and b == "key" for a, b in zip(parts, parts[1:]))


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of the environment's secret-named variables, longest first (so a secret that contains
    another is replaced whole)."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def redact_strings(value: Any, secrets: list[str] | None = None) -> Any:
    """A copy of `value` with secret values and URL credentials replaced inside every string, and
    nothing else changed: for transcripts, whose text should stay as the model and environment wrote it."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, dict):
        return {k: redact_strings(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_strings(v, secrets) for v in value]
    return redact_text(value, secrets) if isinstance(value, str) else value


def redact(value: Any, secrets: list[str] | None = None) -> Any:
    """A copy of `value` with secrets replaced; see the module docstring."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(v, str) and v and is_secret_name(str(k)) and not str(k).lower().endswith("_env")
            else redact(v, secrets)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("{"):
            try:
                parsed = json.loads(stripped)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                return json.dumps(redact(parsed, secrets))
        return redact_text(value, secrets)
    return value
