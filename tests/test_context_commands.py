"""Context strategies where users meet them: the options refused in one line, `aitrain env check` saying
where episodes were cut into sequences, `aitrain eval` counting every sequence's tokens, and transcripts
(episodes.jsonl, report.html) showing each sequence and where the history was rewritten."""

from __future__ import annotations

import json
import re

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.engine.context import resolve_strategy
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.evaluation.envcheck import check_environment
from aitrain_grpo.evaluation.evaluate import evaluate
from aitrain_grpo.runlog.records import episode_record
from aitrain_grpo.runlog.report import write_report
from helpers.browser import rendered_dom
from helpers.cli import refused
from helpers.context import Library, Recording
from helpers.rollouts import GREEDY, NEW_TOKENS

DROPPING = dict(context="drop-tool-results", context_keep_last=1, context_threshold=260)


class Pinned(Library):
    context_strategy = "summarise"  # a typo


def test_a_strategy_that_is_not_one_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="--rl-context 'summarise' is not one of keep, drop-tool-results, summarize, compact"):
        RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", rl_context="summarise").validate()
    with pytest.raises(ConfigError, match="Pinned.context_strategy 'summarise' is not one of"):
        resolve_strategy(Pinned(), None)
    with pytest.raises(ConfigError, match=r"--rl-context compact needs Library.compact\(self, episode\)"):
        resolve_strategy(Library(), "compact")
    assert resolve_strategy(Pinned(), "keep") == "keep"  # the option wins over the environment's choice
    assert resolve_strategy(Library(), None) == "keep"


def test_eval_refuses_a_bad_context_option_before_loading(tmp_path):
    refused(["eval", "--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
             "--rl-max-tool-result-tokens", "4"], tmp_path, "--rl-max-tool-result-tokens must be")


def test_env_check_says_where_the_models_episodes_were_cut_into_sequences(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    report = check_environment(Library(), tokenizer, model=model, episodes=4, policies=("model",),
                               settings=EpisodeSettings(max_new_tokens=NEW_TOKENS, max_completion_length=4096,
                                                        max_tool_result_tokens=100, **DROPPING))
    note = next(n for n in report.notes if "cut into sequences" in n)
    assert re.match(r"4 of 4 model episodes were cut into sequences by the context strategy: episode 0 after "
                    r"turn\(s\) 2, 3, 4, 5 \(\d+ tokens left out\)", note), note
    assert "20 tool results were cut to --rl-max-tool-result-tokens" in report.notes  # 5 replies in each


def test_eval_counts_the_tokens_of_every_sequence(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = Library()
    result = evaluate(env, Recording.for_model(model, tokenizer), tokenizer, env.build_dataset(tokenizer), label="tiny",
                      settings=EpisodeSettings(max_new_tokens=NEW_TOKENS, sampling=GREEDY, **DROPPING))
    assert result.generated_tokens == sum(ep.log.model_tokens for ep in result.episodes) == 4 * 6 * NEW_TOKENS
    assert all(record["rewrites"] == 4 for record in result.records())


def test_transcripts_show_each_sequence_and_the_summary(tiny_model_and_tokenizer, tmp_path):
    model, tokenizer = tiny_model_and_tokenizer
    env = Library()
    settings = EpisodeSettings(max_new_tokens=NEW_TOKENS, sampling=GREEDY, context="summarize", context_threshold=200)
    with RolloutEngine(env, tokenizer, Recording.for_model(model, tokenizer), settings) as engine:
        batch = engine.run(env.build_dataset(tokenizer))
    records = [episode_record(ep, step=1, index=i, group=0) for i, ep in enumerate(batch.episodes)]
    first = records[0]
    assert first["rewrites"] == len(first["rewrite_turns"]) == len(first["earlier_messages"]) >= 1
    assert first["earlier_messages"][0][-1]["summary"] is True and first["messages"][2]["role"] == "assistant"
    run = tmp_path / "run"
    run.mkdir()
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5, "env/sequences_mean": 2.0}) + "\n")
    (run / "run_config.json").write_text(json.dumps({"rl_env_class": "Library", "model": "tiny"}))
    write_report(run)
    dom = rendered_dom(run / "report.html", tmp_path)
    rewrites = sum(r["rewrites"] for r in records)
    assert len(re.findall(r'class="ep-rewrite">context rewritten after turn \d', dom)) == rewrites
    assert dom.count("assistant · summary of the episode so far (trained as a turn)") == rewrites


def test_sequences_per_episode_count_an_agents_own_rewrites_too(tiny_model_and_tokenizer):
    pytest.importorskip("openai")
    from aitrain_grpo.engine.backends.hf import HFBackend
    from aitrain_grpo.engine.stats import episode_stats
    from envs_fixtures.agents import SummarisingAgent  # its agent rewrites its history once: two sequences

    model, tokenizer = tiny_model_and_tokenizer
    env = SummarisingAgent()
    settings = EpisodeSettings(max_new_tokens=12, max_completion_length=256, model_name="tiny")
    with RolloutEngine(env, tokenizer, HFBackend.for_model(model, tokenizer), settings) as engine:
        batch = engine.run(env.build_dataset(tokenizer))
    assert all(len(earlier) == 1 for earlier in batch.earlier)
    metrics = episode_stats(batch.summaries()).env_metrics()
    assert metrics["env/sequences_mean"] == 2.0 and metrics["env/context_rewrites_mean"] == 0.0
    assert [episode_record(ep)["sequences"] for ep in batch.episodes] == [2] * 4
