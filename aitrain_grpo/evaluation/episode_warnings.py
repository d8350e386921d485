"""What env check can tell from the played episodes about the environment's own code, beyond scores:
values in `episode.metrics` that training cannot log, and empty replies from `step`.

Both are legal (nothing fails), which is why they need saying: a text metric is dropped from every
step's log without a word, and `step` returning "" sends the model an empty user message where the
author most often meant to end the episode (None) or forgot to fill the reply.

Left out: the scores (envcheck.judge) and probes (probes.py).
"""

from __future__ import annotations

from typing import Iterable

from aitrain_grpo.engine.stats import is_logged_metric
from aitrain_grpo.env.base import Episode
from aitrain_grpo.errors import one_line


def episode_warnings(episodes: Iterable[Episode]) -> list[str]:
    """One warning per kind of mistake found in `episodes` (every policy's), naming an example."""
    unlogged: dict[str, object] = {}  # key -> its first value that is not a number
    empty = 0  # episodes with an empty environment reply
    for episode in episodes:
        for key, value in episode.metrics.items():
            if not is_logged_metric(value):
                unlogged.setdefault(key, value)
        empty += any(m.get("role") == "user" and not str(m.get("content") or "").strip() for m in replies(episode))
    warnings = []
    if unlogged:
        shown = "; ".join(f"{k!r} is {type(v).__name__} {one_line(repr(v), 40)}" for k, v in list(unlogged.items())[:3])
        warnings.append(f"episode.metrics holds values that are not numbers, which training does not log: {shown}; "
                        f"put a number there (a flag as True/False, a count), or text in episode.state")
    if empty:
        warnings.append(f"step replied with empty text in {empty} episode(s): the model was sent an empty message; "
                        f"return None to end the episode, or the text the model should answer")
    return warnings


def replies(episode: Episode) -> list[dict]:
    """The messages after the model's first turn that are not its own: the environment's replies."""
    messages = episode.messages
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return [m for m in messages[first:] if m.get("role") != "assistant"]
