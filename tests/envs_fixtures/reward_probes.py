"""Reward functions for tests/test_reward_funcs.py: one that records what it was given (to the file named
by $AITRAIN_REWARD_PROBE), one that always raises, and ones the loading checks must refuse."""

from __future__ import annotations

import json
import os


def recorded(prompts, completions, episodes, **kwargs):
    """Writes one JSON line per call; rewards each episode by its message count (so it varies)."""
    with open(os.environ["AITRAIN_REWARD_PROBE"], "a", encoding="utf-8") as log:
        log.write(json.dumps({
            "completions": len(completions),
            "episodes": len(episodes),
            "episode_type": type(episodes[0]).__name__,
            "roles": [[m["role"] for m in ep.messages] for ep in episodes],
            "scores": [ep.score for ep in episodes],
            "model_tokens": kwargs["model_tokens"],
            "city": kwargs.get("city"),
            "rows_match": [ep.row.get("city") for ep in episodes] == kwargs.get("city"),
            # Episode i is completion i: its longest model turn is in the completion's text.
            "in_order": all(max(turns(ep), key=len) in text_of(c) for ep, c in zip(episodes, completions)),
            "keywords": sorted(kwargs),
        }) + "\n")
    return [min(1.0, len(ep.messages) / 10) for ep in episodes]


def turns(episode):
    return [str(m["content"] or "") for m in episode.messages if m["role"] == "assistant"]


def text_of(completion) -> str:
    """TRL's completion: text, or (chat prompts) a list holding one assistant message."""
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def broken(**kwargs):
    raise ValueError("probe failure")


def abstains(episodes, **kwargs):
    return [None for _ in episodes]


def no_kwargs(completions):
    return [0.0 for _ in completions]


def needs_unknown(completions, secret_sauce, **kwargs):
    return [0.0 for _ in completions]


not_a_function = 3


def e_share(episodes, **kwargs):
    """The share of 'e' in the model's turns (mean over turns), like envs.letters with letter 'e'."""
    shares = []
    for ep in episodes:
        texts = turns(ep)
        shares.append(sum(t.count("e") / len(t) if t else 0.0 for t in texts) / max(len(texts), 1))
    return shares


def conversations(episodes, **kwargs):
    """Writes each call's conversations (role and content, as a reward model reads them); rewards nothing."""
    with open(os.environ["AITRAIN_REWARD_PROBE"], "a", encoding="utf-8") as log:
        log.write(json.dumps([[{"role": m["role"], "content": m["content"] or ""} for m in ep.messages]
                              for ep in episodes]) + "\n")
    return [0.0 for _ in episodes]


def e_share_hundredfold(episodes, **kwargs):
    """`e_share` on a scale a hundred times larger (a reward model's logits against a 0-1 score)."""
    return [100 * share for share in e_share(episodes)]
