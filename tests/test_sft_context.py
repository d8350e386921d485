"""`aitrain sft` under a context strategy: the oracle is played by the token-level engine, so each
demonstration is the sequences GRPO will play, stubs and summaries included, token for token; a
strategy's episodes that the oracle cannot finish are not taught, and an oracle that raises ends its
episode, not the run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.context import DROPPED, SUMMARY_REQUEST
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.errors import UserError
from aitrain_grpo.sft.oracle import keep_good, play_sequences, plays_tokens
from envs.longdocs import LongDocsEnv
from helpers import run_cli
from helpers.rollouts import OracleBackend

LONGDOCS = ["--rl-env-module", "envs.longdocs", "--rl-env-class", "LongDocsEnv",
            "--rl-env-config", '{"num_tasks": 4, "documents": 4, "page_words": 60}']
# The tiny tokenizer makes a 60-word page about 170 tokens: four pages and the task pass this window.
DROP = dict(rl_context="drop-tool-results", rl_context_keep_last=1, rl_context_window=1000,
            rl_max_completion_length=800)
SUMMARIZE = dict(rl_context="summarize", rl_context_window=1000, rl_context_threshold=500,
                 rl_max_completion_length=700)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from aitrain_grpo.models.loading import load_tokenizer, resolve_source

    return load_tokenizer(resolve_source(tiny_model_dir))


def config(**options) -> RunConfig:
    return RunConfig(rl_env_module="envs.longdocs", rl_env_class="LongDocsEnv", **options)


@pytest.mark.parametrize("options", [DROP, SUMMARIZE], ids=["drop-tool-results", "summarize"])
def test_demonstrations_are_the_sequences_grpo_plays(tokenizer, options):
    """The SFT rows are exactly the engine's sequences under the strategy: a backend that answers only the
    prompts the SFT rows hold plays every episode to the end (a prompt a rewrite made that sft never
    showed would be unknown to it), and each of its sequences is the SFT row, tokens and loss mask."""
    from aitrain_grpo.sft.trainer import demo_dataset

    env = LongDocsEnv(num_tasks=3, documents=4, page_words=60)
    settings = EpisodeSettings.from_options(config(**options))
    rows = env.build_dataset(tokenizer)
    demos, errors = play_sequences(env, tokenizer, rows, 3, settings)
    assert not errors and [d.score for d in demos] == [1.0] * 3
    assert all(len(d.sequences) >= 3 and len(d.earlier_messages) == len(d.sequences) - 1 for d in demos)
    lockstep, _ = play_sequences(env, tokenizer, rows, 3, replace(settings, schedule="lockstep"))
    assert [d.sequences for d in lockstep] == [d.sequences for d in demos]  # either schedule plays it the same
    dataset = demo_dataset(tokenizer, demos)
    assert len(dataset) == sum(len(d.sequences) for d in demos)
    with RolloutEngine(env, tokenizer, OracleBackend(dataset, tokenizer.eos_token_id), settings) as engine:
        batch = engine.run([dict(rows[d.row]) for d in demos])
    replayed = [t for earlier, last in zip(batch.earlier, batch.traces) for t in [*earlier, last]]
    assert [ep.score for ep in batch.episodes] == [1.0] * 3
    assert [t.prompt_ids + t.completion_ids for t in replayed] == dataset["input_ids"]
    assert [[0] * len(t.prompt_ids) + t.env_mask for t in replayed] == dataset["assistant_masks"]
    later = tokenizer.decode(demos[0].sequences[-1].input_ids)
    if options is DROP:  # the answer was taught with the older pages as stubs, as GRPO will show them
        assert DROPPED in later and all(DROPPED not in tokenizer.decode(s.input_ids[:s.prompt_length])
                                        for s in demos[0].sequences[:1])
    else:  # the summary turn is a model turn of the sequence it was asked in, and the next one goes on from it
        first = demos[0].sequences[0]
        asked = tokenizer.decode([t for t, m in zip(first.input_ids, first.assistant_masks) if m][-40:])
        assert SUMMARY_REQUEST in tokenizer.decode(first.input_ids) and "NOTE" in asked
        assert "NOTE" in tokenizer.decode(demos[0].sequences[1].input_ids[:demos[0].sequences[1].prompt_length])


def test_keep_plays_at_text_level_and_a_strategy_or_a_result_limit_at_token_level():
    env = LongDocsEnv(num_tasks=2)
    assert not plays_tokens(env, config())
    assert not plays_tokens(env, config(rl_context="keep"))
    assert plays_tokens(env, config(rl_context="drop-tool-results"))
    assert plays_tokens(env, config(rl_max_tool_result_tokens=64))
    assert plays_tokens(env, config(rl_context_window=1000)) and plays_tokens(env, config(rl_max_episode_tokens=500))


def test_under_keep_a_window_cuts_the_oracles_episodes_as_grpo_would_and_sft_keeps_none_of_them(tokenizer):
    # Four 170-token pages and the task pass a 1000-token window: GRPO's engine cuts every episode there,
    # so no demonstration of the whole conversation may be kept (at text level every one scored 1.0).
    env = LongDocsEnv(num_tasks=2, documents=4, page_words=60)
    options = config(rl_context="keep", rl_context_window=1000, rl_max_completion_length=800)
    assert plays_tokens(env, options)
    demos, errors = play_sequences(env, tokenizer, env.build_dataset(tokenizer), 2, EpisodeSettings.from_options(options))
    assert not errors and all(d.score < 1.0 for d in demos)
    with pytest.raises(UserError, match="scored at least --min-score"):
        keep_good(demos, errors, 1.0, "LongDocsEnv")


class FailingOracle(LongDocsEnv):
    """Its oracle raises on the second turn of the second task."""

    def solve(self, episode):
        if episode.row["task_id"] == 1 and episode.turns == 1:
            raise RuntimeError("the oracle lost its notes")
        return super().solve(episode)


def test_an_oracle_that_raises_ends_its_episode_not_the_run(tokenizer):
    env = FailingOracle(num_tasks=3, documents=4, page_words=60)
    demos, errors = play_sequences(env, tokenizer, env.build_dataset(tokenizer), 3,
                                   EpisodeSettings.from_options(config(**DROP)))
    assert [d.score for d in demos] == [1.0, 0.0, 1.0]
    assert len(errors) == 1 and "RuntimeError: the oracle lost its notes" in errors[0]
    assert [d.row for d in keep_good(demos, errors, 1.0, "FailingOracle")] == [0, 2]


def test_sft_cli_writes_each_sequence_and_says_how_many(tmp_path, tiny_model_dir):
    out = tmp_path / "longdocs-sft"
    strategy = ["--rl-context", "drop-tool-results", "--rl-context-keep-last", "1", "--rl-context-window", "1000",
                "--rl-max-completion-length", "800"]
    result = run_cli("sft", *LONGDOCS, *strategy, "--episodes", "4", "--max-steps", "1", "--batch-size", "4",
                     "--output-dir", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sequences as the context strategy cut them" in result.stdout
    grpo = next(line for line in result.stdout.splitlines() if line.startswith("next: aitrain grpo"))
    pairs = [" ".join(strategy[k:k + 2]) for k in range(0, len(strategy), 2)]
    assert all(pair in grpo for pair in pairs), grpo  # the grpo run it suggests plays under the same strategy
    demos = [json.loads(line) for line in (out / "demos.jsonl").read_text().splitlines()]
    assert demos and all(d["sequences"] >= 3 and len(d["earlier_messages"]) == d["sequences"] - 1 for d in demos)
    assert all(DROPPED in json.dumps(d["messages"]) for d in demos)
    assert json.loads((out / "run_config.json").read_text())["rl_context"] == "drop-tool-results"
