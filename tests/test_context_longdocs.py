"""envs.longdocs, a long-horizon environment: ten long pages whose codes must be collected. Its whole history
does not fit a small context, so under `keep` its oracle, played at the token level, runs out of context;
under `drop-tool-results` the same oracle, which notes each code in its own turn, solves every task."""

from __future__ import annotations

import pytest

from aitrain_grpo import Episode
from aitrain_grpo.engine.backends.scripted import ScriptedBackend
from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.engine.context import DROPPED
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.runner import play
from aitrain_grpo.engine.settings import EpisodeSettings
from envs.longdocs import LongDocsEnv

WINDOW = 2560  # tokens of the tiny model's tokenizer, in which a page is about 750


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def played(env, tokenizer, strategy):
    settings = EpisodeSettings(max_new_tokens=128, max_completion_length=8192, context_window=WINDOW,
                               context=strategy, context_keep_last=1)
    with RolloutEngine(env, tokenizer, ScriptedBackend(env.solve, tokenizer), settings) as engine:
        return engine.run(env.build_dataset(tokenizer))


def test_the_oracle_solves_it_with_a_history_three_times_the_window(tokenizer):
    env = LongDocsEnv(num_tasks=4)
    episodes = play(env, env.build_dataset(tokenizer), env.solve)
    assert [ep.score for ep in episodes] == [1.0] * 4 and all(ep.turns == 11 for ep in episodes)
    renderer = ChatRenderer(tokenizer, tools=env.tools)
    assert all(len(renderer.prompt_ids(ep.messages)) > 3 * WINDOW for ep in episodes)


def test_keep_runs_out_of_context_where_drop_tool_results_solves_every_task(tokenizer):
    env = LongDocsEnv(num_tasks=4)
    kept = played(env, tokenizer, "keep")
    assert all(ep.score < 0.5 and not earlier for ep, earlier in zip(kept.episodes, kept.earlier))
    assert "context" in {ep.stop_reason for ep in kept.episodes}
    dropped = played(env, tokenizer, "drop-tool-results")
    for ep, trace, earlier in zip(dropped.episodes, dropped.traces, dropped.earlier):
        assert ep.score == 1.0 and ep.stop_reason == "env" and ep.error is None
        assert len(earlier) >= 5 and all(t.length < WINDOW for t in [*earlier, trace])
        results = [m["content"] for m in ep.messages if m["role"] == "tool"]
        assert results[:-1] == [DROPPED] * (len(results) - 1)  # every page but the last left out


def test_partial_answers_earn_partial_credit():
    env = LongDocsEnv(num_tasks=1, documents=4)
    row = env.build_dataset(None)[0]
    names = row["documents"].split(", ")
    answer = f"{names[0]} = {env.codes[names[0]]}\n{names[1]} = {env.codes[names[1]]}\n{names[2]} = 1"
    episode = Episode(row=row, messages=[{"role": "assistant", "content": answer}], state={"read": names[:3]})
    assert env.score_episode(episode) == 0.5 and episode.metrics == {"documents_read": 3, "codes_right": 2}
    # a turn cut by a budget after its notes, before its call: the notes are not an answer
    notes = "\n".join(f"NOTE {name} = {env.codes[name]}" for name in names)
    cut = Episode(row=row, messages=[{"role": "assistant", "content": notes + '\n<tool_call>{"name": "read'}],
                  state={"read": names})
    assert env.score_episode(cut) == 0.0
    final = Episode(row=row, messages=[{"role": "assistant", "content": f"NOTE {names[3]} = 1\n{answer}"}],
                    state={"read": names})
    assert env.score_episode(final) == 0.5  # the oracle's last turn: a note, then the answer lines
    with pytest.raises(ValueError, match="documents must be an integer from 1 to 26"):
        LongDocsEnv(documents=30)
