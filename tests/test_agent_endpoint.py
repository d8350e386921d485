"""Agent environments through the run's OpenAI-compatible endpoint: real openai clients, the real tiny model.

What a user relies on: the tokens that train are the tokens the model sampled (never re-tokenised), the
environment's tokens are the chat template's rendering of the agent's messages, each request lands in
its own episode, a rewritten history splits the episode, and faults are the episode's, not the run's.
"""

from __future__ import annotations

import pytest

from helpers import require  # noqa: E402

require("openai", "pip install openai")

import openai  # noqa: E402

from aitrain_grpo.engine.agent_endpoint import LOCAL_HOST, AgentEndpoint, _is_loopback  # noqa: E402
from aitrain_grpo.engine.agent_messages import meaning, template_messages  # noqa: E402
from aitrain_grpo.engine.backends.base import SamplingParams  # noqa: E402
from aitrain_grpo.engine.backends.hf import HFBackend  # noqa: E402
from aitrain_grpo.engine.chat import ChatRenderer  # noqa: E402
from aitrain_grpo.engine.rollout import RolloutEngine  # noqa: E402
from aitrain_grpo.engine.settings import EpisodeSettings  # noqa: E402
from aitrain_grpo.engine.runner import oracle_policy, play  # noqa: E402
from helpers.rollouts import model_spans  # noqa: E402
from envs_fixtures.agents import (BlockingAgent, ChattyAgent, LateAgent, RaisingAgent,  # noqa: E402
                                  StreamingWeatherAgent, SummarisingAgent, WeatherAgent, TEMPERATURES)


class RecordingBackend(HFBackend):
    """The real hf backend, keeping every sample it returned (what the model sampled)."""

    def generate(self, prompts, max_tokens, sampling):
        samples = super().generate(prompts, max_tokens, sampling)
        self.samples.extend(samples)
        return samples


def engine_for(env, model, tokenizer, *, max_new_tokens=12, max_completion_length=256, record=False,
               sampling=SamplingParams()):
    backend = HFBackend.for_model(model, tokenizer)
    if record:
        backend.__class__ = RecordingBackend
        backend.samples = []
    engine = RolloutEngine(env, tokenizer, backend, EpisodeSettings(
        max_new_tokens=max_new_tokens, max_completion_length=max_completion_length, model_name="tiny", sampling=sampling))
    return engine, backend


def test_trained_tokens_are_the_sampled_tokens_and_env_tokens_are_the_template(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = ChattyAgent(episodes=8, turns=3, max_tokens=16)
    # Hot, untruncated sampling: many sampled spans are then not the tokenizer's own split of their text
    # (5-9 of 24 measured), which is what re-tokenising would change.
    engine, backend = engine_for(env, model, tokenizer, record=True, max_new_tokens=16,
                                 sampling=SamplingParams(temperature=1.5, top_k=0))
    with engine:
        batch = engine.run(env.build_dataset(tokenizer))
    assert batch.agent_counts["requests"] == 24 and batch.agent_counts["history_rewrites"] == 0
    sampled = {tuple(s.token_ids) for s in backend.samples}
    renderer = ChatRenderer(tokenizer)
    non_canonical = 0
    for episode, trace in zip(batch.episodes, batch.traces):
        assert episode.error is None and episode.score == 1.0 and episode.turns == 3
        spans = model_spans(trace)
        assert len(spans) == 3  # one sequence: three model turns, with the agent's user messages between
        for span in spans:
            assert tuple(span) in sampled  # exactly as sampled, not re-encoded from text
            non_canonical += renderer.encode(tokenizer.decode(span)) != span
        # Everything else is the template's rendering of the conversation the agent sent.
        text = tokenizer.decode(trace.prompt_ids + trace.completion_ids, skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)
        ended_with_eos = trace.completion_ids[-1] == tokenizer.eos_token_id
        expected = renderer.render(episode.messages, add_generation_prompt=False)
        assert text + renderer.closing_text(ended_with_eos) == expected
        # The agent got back, as content, the text of what was trained.
        replies = env.replies[episode.row["id"]]
        assert [r.message.content for r in replies] == [m["content"] for m in episode.messages if m["role"] == "assistant"]
    # Re-encoding the decoded text would have changed some of these spans: the check above can fail.
    assert non_canonical > 0


def test_concurrent_episodes_each_get_their_own_requests(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = WeatherAgent(episodes=16)
    engine, _ = engine_for(env, model, tokenizer)
    with engine:
        batch = engine.run(env.build_dataset(tokenizer))
    assert batch.agent_counts["requests"] >= 16
    for episode in batch.episodes:
        assert episode.error is None
        assert f"Episode {episode.row['id']}." in episode.messages[0]["content"]
        assert episode.row["city"] in episode.messages[1]["content"]


def test_a_rewritten_history_splits_the_episode_and_the_last_segment_trains(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = SummarisingAgent()
    engine, _ = engine_for(env, model, tokenizer)
    with engine:
        batch = engine.run(env.build_dataset(tokenizer))
    assert batch.agent_counts["history_rewrites"] == 4  # one per episode
    assert batch.agent_counts["earlier_segment_tokens"] > 0
    for trace in batch.traces:
        prompt = tokenizer.decode(trace.prompt_ids)
        assert "Earlier you said" in prompt and "about hotels" not in prompt
        assert len(model_spans(trace)) == 1


def test_a_raising_agent_scores_zero_with_its_error(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = RaisingAgent()
    engine, _ = engine_for(env, model, tokenizer)
    with engine:
        batch = engine.run(env.build_dataset(tokenizer))
    for episode in batch.episodes:
        assert episode.score == 0.0 and episode.stop_reason == "error"
        assert episode.error.startswith("RaisingAgent.rollout raised KeyError")


def test_late_requests_and_other_model_names_get_openai_errors(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = LateAgent()
    engine, _ = engine_for(env, model, tokenizer)
    with engine:
        batch = engine.run(env.build_dataset(tokenizer))
    assert batch.scores == [1.0, 0.0]
    assert isinstance(env.left["refused"], openai.ConflictError)  # 409: the episode was scored
    assert "scored" in str(env.left["refused"])
    wrong = env.left["wrong_model"]
    assert isinstance(wrong, openai.NotFoundError) and wrong.code == "model_not_found"
    assert "'tiny'" in str(wrong)  # names the model this run serves


def test_budgets_clip_requests_and_end_the_loop(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = ChattyAgent(episodes=2, turns=4, max_tokens=1000)
    env.max_turns = 2
    engine, _ = engine_for(env, model, tokenizer, max_new_tokens=6)
    with engine:
        batch = engine.run(env.build_dataset(tokenizer))
    assert batch.agent_counts["clipped_requests"] == 4  # the two answered requests of each episode
    for episode in batch.episodes:
        replies = env.replies[episode.row["id"]]
        assert [r.finish_reason for r in replies[2:]] == ["length", "length"]  # past the turn cap
        assert all(r.message.content == "" for r in replies[2:])
        assert episode.turns == 2 and episode.truncated and episode.stop_reason == "max_turns"
    for trace in batch.traces:
        assert all(len(span) <= 6 for span in model_spans(trace))


def test_stop_strings_cut_the_reply_and_its_trained_tokens(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = ChattyAgent(episodes=4, turns=1, max_tokens=12, stop=[" the"])
    engine, _ = engine_for(env, model, tokenizer)
    with engine:
        batch = engine.run(env.build_dataset(tokenizer))
    stopped = 0
    for episode, trace in zip(batch.episodes, batch.traces):
        (reply,) = env.replies[episode.row["id"]]
        assert " the" not in reply.message.content
        if reply.finish_reason == "stop" and trace.completion_ids[-1] != tokenizer.eos_token_id:
            stopped += 1
            trained = tokenizer.decode(model_spans(trace)[0])
            assert trained.startswith(reply.message.content) and " the" in trained
    assert stopped > 0  # the tiny model says " the" a lot


def test_sync_agent_code_runs_on_a_blocking_client(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    env = BlockingAgent()
    engine, _ = engine_for(env, model, tokenizer)
    with engine:
        batch = engine.run(env.build_dataset(tokenizer))
    assert batch.scores == [1.0, 1.0]
    assert all(sum(trace.env_mask) > 0 for trace in batch.traces)


def test_the_oracle_plays_tool_calls_through_the_endpoint():
    env = WeatherAgent(episodes=3)
    episodes = play(env, env.build_dataset(None), oracle_policy(env), policy_name="solve")
    for episode in episodes:
        assert episode.error is None and episode.score == 1.0
        assert episode.tool_call_forms[0] == "hermes"  # read by the same parser as a ToolEnvironment's turns
        (result,) = [m for m in episode.messages if m["role"] == "tool"]
        assert result["name"] == "get_temperature"  # named after the call it answers, by tool_call_id
        assert str(TEMPERATURES[episode.row["city"]]) in result["content"]


def test_streamed_requests_get_the_same_replies_and_train_the_same_tokens(tiny_model_and_tokenizer):
    """`stream: true` (here the openai SDK's own stream helper) gets the reply the plain request gets, tool
    calls included, and the episode's tokens are the same: streaming changes the wire format only."""
    oracle = [play(env, env.build_dataset(None), oracle_policy(env), policy_name="solve")
              for env in (WeatherAgent(episodes=3), StreamingWeatherAgent(episodes=3))]
    for plain, streamed in zip(*oracle):
        assert streamed.error is None and streamed.score == 1.0
        assert [meaning(m) for m in streamed.messages] == [meaning(m) for m in plain.messages]
    model, tokenizer = tiny_model_and_tokenizer
    traces = []
    for env in (WeatherAgent(episodes=4), StreamingWeatherAgent(episodes=4)):
        engine, _ = engine_for(env, model, tokenizer, sampling=SamplingParams(temperature=0.0))
        with engine:
            batch = engine.run(env.build_dataset(tokenizer))
        assert [episode.error for episode in batch.episodes] == [None] * 4
        traces.append([(t.prompt_ids, t.completion_ids, t.env_mask) for t in batch.traces])
    assert traces[0] == traces[1]


def test_a_stream_reports_usage_when_asked():
    env, seen = ChattyAgent(episodes=1), {}

    async def rollout(client, row):
        stream = await client.chat.completions.create(model=client.model, stream=True,
                                                      stream_options={"include_usage": True},
                                                      messages=[{"role": "user", "content": "Hello?"}])
        seen["chunks"] = [chunk async for chunk in stream]
        return 1.0

    env.rollout = rollout
    (episode,) = play(env, env.build_dataset(None), lambda ep: "Hi there.")
    chunks = seen["chunks"]
    assert episode.error is None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi there."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # the usage chunk comes last
    assert all(c.usage is None for c in chunks[:-1])


def test_what_the_endpoint_does_not_serve_is_refused_naming_the_field():
    env, refused = ChattyAgent(episodes=1), {}

    async def rollout(client, row):
        for field, value in (("n", 2), ("logprobs", True)):
            try:
                await client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "Hi"}],
                                                     **{field: value})
            except openai.BadRequestError as exc:
                refused[field] = exc
        await client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "Hi"}],
                                             logprobs=False)  # asking for none is fine
        return 1.0

    env.rollout = rollout
    (episode,) = play(env, env.build_dataset(None), lambda ep: "Hello.")
    assert episode.error is None and sorted(refused) == ["logprobs", "n"]
    assert all(exc.param == field for field, exc in refused.items())


def test_messages_are_compared_by_meaning_not_shape():
    ours = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": [2]}'}}]}
    echoed = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"b":[2],"a":1}'}}]}
    assert meaning(ours) == meaning(echoed)
    assert meaning({"role": "user", "content": [{"type": "text", "text": "hi"}]}) == meaning({"role": "user", "content": "hi"})
    assert meaning({"role": "user", "content": "hi"}) != meaning({"role": "user", "content": "hi!"})
    rendered = template_messages([ours, {"role": "tool", "tool_call_id": "call_1", "content": "3"}], native_calls=False)
    assert rendered[1] == {"role": "tool", "name": "f", "content": "3"}
    assert '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": [2]}}\n</tool_call>' in rendered[0]["content"]


def this_machines_address() -> str | None:
    """A non-loopback address of this machine (the interface a packet out would leave by), or None."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: a UDP connect only picks the route
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if _is_loopback(address) else address


def test_other_hosts_reach_the_endpoint_only_when_it_is_bound_for_them():
    import asyncio

    import httpx

    address = this_machines_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")

    async def models(endpoint: AgentEndpoint, key: str | None, host: str) -> tuple[int, str]:
        await endpoint.start()
        try:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with httpx.AsyncClient() as http:
                reply = await http.get(f"http://{host}:{endpoint.port}/v1/models", headers=headers)
            return reply.status_code, reply.json()["error"]["code"] if reply.status_code != 200 else ""
        finally:
            await endpoint.close()

    def ask(endpoint, host, key="open") -> tuple[int, str]:
        key = endpoint.open(object()) if key == "open" else key  # any open episode: /v1/models reads no session
        return asyncio.run(models(endpoint, key, host))

    # The default: bound to 127.0.0.1, another address of this machine cannot even connect.
    with pytest.raises(httpx.ConnectError):
        ask(AgentEndpoint("tiny"), address)
    assert ask(AgentEndpoint("tiny"), LOCAL_HOST) == (200, "")
    # Bound to every interface (--agent-host 0.0.0.0): served from that address, with an episode's key only.
    assert ask(AgentEndpoint("tiny", host="0.0.0.0"), address) == (200, "")
    assert ask(AgentEndpoint("tiny", host="0.0.0.0"), address, key=None) == (401, "no_episode")
    # Bound for others but told to refuse them: a non-loopback peer gets an OpenAI-style 403.
    assert ask(AgentEndpoint("tiny", host="0.0.0.0", allow_remote=False), address) == (403, "remote_refused")
    assert ask(AgentEndpoint("tiny", host="0.0.0.0", allow_remote=False), LOCAL_HOST) == (200, "")


def test_a_port_in_use_is_a_one_line_error_naming_the_options():
    import asyncio
    import socket

    from aitrain_grpo.errors import ConfigError

    with socket.socket() as taken:
        taken.bind((LOCAL_HOST, 0))
        taken.listen()
        endpoint = AgentEndpoint("tiny", port=taken.getsockname()[1])
        with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1:\d+ .*--agent-port .*--agent-host"):
            asyncio.run(endpoint.start())
