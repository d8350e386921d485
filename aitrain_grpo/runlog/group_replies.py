"""One identical reply taking over a group: how alike the episodes of each GRPO group are, per step.

A group is the `--rl-num-generations` episodes of one prompt, consecutive in the batch. When the policy
has found one reply the score pays for, it samples that reply again and again: the group's episodes
become token for token the same, their scores equal, and the group teaches nothing more (GRPO's
advantage is 0) while the mean score still looks high. Two numbers per step, from the model's own
tokens of each episode (the environment's replies left out, so two episodes that wrote the same thing
count as the same even where a tool answered differently):

- `env/group_same_reply`: per group, the share of its other episodes that wrote the same as its most
  common reply, (largest count - 1) / (group size - 1), averaged over groups: 0 when every episode of
  every group differs, 1 when each group wrote one reply G times;
- `env/group_one_reply_frac`: the share of groups whose episodes all wrote the same.

A reply with full marks (score 1.0) counts as no takeover: a model that has solved a task with one right
answer writes it every time (the quick start's "A a a a." from issue 35 on), and that is success, not a
shortcut. The shortcut warning (shortcuts.py) watches the first. Left out: near-identical replies (one
token apart count as different) and groups split across processes (each process measures its own part; a
batch that does not split into whole groups is not measured).
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence

SAME_REPLY = "env/group_same_reply"
ONE_REPLY = "env/group_one_reply_frac"
SOLVED = 1.0  # a reply with full marks: its taking over a group is the task solved


def model_replies(traces: Sequence) -> list[tuple[int, ...]]:
    """Each episode's model tokens (a TokenTrace's `completion_ids` where `env_mask` is 1), in order."""
    return [tuple(i for i, m in zip(t.completion_ids, t.env_mask) if m) for t in traces]


def group_reply_metrics(replies: Sequence[Hashable], group_size: int,
                        scores: Sequence[float] | None = None) -> dict[str, float]:
    """`env/group_same_reply` and `env/group_one_reply_frac` of consecutive groups of `group_size`
    replies, a most common reply that scored SOLVED counting as none (`scores` in the same order); {} for
    groups of one or a batch that does not split into whole groups."""
    if group_size < 2 or not replies or len(replies) % group_size:
        return {}
    same, one = [], 0
    for g in range(0, len(replies), group_size):
        reply, largest = Counter(replies[g:g + group_size]).most_common(1)[0]
        if scores is not None and scores[g + replies[g:g + group_size].index(reply)] >= SOLVED:
            largest = 1
        same.append((largest - 1) / (group_size - 1))
        one += largest == group_size
    groups = len(same)
    return {SAME_REPLY: sum(same) / groups, ONE_REPLY: one / groups}
