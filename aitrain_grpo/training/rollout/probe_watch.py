"""Each step's `probe/<name>` metrics: how alike the run's best replies and the shortcut probes' are.

The shortcut warning names the probe a run's replies resemble (runlog/probe_resemblance.py holds the
comparison and its threshold, shortcuts.py the naming). This is its training side: the probes env check
plays (evaluation/probes.py: generic, and the environment's `probes()`), built once from the first step's
rows, are asked for their reply at each model turn of the best-scoring episode of each group, up to
MAX_TURNS; each reply is cut to the turn's token limit (--rl-max-new-tokens) as the engine cuts a turn, so
"one word repeated past the limit" is compared as played. An environment whose `probes()` is broken gets
the generic probes (env check reports the broken contract; a run is no place to stop for it).

Cost: on the two-core CPU, 0.17 s a step for 256 episodes in groups of 8 (32 best episodes, 4 turns of
120 words, the three probes of envs.letters); a quick-start step compares 2 episodes.

Left out: the episode's state as it was before each turn: a probe that reads `episode.state` (an oracle's
`solve` behind the `format` probe) sees it as the episode ended, since state cannot be rewound, so its
earlier turns are compared with the hollowed last move; the completion budget's cut of a turn late in an
episode (only the turn limit is applied); and episodes other than each group's best (what the advantage
pushes towards is what a shortcut looks like).
"""

from __future__ import annotations

from typing import Any, Sequence

from aitrain_grpo.env.base import Episode
from aitrain_grpo.evaluation.probes import Policy, ProbeError, all_probes, generic_probes, replies_at_turns
from aitrain_grpo.runlog.probe_resemblance import (MAX_TURNS, best_of_groups, episode_resemblance, model_turns,
                                                   resemblance_metrics)

CHARS_PER_TOKEN = 32  # a probe's text is cut to this many characters a token before tokenizing (4096 repeats are long)


class ProbeWatch:
    """The probes of `env`, asked each step; `metrics` gives the step's `probe/<name>` values."""

    def __init__(self, env: Any, tool_parser: str, max_new_tokens: int):
        self.env, self.tool_parser, self.max_new_tokens = env, tool_parser, max_new_tokens
        self.probes: dict[str, Policy] | None = None
        self._cut: dict[str, str] = {}

    def _probes(self, rows: list[dict[str, Any]]) -> dict[str, Policy]:
        if self.probes is None:
            try:
                self.probes = all_probes(self.env, self.tool_parser, rows)
            except ProbeError:
                self.probes = generic_probes(self.env, self.tool_parser, rows)
        return self.probes

    def cut(self, text: str, tokenizer) -> str:
        """`text` cut to the turn's token limit, as the engine cuts a turn (memoised: most probes repeat)."""
        if text not in self._cut:
            if len(self._cut) > 4096:
                self._cut.clear()
            ids = tokenizer(text[:self.max_new_tokens * CHARS_PER_TOKEN], add_special_tokens=False)["input_ids"]
            self._cut[text] = text if len(ids) <= self.max_new_tokens else tokenizer.decode(ids[:self.max_new_tokens])
        return self._cut[text]

    def metrics(self, episodes: Sequence[Episode], scores: Sequence[float], group_size: int,
                rows: list[dict[str, Any]], tokenizer) -> dict[str, float]:
        probes = self._probes(rows)
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's own tokenizer
        found = []
        for index in best_of_groups(scores, group_size):
            replies = model_turns(episodes[index].messages)[:MAX_TURNS]
            asked = replies_at_turns(probes, episodes[index], len(replies))
            found.append({name: episode_resemblance(replies, [self.cut(t, tokenizer) for t in texts])
                          for name, texts in asked.items()})
        return resemblance_metrics(found)
