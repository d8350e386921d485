"""Environments written for AITraining run unchanged: recognised by their `score_episode` signature, played as
one-turn episodes, scored through `score_episode(model=, tokenizer=, completion=, case_idx=)` with the live
policy model in eval mode under no_grad, their `get_tools()` schemas rendered into the prompt and the tool
calls parsed but never run, and their errors treated like ours.

The fixture classes (tests/envs_fixtures/aitraining_style.py) import nothing from aitrain_grpo and log what
they were called with to a JSON-lines file, so a test sees what a training subprocess handed them.
One 2-step training run of the tiny model (about 30 s); the rest run in-process in seconds."""

from __future__ import annotations

import json

import pytest

from aitrain_grpo.engine.runner import play
from aitrain_grpo.env.adapters.aitraining import AITrainingEnvironment
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.errors import ConfigError, EnvLoadError
from helpers import REPO, in_process_cli, run_cli

MODULE = "envs_fixtures.aitraining_style"
TOOL_CALL = '<tool_call>{"name": "lookup_order", "arguments": {"order_id": "A17"}}</tool_call>'


def calls(path) -> list[dict]:
    """What the fixture environment was called with (nothing when it never scored successfully)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def aitrain(monkeypatch):
    """`aitrain ARGS` in-process from tests/, where the fixture environments resolve."""
    return in_process_cli(monkeypatch, REPO / "tests")


def test_an_aitraining_environment_trains_through_the_cli_scored_with_the_live_policy(tiny_model_dir, tmp_path):
    log, out = tmp_path / "calls.jsonl", tmp_path / "run"
    config = json.dumps({"log_path": str(log), "fail_case": 13})  # case 13's scorer raises
    result = run_cli("grpo", "--model", tiny_model_dir, "--rl-env-module", MODULE, "--rl-env-class", "GreetingEnv",
                     "--rl-env-config", config, "--output-dir", str(out), "--max-steps", "2",
                     "--rl-max-new-tokens", "16", cwd=REPO / "tests")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "environment GreetingEnv: AITraining interface" in result.stdout
    assert "step 2/2" in result.stdout
    # The raising scorer: its episodes score 0, the error is named, and the run goes on.
    output = result.stdout + result.stderr
    assert "GreetingEnv.score_episode raised ValueError: no reference answer for case 13" in output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert sum(r["env/errors"] for r in records) == 4  # one group of 4 episodes; 2 steps cover the 4 rows
    seen = calls(log)
    assert len(seen) == 2 * 8 - 4
    # Every call got the policy being trained (the LoRA-wrapped model), in eval mode, without gradients,
    # a chat prompt's completion as one assistant message, and case_idx from the column.
    assert {c["model"] for c in seen} == {"PeftModelForCausalLM"}
    assert not any(c["training"] or c["grad"] or c["logits_grad"] for c in seen)
    assert all(isinstance(c["completion"], list) and len(c["completion"]) == 1
               and c["completion"][0]["role"] == "assistant" for c in seen)
    assert {c["case_idx"] for c in seen} == {10, 11, 12}
    # Its scores are what training learned from: the logged rewards add up to the scores it returned.
    assert sum(r["reward"] * 8 for r in records) == pytest.approx(sum(c["score"] for c in seen), abs=1e-4)


def test_completion_and_case_idx_are_what_aitraining_passes(tiny_model_and_tokenizer, tmp_path):
    model, tokenizer = tiny_model_and_tokenizer
    log = tmp_path / "plain.jsonl"
    # String prompts, no case_idx column: the completion is the text, case_idx the row's index.
    env = load_environment(MODULE, "PlainPromptEnv", {"log_path": str(log)})
    episodes = play(env, build_rows(env, tokenizer), lambda episode: "1, 2, 3")
    assert [c["completion"] for c in calls(log)] == ["1, 2, 3"] * 3
    assert sorted(c["case_idx"] for c in calls(log)) == [0, 1, 2]
    assert [ep.score for ep in episodes] == [1.0, 1.0, 1.0] and all(ep.turns == 1 for ep in episodes)

    # Chat prompts with a case_idx column; the model is in training mode before and after scoring.
    log = tmp_path / "chat.jsonl"
    env = load_environment(MODULE, "GreetingEnv", {"log_path": str(log), "fail_case": 11})
    model.train()
    env.use_policy(model, tokenizer)
    episodes = play(env, build_rows(env, tokenizer), lambda episode: "Hello there, friend!")
    assert model.training
    by_case = {c["case_idx"]: c for c in calls(log)}
    assert sorted(by_case) == [10, 12, 13]
    assert by_case[10]["completion"] == [{"role": "assistant", "content": "Hello there, friend!"}]
    assert not any(c["training"] or c["grad"] for c in by_case.values())
    failed = [ep for ep in episodes if ep.row["case_idx"] == 11]
    assert failed[0].score == 0.0
    assert failed[0].error == "GreetingEnv.score_episode raised ValueError: no reference answer for case 11"


def test_tools_reach_the_prompt_and_tool_calls_are_parsed_but_never_run(aitrain, tmp_path):
    result = aitrain("env", "check", "--rl-env-module", MODULE, "--rl-env-class", "OrderToolsEnv",
                     "--model", "tiny", "--episodes", "2", "--policies", "empty")
    assert result.exit_code == 0, result.output
    assert "interface: AITraining interface" in result.output
    # Both schemas (OpenAI-style and bare) in the prompt the model sees, in the template's tool format.
    prompt = result.output.split("as the model sees it", 1)[1]
    assert '{"type": "function", "function": {"name": "lookup_order"' in prompt
    assert '{"type": "function", "function": {"name": "cancel_order"' in prompt
    assert "lookup_order(order_id)" in result.output and "cancel_order(order_id?)" in result.output
    assert "score_episode was given tiny as its model" in result.output

    log = tmp_path / "tools.jsonl"
    env = load_environment(MODULE, "OrderToolsEnv", {"log_path": str(log)})
    (episode,) = play(env, build_rows(env, None)[:1], lambda episode: f"Let me look. {TOOL_CALL}")
    assert episode.tool_calls == [{"name": "lookup_order", "arguments": {"order_id": "A17"}}]
    assert episode.num_tool_calls == 1
    # lookup_order raises if called: the episode would carry its error.
    assert episode.error is None and episode.score == 1.0 and episode.turns == 1


def test_the_interface_is_read_from_the_signature(aitrain):
    assert isinstance(load_environment(MODULE, "DefaultsEnv"), AITrainingEnvironment)
    env = load_environment(MODULE, "AsyncScoreEnv")  # async def score_episode: awaited, still under no_grad
    assert [ep.score for ep in play(env, build_rows(env, None), lambda episode: "y")] == [0.25]
    duck = load_environment("envs_fixtures.duck", "DuckEnv")  # score_episode(self, episode): ours, as it is
    assert not isinstance(duck, AITrainingEnvironment)
    with pytest.raises(EnvLoadError) as bad:
        load_environment(MODULE, "TwoArgumentEnv")
    message = str(bad.value)
    assert "score_episode(self, completion, answer) fits neither interface" in message
    assert "score_episode(self, episode)" in message and "score_episode(self, model, tokenizer, completion, case_idx)" in message
    result = aitrain("env", "check", "--rl-env-module", MODULE, "--rl-env-class", "BadToolsEnv", "--policies", "empty")
    assert result.exit_code == 2
    assert "BadToolsEnv.get_tools() item 0" in result.output and "has no function name" in result.output
    result = aitrain("env", "check", "--rl-env-module", "envs_fixtures.duck", "--rl-env-class", "DuckEnv",
                     "--policies", "empty", "--episodes", "1")
    assert "interface: aitrain-grpo interface" in result.output


def test_scoring_with_the_live_model_refuses_episodes_played_ahead():
    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.training.rollout.training_rollout import TrainingRollout

    env = load_environment(MODULE, "DefaultsEnv")
    with pytest.raises(ConfigError, match="use --rl-async-steps 0"):
        TrainingRollout(env, RunConfig(rl_async_steps=1))


def test_eval_scores_with_the_model_it_evaluates(aitrain, tmp_path):
    log = tmp_path / "eval.jsonl"
    result = aitrain("eval", "--model", "tiny", "--rl-env-module", MODULE, "--rl-env-class", "GreetingEnv",
                     "--rl-env-config", json.dumps({"log_path": str(log)}), "--episodes", "2",
                     "--rl-max-new-tokens", "8")
    assert result.exit_code == 0, result.output
    seen = calls(log)
    assert len(seen) == 2 and {c["model"] for c in seen} == {"LlamaForCausalLM"}
    assert not any(c["training"] or c["grad"] for c in seen)


def test_an_aitraining_instance_handed_to_train_is_adapted_as_the_cli_would(tiny_model_dir, tmp_path, monkeypatch):
    from aitrain_grpo import RunConfig
    from aitrain_grpo.training.trainer import build_trainer

    monkeypatch.chdir(REPO / "tests")
    from envs_fixtures.aitraining_style import GreetingEnv

    log = tmp_path / "calls.jsonl"
    config = RunConfig(model=tiny_model_dir, output_dir=str(tmp_path / "run"), max_steps=1, rl_max_new_tokens=8,
                       rl_env_module=MODULE, rl_env_class="GreetingEnv")  # names for the record; the instance plays
    trainer = build_trainer(config, env=GreetingEnv(log_path=str(log)))
    assert isinstance(trainer.rollout.env, AITrainingEnvironment)
    trainer.train()
    assert {c["model"] for c in calls(log)} == {"PeftModelForCausalLM"}  # scored with the live policy
