"""The environment examples in README.md work as printed: a user copying them gets a working env."""

from __future__ import annotations

import re

from aitrain_grpo.engine.runner import play
from conftest import REPO


def readme_class(name: str) -> type:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    (code,) = [block for block in blocks if f"class {name}(" in block]
    namespace: dict = {}
    exec(compile(code, f"README.md:{name}", "exec"), namespace)  # our own documentation, not model output
    return namespace[name]


def test_guess_env_example_rewards_finding_the_secret_quickly():
    env = readme_class("GuessEnv")(high=20, num_tasks=4, seed=1)
    rows = env.build_dataset(None)

    def bisect(episode):
        low, high = 1, 20
        guesses = episode.state["guesses"]
        replies = [m["content"] for m in episode.messages if m["role"] == "user"][1:]
        for guess, reply in zip(guesses, replies):
            if reply == "Higher.":
                low = guess + 1
            elif reply == "Lower.":
                high = guess - 1
        return str((low + high) // 2)

    episodes = play(env, rows, bisect)
    assert all(ep.error is None for ep in episodes)
    assert all(0.5 <= ep.score <= 1.0 for ep in episodes)  # bisection finds 1..20 within 5 guesses
    silent = play(env, rows, lambda ep: "no idea")
    assert all(ep.score == 0.0 and ep.truncated for ep in silent)


def test_calculator_example_runs_its_tool():
    env = readme_class("Calculator")()
    call = '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'
    (episode,) = play(env, env.build_dataset(None), lambda ep: call if ep.turns == 0 else "It is 42.")
    assert episode.messages[2]["content"] == "42" and episode.score == 1.0
