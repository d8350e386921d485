"""No silent wait (issue 35): a wait that had no bound ends within it, with one line naming what it waited for.

The waits and their bounds (docs/operations.md, "When things go wrong"): generation by the token budgets, a
vLLM server by --vllm-server-timeout (test_vllm_servers.py, test_preemption.py), an environment call by
--rl-env-timeout (test_contract.py), MCP tools by their timeout (test_mcp_tools.py), the judge by its HTTP
timeout (test_judge.py), the run's other processes by --ddp-timeout (test_waits_collectives.py). Here: an
agent environment's own code between two requests, which held the rollout without a word; it is bounded by
--rl-env-timeout too, in async and in blocking agent code.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from helpers import require  # noqa: E402

require("openai", "pip install openai")

from aitrain_grpo import AgentEnvironment  # noqa: E402
from aitrain_grpo.engine.runner import play  # noqa: E402


class HangingAgent(AgentEnvironment):
    """One request, then the agent's own code waits on something that never comes (a tool, a sandbox)."""

    def build_dataset(self, tokenizer):
        return [{"prompt": "hi", "id": i} for i in range(2)]

    async def rollout(self, client, row):
        await client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4)
        await asyncio.sleep(3600)
        return 1.0

    def solve(self, episode):
        return "hello"


class BlockingHangingAgent(HangingAgent):
    def rollout(self, client, row):  # sync agent code on a blocking client, in a worker thread
        client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        time.sleep(4)  # longer than the timeout (a test cannot leave a thread asleep for an hour)
        return 1.0


class SlowButMovingAgent(HangingAgent):
    """Takes longer than the timeout in all, but never that long between two requests: not a hang."""

    async def rollout(self, client, row):
        for _ in range(4):
            await client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4)
            await asyncio.sleep(0.4)
        return 1.0


@pytest.mark.parametrize("env_class", [HangingAgent, BlockingHangingAgent])
def test_an_agent_that_stops_asking_ends_its_episode_at_the_env_timeout(env_class):
    env = env_class()
    started = time.monotonic()
    episodes = play(env, env.build_dataset(None), env.solve, policy_name="solve", timeout=1.0)
    assert time.monotonic() - started < 3.5  # not an hour, nor the blocking agent's four seconds
    for episode in episodes:
        assert episode.score == 0.0 and episode.stop_reason == "error"
        assert episode.error == (f"{env_class.__name__}.rollout made no request for 1s after the model's last reply "
                                 "(--rl-env-timeout 1s); the agent's own code (a tool, a sandbox, a lock) is waiting "
                                 "on something, or raise the timeout")


def test_an_agent_slower_than_the_timeout_in_all_but_never_idle_that_long_is_not_cut():
    env = SlowButMovingAgent()
    episodes = play(env, env.build_dataset(None), env.solve, policy_name="solve", timeout=1.0)
    assert [(e.error, e.score) for e in episodes] == [(None, 1.0)] * 2
