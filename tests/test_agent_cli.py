"""Agent environments through every command, as a user runs them: `env check` shows the agent's own request
and tools and names a rollout that raises; `eval`, `sft` and `grpo` play the agent's code through the
endpoint; sft's demonstrations are token for token what the endpoint builds for the same requests; the
worked example (examples/agents/weather_agent.py) passes its check."""

from __future__ import annotations

import json
import re

import pytest

from helpers import REPO, in_process_cli, policy_row, run_cli

pytestmark = pytest.mark.integration

AGENT = ["--rl-env-module", "tests.envs_fixtures.agents", "--rl-env-class", "WeatherAgent"]
EXAMPLE = ["--rl-env", "examples.agents.weather_agent:WeatherAgent"]


@pytest.fixture
def aitrain(monkeypatch):
    """Run `aitrain ARGS` in-process from the repository root (same code and exit codes as the command)."""
    return in_process_cli(monkeypatch, REPO)


def test_env_check_shows_the_agents_request_and_tools_and_its_episodes(aitrain):
    result = aitrain("env", "check", *AGENT, "--episodes", "4")
    out = result.output
    assert result.exit_code == 0, out
    assert "interface: agent environment: rollout(client, row)" in out
    # What the model sees is the agent's own request (its system message, its tools), not the row's prompt.
    assert "the agent's first request" in out and "You answer weather questions. Episode" in out
    assert "get_temperature(city)" in out and "tools come with each request" in out
    assert policy_row(out, "oracle")[:3] == ["1.000", "1.000", "1.000"]  # solve answered every request
    assert policy_row(out, "oracle")[3] == "2.00"  # a lookup, then the answer
    assert policy_row(out, "model")[4] == "0"  # the model played, without errors
    assert re.search(r"the model's episodes: [1-9]\d* requests", out), out
    assert "env check passed" in out


def test_env_check_names_a_rollout_that_raises(aitrain):
    result = aitrain("env", "check", "--rl-env-module", "tests.envs_fixtures.agents", "--rl-env-class",
                     "RaisingAgent", "--episodes", "2", "--policies", "empty")
    assert result.exit_code == 1, result.output
    assert "RaisingAgent.rollout raised KeyError" in result.output and "the agent's own bug" in result.output


def test_the_worked_example_passes_its_check(aitrain):
    result = aitrain("env", "check", *EXAMPLE, "--episodes", "4")
    assert result.exit_code == 0, result.output
    assert policy_row(result.output, "oracle")[0] == "1.000" and policy_row(result.output, "empty")[0] == "0.000"
    assert "Answer with the get_temperature tool." in result.output


def test_eval_plays_the_agent(tmp_path):
    records = tmp_path / "eval.jsonl"
    result = run_cli("eval", "--model", "tiny", *AGENT, "--episodes", "4", "--rl-max-new-tokens", "16",
                     "--output", str(records))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"episodes\s+│\s+4\b", result.stdout), result.stdout
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == 4 and all(line["error"] is None for line in lines)
    # The transcript is the agent's conversation: its system message, then the model's reply.
    assert all(line["messages"][0]["content"].startswith("You answer weather questions") for line in lines)
    assert all(line["messages"][2]["role"] == "assistant" for line in lines)


def test_sft_learns_from_the_oracle_with_the_tools_of_its_requests(tmp_path):
    out = tmp_path / "sft"
    result = run_cli("sft", "--model", "tiny", *AGENT, "--episodes", "8", "--max-steps", "2", "--output-dir", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept 8 scoring >= 1" in result.stdout
    demos = [json.loads(line) for line in (out / "demos.jsonl").read_text().splitlines()]
    for demo in demos:
        # The prompt is what the agent sent before the first reply (system + user), the tools its request's.
        assert [m["role"] for m in demo["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        assert demo["prompt_length"] == 2
        assert [t["function"]["name"] for t in demo["tools"]] == ["get_temperature"]
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    assert json.loads((out / "run_summary.json").read_text())["global_step"] == 2


def test_sft_tokens_are_what_the_endpoint_builds(tiny_model_dir, monkeypatch):
    """The SFT sequence of an agent's demonstration is token for token the sequence training builds when the
    model writes the oracle's replies to the same requests (prompt with the request's tools, replies as
    sampled, tool results as the template's suffix), and its loss mask is the engine's env_mask."""
    from aitrain_grpo.sft.oracle import play_demonstrations
    from aitrain_grpo.engine.rollout import RolloutEngine
    from aitrain_grpo.engine.settings import EpisodeSettings
    from aitrain_grpo.env.dataset import build_rows
    from aitrain_grpo.env.loading import load_environment
    from aitrain_grpo.models.loading import load_tokenizer, resolve_source
    from aitrain_grpo.sft.trainer import demo_dataset
    from helpers.rollouts import OracleBackend

    monkeypatch.chdir(REPO)  # environments' modules are imported from the current folder, as the CLI does
    tokenizer = load_tokenizer(resolve_source(tiny_model_dir))
    env = load_environment("examples.agents.weather_agent", "WeatherAgent", None)
    rows = build_rows(env, tokenizer)
    demos, errors = play_demonstrations(env, rows, 6, max_turns=None, timeout=10)
    assert not errors and all(d.score == 1.0 and d.tools for d in demos)
    dataset = demo_dataset(tokenizer, demos)
    engine = RolloutEngine(env, tokenizer, OracleBackend(dataset, tokenizer.eos_token_id),
                           EpisodeSettings(max_new_tokens=512, max_completion_length=4096))
    with engine:
        batch = engine.run([dict(rows[d.row]) for d in demos])
    for demo, ids, mask, episode, trace in zip(demos, dataset["input_ids"], dataset["assistant_masks"],
                                               batch.episodes, batch.traces):
        assert episode.error is None and episode.score == 1.0
        assert trace.prompt_ids + trace.completion_ids == ids
        assert [0] * len(trace.prompt_ids) + trace.env_mask == mask


def test_grpo_trains_on_the_agents_requests(tmp_path):
    out = tmp_path / "run"
    result = run_cli("grpo", "--model", "tiny", *AGENT, "--max-steps", "1", "--batch-size", "4",
                     "--rl-num-generations", "2", "--rl-max-new-tokens", "24", "--output-dir", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step 1/1" in result.stdout
    assert "environment WeatherAgent: agent environment: rollout(client, row)" in result.stdout
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["agent/requests"] >= 4  # at least one request per episode
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert episodes and all(ep["messages"][0]["content"].startswith("You answer weather questions")
                            and ep["messages"][2]["role"] == "assistant" for ep in episodes)
    assert (out / "adapter_model.safetensors").exists()
