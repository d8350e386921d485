"""Which shortcut probe a run's replies resemble: the run's best replies compared with the probes' scripted ones.

Env check plays shortcut probes (evaluation/probes.py: the prompt echoed, one word repeated to the turn
limit, the answer's format with nothing in it, every tool called in turn, and any the environment declares
with `probes()`) and warns when the score pays for one. During training the question turns round: when the
shortcut warning fires (shortcuts.py), is the policy writing one of those scripted replies? A probe's
reply needs no model, so the training rollout asks each probe, for the best-scoring episode of each
group (what GRPO's advantage pushes towards), what it would have written at each of that episode's model
turns, and logs how alike the two are as `probe/<name>` (training/rollout/probe_watch.py). The warning
then names the probe whose mean over its last steps is highest, from RESEMBLES up (`resembled_probe`);
being metrics, they reach metrics.jsonl, the report's charts and `aitrain report` like any other.

The similarity (`similarity`) is the Dice coefficient of the two texts' multisets of character trigrams
(case folded, runs of white space one space): 2 * |shared trigrams| / (|trigrams of a| + |trigrams of b|),
0 to 1. Why this one:
- on text, not tokens: a probe is a text policy, and the model's replies are logged as text;
- linear in the lengths (two Counters), where an alignment (difflib) is quadratic: a step compares
  hundreds of replies of up to --rl-max-new-tokens tokens, in the rollout's own time;
- counted, not a set: length matters. The quick start's shortcut (" a a a" until the 16-token turn is
  cut, benchmarks/SHORTCUTS.md) matches the fill-the-turn probe cut at the same limit trigram for
  trigram, while the task learned ("A a a a.", three short finished turns) shares only a few of the cut
  probe's many " a " trigrams: a set of trigrams would call both identical.

RESEMBLES, measured on the tiny model's quick start (benchmarks/SHORTCUTS.md, "Which probe the replies
resemble"): the five runs that take the fill-the-turn shortcut reach a 5-step mean of 0.62-0.70 at steps
12-23 (0-5 steps after their warning first fires) and 0.97-1.00 by the end; the five seeds that learn the
task reach 0.45 at most (seed 3's finished "A a a a a a a." turns), and no run's echo or repeat
resemblance is above 0.2 at any step. 0.6 names each shortcut within a few steps of its warning and none
of the learning runs' replies.

Left out: meaning (a paraphrase of the prompt is not an echo, a probe that needs a model is the
environment's to declare); short structured replies that differ from the hollow format in a few characters
("<answer>42</answer>" against "<answer></answer>" is 0.8), which is why only a run whose shortcut warning
fired is named a probe, never on similarity alone; and turns the model did not play (the probe's reply
there depends on a transcript that does not exist).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Mapping, Sequence

PREFIX = "probe/"   # a probe's resemblance metric: probe/<name>
NGRAM = 3           # character trigrams: short enough for 3-token replies, long enough to keep word shapes
RESEMBLES = 0.6     # named from this mean similarity up (measured: see the module doc)
MAX_TURNS = 4       # model turns compared per episode: a shortcut shows in its first turns, and each costs a probe call

_SPACE = re.compile(r"\s+")


def _grams(text: str) -> Counter:
    text = _SPACE.sub(" ", text.casefold()).strip()
    if len(text) < NGRAM:
        return Counter([text]) if text else Counter()
    return Counter(text[i:i + NGRAM] for i in range(len(text) - NGRAM + 1))


def similarity(a: str, b: str) -> float:
    """Dice coefficient of the character-trigram multisets of `a` and `b` (see the module doc): 1.0 for
    the same text up to case and spacing, 0.0 when nothing is shared; two empty texts are alike (1.0)."""
    grams_a, grams_b = _grams(a), _grams(b)
    total = sum(grams_a.values()) + sum(grams_b.values())
    if not total:
        return 1.0
    return 2 * sum((grams_a & grams_b).values()) / total


def model_turns(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The text of each assistant message, in order."""
    return [str(m.get("content") or "") for m in messages if m.get("role") == "assistant"]


def episode_resemblance(replies: Sequence[str], probe_replies: Sequence[str]) -> float | None:
    """Mean similarity of the model's reply and the probe's at each turn where the probe wrote something
    (an empty probe reply is the empty policy's, not the probe's); None when there is no such turn."""
    scores = [similarity(reply, probe) for reply, probe in zip(replies, probe_replies) if probe.strip()]
    return sum(scores) / len(scores) if scores else None


def best_of_groups(scores: Sequence[float], group_size: int) -> list[int]:
    """The index of each group's best-scoring episode (the first of equals), groups being consecutive runs
    of `group_size`; every episode when groups are of one or do not split the batch."""
    if group_size < 2 or len(scores) % group_size:
        return list(range(len(scores)))
    return [max(range(g, g + group_size), key=lambda i: (scores[i], -i)) for g in range(0, len(scores), group_size)]


def resemblance_metrics(per_episode: Sequence[Mapping[str, float | None]]) -> dict[str, float]:
    """`probe/<name>`: the mean resemblance to each probe over the episodes it could be compared on."""
    names = dict.fromkeys(name for found in per_episode for name in found)
    metrics = {}
    for name in names:
        values = [v for v in (found.get(name) for found in per_episode) if v is not None]
        if values:
            metrics[PREFIX + name] = sum(values) / len(values)
    return metrics


def _number(record: Mapping[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def resembled_probe(records: Sequence[Mapping[str, Any]], steps: int,
                    threshold: float = RESEMBLES) -> tuple[str, float] | None:
    """(name, similarity) of the probe the last `steps` records' replies resemble most, from `threshold` up:
    each `probe/<name>`'s mean over those of the records that logged it; None below, or without any."""
    recent = records[-steps:] if steps > 0 else []
    means = {}
    for key in dict.fromkeys(k for record in recent for k in record if k.startswith(PREFIX)):
        values = [v for v in (_number(record, key) for record in recent) if v is not None]
        if values:
            means[key[len(PREFIX):]] = sum(values) / len(values)
    if not means:
        return None
    name = max(means, key=lambda n: means[n])
    return (name, means[name]) if means[name] >= threshold else None
