"""How alike a run's best replies and the shortcut probes' are (runlog/probe_resemblance.py, measured each step by
training/rollout/probe_watch.py): the probe's own reply, cut as the engine cuts a turn, resembles it; the task
learned, or unrelated text, does not. The warning that names the probe is tested in test_shortcuts.py."""

from __future__ import annotations

import pytest

from aitrain_grpo.env.base import Episode
from aitrain_grpo.evaluation.probes import replies_at_turns
from aitrain_grpo.runlog.probe_resemblance import (RESEMBLES, best_of_groups, episode_resemblance, resembled_probe,
                                                   similarity)
from aitrain_grpo.training.rollout.probe_watch import ProbeWatch
from envs.letters import LetterEnv

FILL = " a" * 16  # the quick start's shortcut: its 16-token turn filled with " a" and cut


class CharTokenizer:
    """One token a character: a turn limit of 32 tokens keeps 32 characters."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def episode(replies: list[str], task: int = 0) -> Episode:
    messages = [{"role": "user", "content": f"Task {task}: write something with many as."}]
    for reply in replies:
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Again, with more as."}]
    return Episode(row={"task": task}, messages=messages[:-1] if replies else messages, turns=len(replies))


def test_similarity_is_one_for_the_same_text_and_counts_length():
    assert similarity(FILL, FILL.upper() + "  ") == 1.0
    assert similarity("", "") == 1.0 and similarity("abc", "") == 0.0
    assert similarity(" a" * 12, FILL) == pytest.approx(0.84, abs=0.01)  # cut a little earlier: still the probe
    # The task learned (three short finished turns) shares a few of the fill's trigrams, not their count.
    assert similarity("A a a a.", FILL) < 0.3 and similarity(" a.", FILL) == 0.0
    assert similarity("Task 3: write something with many as.", FILL) == 0.0
    assert similarity("<answer>42</answer>", "<answer></answer>") == pytest.approx(0.81, abs=0.01)  # left out: see doc


def test_an_episode_is_compared_on_the_turns_its_probe_wrote_something():
    assert episode_resemblance([FILL, "x"], [FILL, ""]) == 1.0
    assert episode_resemblance([FILL], [""]) is None
    assert best_of_groups([0.1, 0.5, 0.5, 0.2, 0.0, 0.0, 0.0, 0.9], 4) == [1, 7]
    assert best_of_groups([0.1, 0.5, 0.2], 2) == [0, 1, 2]  # not whole groups: every episode


def test_the_probe_named_is_the_recent_steps_most_alike_from_the_threshold_up():
    records = [{"step": s, "probe/echo": 0.1, "probe/fill-the-turn": 0.2 if s < 8 else 0.9} for s in range(1, 11)]
    assert resembled_probe(records, 3) == ("fill-the-turn", pytest.approx(0.9))
    assert resembled_probe(records[:8], 5) is None  # 0.34 over steps 4-8
    assert resembled_probe([{"step": 1, "reward": 0.5}], 5) is None
    assert RESEMBLES > 0.45  # above what the learning quick-start runs reach (benchmarks/SHORTCUTS.md)


def test_probes_are_asked_with_the_episode_as_it_stood_before_each_turn():
    env = LetterEnv()
    played = episode(["first", "second"])
    asked = replies_at_turns({"echo": lambda ep: ep.messages[-1]["content"] + f"@{ep.turns}",
                              "broken": lambda ep: 1 / 0}, played, 2)
    assert asked["echo"] == ["Task 0: write something with many as.@0", "Again, with more as.@1"]
    assert asked["broken"] == ["", ""]  # a probe that raises is skipped, the run goes on
    assert played.turns == 2 and len(played.messages) == 4  # the episode itself is untouched
    assert env.probes()["fill-the-turn"](played).startswith(" a a")


def test_the_step_metric_is_high_when_the_best_replies_are_the_probes_and_low_when_not():
    watch = ProbeWatch(LetterEnv(), "auto", max_new_tokens=32)
    shortcut = [episode([FILL], task=i) for i in range(4)]
    learned = [episode(["A a a.", "A a a a.", "A a."], task=i) for i in range(4)]
    metrics = watch.metrics(shortcut + learned, [0.5, 0.1, 0.1, 0.1, 1.0, 0.2, 0.2, 0.2], 4, [{"task": 0}],
                            CharTokenizer())
    assert set(metrics) == {"probe/echo", "probe/repeat", "probe/fill-the-turn"}  # generic, then envs.letters' own
    per_group = [watch.metrics(group, [1.0, 0, 0, 0], 4, [], CharTokenizer()) for group in (shortcut, learned)]
    assert per_group[0]["probe/fill-the-turn"] == 1.0  # the probe's " a" * 4096, cut at 32 characters
    assert per_group[1]["probe/fill-the-turn"] < 0.3 and per_group[1]["probe/echo"] < 0.1
    assert max(per_group[0]["probe/echo"], per_group[0]["probe/repeat"]) < RESEMBLES
