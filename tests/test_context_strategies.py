"""Context strategies on the tiny model (engine/context.py): a rewrite of an episode's history splits it into
sequences that are exactly what the model saw and sampled; drop-tool-results keeps the last K results whole;
summarize's summary is a model turn of the sequence it was asked in; an episode that outgrows the window stops
with `context`; long results are cut with a marker; an environment's `compact` hook is honoured, and one that
raises fails its own episode only. Episodes read long tool results for 6 turns (`Library`)."""

from __future__ import annotations

import pytest

from aitrain_grpo.engine.backends.scripted import ScriptedBackend
from aitrain_grpo.engine.context import DROPPED, SUMMARY_FOLLOW_UP, SUMMARY_REQUEST, summarized
from aitrain_grpo.engine.stats import episode_stats
from helpers.context import Library, play
from helpers.rollouts import NEW_TOKENS, model_spans


class Compacting(Library):
    """Its own strategy: after turn 2, the task and one note; task 1's hook raises."""

    def compact(self, episode):
        if episode.row["task"] == 1:
            raise RuntimeError("the notes store is down")
        if episode.turns != 2:
            return None
        return [*episode.messages[:2], {"role": "user", "content": f"Notes so far: {episode.log.context_tokens} tokens read."}]


def sequences(batch, i):
    return [*batch.earlier[i], batch.traces[i]]


def assert_exact(batch, backend):
    """Each sequence's model tokens are one sample the backend drew for exactly the tokens before them, each
    sample trained once. Episodes with the same prompt draw from the same prefix in batches of other sizes,
    where greedy picks may differ on some CPUs: a span matches one of that prefix's samples, not all."""
    unused = {prefix: list(samples) for prefix, samples in backend.drawn.items()}
    for i in range(len(batch.episodes)):
        for trace in sequences(batch, i):
            spans = model_spans(trace)
            assert len(spans) == len(trace.turn_starts)
            for start, span in zip(trace.turn_starts, spans):
                candidates = unused[tuple(trace.prompt_ids + trace.completion_ids[:start])]
                match = next((k for k, sample in enumerate(candidates) if sample[:len(span)] == span), None)
                assert match is not None, "a trained turn is no sample drawn for the tokens before it"
                candidates.pop(match)


def prompt_messages_of(engine, episode, trace, messages):
    """How many of `messages` the trace's prompt is the chat template of (None: no prefix is)."""
    renderer = engine.renderer_for(episode)
    return next((j for j in range(1, len(messages) + 1) if renderer.prompt_ids(messages[:j]) == trace.prompt_ids), None)


@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_drop_tool_results_splits_episodes_into_exact_sequences_keeping_the_last_k(tiny_model_and_tokenizer, schedule):
    model, tokenizer = tiny_model_and_tokenizer
    batch, engine, backend = play(model, tokenizer, Library(), schedule, context="drop-tool-results",
                                  context_keep_last=1, context_threshold=260)
    assert all(len(batch.earlier[i]) >= 2 for i in range(len(batch.episodes))), [len(e) for e in batch.earlier]
    assert_exact(batch, backend)
    for i, episode in enumerate(batch.episodes):
        assert episode.turns == 6 and episode.stop_reason == "max_turns" and episode.error is None
        seen = [*episode.log.earlier_messages, episode.messages]
        for trace, messages in zip(sequences(batch, i)[1:], seen[1:]):
            j = prompt_messages_of(engine, episode, trace, messages)
            assert j is not None, "a new sequence's prompt is not the template of its messages"
            results = [m["content"] for m in messages[:j] if m["role"] == "tool"]
            assert results[-1] != DROPPED and all(r == DROPPED for r in results[:-1]), results
        # Each rewrite left out the dropped results: its prompt is shorter than the context it replaced.
        assert episode.log.rewrite_turns == [2, 3, 4, 5] and episode.log.tokens_saved > 4 * 100
    metrics = episode_stats(batch.episodes).env_metrics()
    assert metrics["env/sequences_mean"] >= 3 and metrics["env/context_tokens_saved_mean"] > 0


def test_keep_runs_out_of_the_window_and_stops_with_context(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    batch, _, _ = play(model, tokenizer, Library(), context_window=300)
    for i, episode in enumerate(batch.episodes):
        assert episode.stop_reason == "context" and episode.truncated and episode.error is None
        assert episode.score == episode.turns / 6 and 1 <= episode.turns < 6
        assert not batch.earlier[i] and len(batch.traces[i].prompt_ids) + len(batch.traces[i].completion_ids) < 300
    assert episode_stats(batch.episodes).env_metrics()["env/stop/context"] == 1.0


def test_a_turn_cut_off_by_the_window_ends_its_episode_with_context(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    # After its first reply task 0's sequence holds 190 tokens and task 1's (longer results) 231: in a
    # window of 236, task 1's second turn has room for 5 tokens of the 8 its lockstep call samples.
    batch, _, _ = play(model, tokenizer, Library(longer_by_task=10), context_window=236, cut_turn="end")
    for episode, trace in zip(batch.episodes, batch.traces):
        assert episode.stop_reason == "context" and episode.error is None and episode.score == episode.turns / 6
        assert len(trace.prompt_ids) + len(trace.completion_ids) <= 236
        if episode.row["task"] == 1:
            assert episode.turns == 2 and len(trace.completion_ids) - trace.turn_starts[-1] == 5


def test_summarize_trains_the_summary_as_a_turn_of_the_sequence_it_was_asked_in(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    batch, engine, backend = play(model, tokenizer, Library(), "continuous", context="summarize",
                                  context_threshold=200)
    assert_exact(batch, backend)
    for i, episode in enumerate(batch.episodes):
        assert episode.error is None and episode.turns == 6 and batch.earlier[i]
        for trace, seen, after in zip(batch.earlier[i], episode.log.earlier_messages, sequences(batch, i)[1:]):
            summary = seen[-1]
            assert summary["role"] == "assistant" and SUMMARY_REQUEST in seen[-2]["content"]
            last_span = model_spans(trace)[-1]
            assert trace.completion_ids[-len(last_span):] == last_span  # the sequence ends on the summary turn
            text = tokenizer.decode(last_span[:-1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            assert text == summary["content"]
            assert after.prompt_ids == engine.renderer_for(episode).prompt_ids(summarized(seen, text))
        assert episode.messages[2]["role"] == "assistant" and episode.messages[3]["content"] == SUMMARY_FOLLOW_UP
        # A summary turn carries the number of the episode turn after it; the turns it summarised keep theirs.
        numbers = [n for trace in sequences(batch, i) for n in trace.turn_numbers]
        assert numbers == sorted(numbers) and set(numbers) == set(range(6))


def test_a_summary_cut_off_by_its_token_limit_fails_that_episode(tiny_model_and_tokenizer):
    from aitrain_grpo.engine.backends.hf import HFBackend

    model, tokenizer = tiny_model_and_tokenizer
    # Plain sampling from the random tiny model seldom stops within 8 tokens: the summary is cut off.
    batch, _, _ = play(model, tokenizer, Library(), backend=HFBackend.for_model(model, tokenizer),
                       context="summarize", context_threshold=200, context_summary_tokens=NEW_TOKENS)
    failed = [ep for ep in batch.episodes if ep.error]
    assert failed and all(ep.stop_reason == "error" and ep.score == 0.0 for ep in failed)
    assert "summary turn was cut off by its token limit (summary_tokens); raise --rl-context-summary-tokens" in failed[0].error


def test_the_summary_turn_has_its_own_token_limit_above_a_short_turn_limit(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer

    summary = "Summary: " + " ".join(f"fact{k}" for k in range(12))

    def policy(episode):  # a short answer each turn; asked for a summary, a long one
        assert episode.log.summarizing == (SUMMARY_REQUEST in episode.messages[-1]["content"])
        return summary if episode.log.summarizing else "next"

    backend = ScriptedBackend(policy, tokenizer)
    batch, _, _ = play(None, tokenizer, Library(), backend=backend, context="summarize", context_threshold=200)
    summary_length = len(tokenizer(summary, add_special_tokens=False)["input_ids"]) + 1
    assert NEW_TOKENS < summary_length  # longer than --rl-max-new-tokens: only its own limit lets it through
    for i, episode in enumerate(batch.episodes):
        assert episode.error is None and episode.turns == 6 and batch.earlier[i], episode.error
        assert all(seen[-1]["content"] == summary for seen in episode.log.earlier_messages)
    # Its own limit, set below the summary's length, cuts it: that episode fails, saying which option to raise.
    batch, _, _ = play(None, tokenizer, Library(), backend=backend, context="summarize", context_threshold=200,
                       context_summary_tokens=summary_length - 1)
    assert all(ep.stop_reason == "error" and "--rl-context-summary-tokens" in ep.error for ep in batch.episodes)


def test_long_results_are_cut_head_and_tail_with_a_marker(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    batch, _, _ = play(model, tokenizer, Library(words=80), max_tool_result_tokens=40)
    for episode in batch.episodes:
        results = [m["content"] for m in episode.messages if m["role"] == "tool"]
        assert results and all("tokens cut ...]" in r for r in results)
        assert all(r.startswith("document") and r.endswith("-79") for r in results)
        assert all(len(tokenizer(r, add_special_tokens=False)["input_ids"]) < 80 for r in results)
        assert episode.log.tool_results_cut == len(results)
    assert episode_stats(batch.episodes).env_metrics()["env/tool_results_cut"] == sum(
        ep.log.tool_results_cut for ep in batch.episodes)


def test_an_environments_compact_hook_is_honoured_and_one_that_raises_fails_only_its_episode(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    batch, engine, backend = play(model, tokenizer, Compacting(), "continuous")
    assert engine.context.strategy == "compact"  # the hook chose it: no option given
    assert_exact(batch, backend)
    for i, episode in enumerate(batch.episodes):
        if episode.row["task"] == 1:
            assert episode.stop_reason == "error" and "Compacting.compact raised RuntimeError" in episode.error
            assert episode.turns == 1 and episode.score == 0.0
            continue
        assert episode.error is None and episode.turns == 6 and len(batch.earlier[i]) == 1
        assert episode.messages[2]["content"].startswith("Notes so far:")
        assert batch.traces[i].prompt_ids == engine.renderer_for(episode).prompt_ids(episode.messages[:3])
        assert episode.log.rewrite_turns == [2]


def test_the_episode_token_budget_spans_its_sequences(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    batch, _, _ = play(model, tokenizer, Library(), context="drop-tool-results", context_keep_last=0,
                       context_threshold=200, max_episode_tokens=3 * NEW_TOKENS)
    for i, episode in enumerate(batch.episodes):
        sampled = sum(sum(t.env_mask) for t in sequences(batch, i))
        assert sampled == episode.log.model_tokens <= 3 * NEW_TOKENS
        assert episode.stop_reason == "completion_budget" and episode.turns == 3
