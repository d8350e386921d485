"""Context strategies in a mixture (env/adapters/mixture.py, engine/context.py `resolve_strategies`): each
episode keeps its history by its own environment's strategy or `compact` hook, `--rl-context` over all, so a
long-horizon environment beside a short one gets its rewrites and the short one is left whole."""

from __future__ import annotations

import pytest

from aitrain_grpo.env.adapters.mixture import MixtureEnv
from aitrain_grpo.errors import ConfigError
from helpers.context import Library, play


class Noting(Library):
    """A long-horizon environment with its own hook: after turn 2, the task and one note."""

    def compact(self, episode):
        if episode.turns != 2:
            return None
        return [*episode.messages[:2], {"role": "user", "content": "Notes so far: three documents read."}]


class Dropping(Library):
    context_strategy = "drop-tool-results"


class Short(Library):
    """Two turns, short replies: nothing to rewrite."""

    max_turns = 2


def mixed(*classes):
    return MixtureEnv([{"spec": f"test_context_mixture:{cls.__name__}"} for cls in classes])


def test_each_episode_of_a_mixture_keeps_its_history_by_its_own_environments_strategy(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    batch, engine, _ = play(model, tokenizer, mixed(Noting, Dropping, Short), "continuous",
                            context_keep_last=1, context_threshold=260)
    played = {}
    for i, episode in enumerate(batch.episodes):
        name = episode.row["aitrain_env"]
        played[name] = played.get(name, 0) + 1
        assert episode.error is None, episode.error
        if name == "Noting":
            assert episode.log.rewrite_turns == [2] and episode.messages[2]["content"].startswith("Notes so far")
        elif name == "Dropping":
            assert episode.log.rewrite_turns == [2, 3, 4, 5] and len(batch.earlier[i]) == 4
        else:
            assert episode.turns == 2 and not episode.log.rewrite_turns and not batch.earlier[i]
    assert set(played) == {"Noting", "Dropping", "Short"}
    assert engine.context.strategies == {"Noting": "compact", "Dropping": "drop-tool-results", "Short": "keep"}


def test_the_option_wins_over_every_member_and_compact_needs_each_members_hook(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    batch, engine, _ = play(model, tokenizer, mixed(Noting, Dropping), context="keep")
    assert engine.context.strategy == "keep"
    assert all(not ep.log.rewrite_turns for ep in batch.episodes)
    with pytest.raises(ConfigError, match=r"--rl-context compact needs Dropping.compact\(self, episode\)"):
        play(model, tokenizer, mixed(Noting, Dropping), context="compact")
