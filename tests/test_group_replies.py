"""`env/group_same_reply` and `env/group_one_reply_frac`: how far one identical reply has taken over the GRPO
groups of a step, logged with the step's metrics (the shortcut warning watches the first)."""

from __future__ import annotations

import json

from helpers.letters import letters_config
from aitrain_grpo.runlog.group_replies import group_reply_metrics
from envs.letters import LetterEnv


def test_the_share_counts_the_most_common_reply_of_each_group():
    # group 1: all four the same; group 2: two of four the same; group 3: all different
    replies = ["a", "a", "a", "a", "b", "c", "b", "d", "e", "f", "g", "h"]
    got = group_reply_metrics(replies, 4)
    assert got["env/group_same_reply"] == (1.0 + 1 / 3 + 0.0) / 3
    assert got["env/group_one_reply_frac"] == 1 / 3
    assert group_reply_metrics(list("abcdefgh"), 4) == {"env/group_same_reply": 0.0, "env/group_one_reply_frac": 0.0}


def test_nothing_is_measured_without_whole_groups():
    assert group_reply_metrics(["a"] * 6, 4) == {}
    assert group_reply_metrics(["a"] * 4, 1) == {}
    assert group_reply_metrics([], 4) == {}


def steps(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_training_logs_it_and_greedy_groups_write_one_reply(tmp_path):
    """Sampled (almost) greedily, the four episodes of a prompt write the same tokens: every group is one reply. Sampled
    at temperature 1, the tiny model's random text differs within a group."""
    from aitrain_grpo.training.trainer import train

    greedy, sampled = tmp_path / "greedy", tmp_path / "sampled"
    train(letters_config(greedy, max_steps=1, save_steps=None, rl_temperature=1e-3), env=LetterEnv(turns=1))
    train(letters_config(sampled, max_steps=1, save_steps=None, rl_temperature=1.0), env=LetterEnv(turns=1))
    for record in steps(greedy):
        assert record["env/group_same_reply"] == 1.0 and record["env/group_one_reply_frac"] == 1.0
    for record in steps(sampled):
        assert record["env/group_same_reply"] < 0.5 and record["env/group_one_reply_frac"] == 0.0


def test_a_reply_with_full_marks_taking_over_is_the_task_solved():
    # The quick start's model that learned "A a a a." writes it in every episode: success, not a shortcut.
    replies, scores = ["A a a a."] * 4 + [" a a a"] * 4, [1.0] * 4 + [0.5] * 4
    assert group_reply_metrics(replies, 4, scores) == {"env/group_same_reply": 0.5, "env/group_one_reply_frac": 0.5}
