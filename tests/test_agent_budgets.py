"""Every budget option means for an agent environment's episodes what it means for an environment's
(engine/budgets.py, one implementation): the context window (`--rl-context-window`) and the episode's
token budget (`--rl-max-episode-tokens`) end the episode with the stop reason an environment's would get,
the agent's request answered with an empty "length" reply; long tool or user messages
(`--rl-max-tool-result-tokens`) are cut in the sequence the model sees; and a context strategy
(`--rl-context`), which an agent's own code owns, is refused in one line before a model loads."""

from __future__ import annotations

import pytest

from aitrain_grpo import AgentEnvironment
from aitrain_grpo.engine.backends.hf import HFBackend
from aitrain_grpo.engine.context import resolve_strategy
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.errors import ConfigError
from envs_fixtures.agents import ChattyAgent, WeatherAgent
from helpers import REPO
from helpers.cli import refused

AGENT = ["--rl-env-module", "tests.envs_fixtures.agents", "--rl-env-class", "WeatherAgent"]
DOCUMENT = " ".join(f"word{i}" for i in range(150))


class ForgetfulAgent(AgentEnvironment):
    """Sends a fresh one-message history every request: each request is a new segment (sequence)."""

    def __init__(self, turns: int = 6):
        self.turns = turns
        self.replies: dict[int, list] = {}

    def build_dataset(self, tokenizer):
        return [{"prompt": "Say something.", "id": i} for i in range(2)]

    async def rollout(self, client, row):
        replies = self.replies.setdefault(row["id"], [])
        for turn in range(self.turns):
            reply = await client.chat.completions.create(
                model=client.model, messages=[{"role": "user", "content": f"Say something new ({turn})."}])
            replies.append(reply.choices[0])
        return 1.0


class ReadingAgent(AgentEnvironment):
    """A long task, then two long documents as user messages after the model's turns (append-only)."""

    def build_dataset(self, tokenizer):
        return [{"prompt": "Read.", "id": i} for i in range(2)]

    async def rollout(self, client, row):
        messages = [{"role": "user", "content": f"Task: {DOCUMENT}"}]
        for turn in range(3):
            reply = await client.chat.completions.create(model=client.model, messages=messages, max_tokens=6)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": f"Document {turn}: {DOCUMENT}"}]
        return 1.0


def play(env, model, tokenizer, **settings):
    backend = HFBackend.for_model(model, tokenizer)
    with RolloutEngine(env, tokenizer, backend, EpisodeSettings(model_name="tiny", max_completion_length=512,
                                                                **settings)) as engine:
        return engine.run(env.build_dataset(tokenizer))


def test_the_context_window_ends_an_agents_episode_with_stop_reason_context(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = ChattyAgent(episodes=2, turns=6, max_tokens=None)
    batch = play(env, model, tokenizer, max_new_tokens=12, context_window=80)
    for episode, trace in zip(batch.episodes, batch.traces):
        assert trace.length <= 80  # never past the window
        assert episode.truncated and episode.stop_reason == "context"
        last = env.replies[episode.row["id"]][-1]  # the agent was told, as by any OpenAI server at its limit
        assert last.finish_reason == "length" and last.message.content == ""


def test_the_episode_token_budget_counts_every_segment_of_an_agent(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = ForgetfulAgent(turns=6)
    batch = play(env, model, tokenizer, max_new_tokens=8, max_episode_tokens=20)
    for i, episode in enumerate(batch.episodes):
        sampled = sum(sum(trace.env_mask) for trace in [*batch.earlier[i], batch.traces[i]])
        assert sampled == episode.log.model_tokens <= 20  # over all its sequences, as for an environment
        assert episode.log.sequences > 1  # each request was a new sequence: a per-sequence budget never bound
        assert episode.truncated and episode.stop_reason == "completion_budget"
        assert env.replies[episode.row["id"]][-1].finish_reason == "length"


def test_long_results_are_cut_in_the_agents_sequence_and_its_requests_still_extend(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = ReadingAgent()
    batch = play(env, model, tokenizer, max_new_tokens=6, max_tool_result_tokens=16)
    assert batch.agent_counts["history_rewrites"] == 0  # compared with what the agent sent, not the cut text
    for episode, trace in zip(batch.episodes, batch.traces):
        assert episode.log.tool_results_cut == 2  # the two documents; the task is not a result
        text = tokenizer.decode(trace.prompt_ids + trace.completion_ids, skip_special_tokens=False)
        assert text.count("tokens cut ...]") == 2 and text.count(DOCUMENT) == 1  # the task, whole
        assert "word0" in text.split("Document 0:")[1] and "word149" in text.split("Document 0:")[1]


class SummarizingAgent(WeatherAgent):
    context_strategy = "summarize"


class CompactingAgent(WeatherAgent):
    def compact(self, episode):
        return None


def test_a_context_strategy_cannot_be_played_for_an_agent(tiny_model_and_tokenizer):
    with pytest.raises(ConfigError, match=r"^--rl-context drop-tool-results does not apply to WeatherAgent, an "
                                          r"agent environment: .*leave out --rl-context \(or pass keep\)"):
        resolve_strategy(WeatherAgent(), "drop-tool-results")
    with pytest.raises(ConfigError, match=r"^SummarizingAgent.context_strategy 'summarize' does not apply.*remove it"):
        resolve_strategy(SummarizingAgent(), None)
    with pytest.raises(ConfigError, match=r"^CompactingAgent.compact does not apply to CompactingAgent"):
        resolve_strategy(CompactingAgent(), None)
    assert resolve_strategy(CompactingAgent(), "keep") == resolve_strategy(WeatherAgent(), None) == "keep"
    model, tokenizer = tiny_model_and_tokenizer
    with pytest.raises(ConfigError, match="--rl-context summarize does not apply to WeatherAgent"):
        RolloutEngine(WeatherAgent(), tokenizer, HFBackend.for_model(model, tokenizer),
                      EpisodeSettings(context="summarize"))


@pytest.mark.parametrize("command", ["grpo", "eval", "env check", "sft"])
def test_every_command_refuses_a_context_strategy_for_an_agent_before_a_model_loads(tmp_path, monkeypatch, command):
    import aitrain_grpo.commands.evaluation as evaluation
    import aitrain_grpo.evaluation.envcheck as envcheck
    import aitrain_grpo.sft.trainer as sft_trainer
    import aitrain_grpo.training.trainer as trainer

    def reached(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    for module, name in ((trainer, "train"), (evaluation, "open_backend"), (envcheck, "load_for_generation"),
                         (envcheck, "load_tokenizer"), (sft_trainer, "load_model_and_tokenizer")):
        monkeypatch.setattr(module, name, reached)
    monkeypatch.chdir(REPO)  # tests.envs_fixtures.agents resolves from the repository root
    out = str(tmp_path / "run")
    args = {"grpo": ["grpo", "--output-dir", out], "eval": ["eval", "--model", "tiny", "--episodes", "2"],
            "env check": ["env", "check"], "sft": ["sft", "--output-dir", out]}[command]
    refused([*args, *AGENT, "--rl-context", "summarize"], tmp_path,
            "--rl-context summarize does not apply to WeatherAgent, an agent environment",
            "leave out --rl-context (or pass keep)")
