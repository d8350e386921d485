"""verifiers environments for tests/test_adapter_verifiers.py, written with verifiers' own classic classes
(`verifiers.legacy`, verifiers 0.3.1) as a verifiers user writes them: data in memory, nothing from a hub.

- `capitals()`: a `SingleTurnEnv`; the rubric rewards the capital named in the reply (`weight`, 1) and,
  as a second reward function of weight 0, a short reply: the score is the weighted sum, both show as metrics.
- `countdown()`: a `MultiTurnEnv` subclass; the environment answers "lower"/"higher" until the model says
  the hidden number (its `final_env_response` ends the game), and `is_done` is a `@vf.stop` of its own.
- `calculator()`: a `ToolEnv` with a Python function tool, `multiply`; the rubric checks the final product.
"""

from __future__ import annotations

import re

import verifiers.legacy as vf
from datasets import Dataset

CAPITALS = {"France": "Paris", "Peru": "Lima", "Egypt": "Cairo", "Norway": "Oslo"}


def capitals(size: int = 4, weight: float = 1.0) -> vf.SingleTurnEnv:
    countries = list(CAPITALS)[:size]
    dataset = Dataset.from_list([{"question": f"What is the capital of {c}? Answer with the city only.",
                                  "answer": CAPITALS[c], "info": {"country": c}} for c in countries])

    def correct_city(completion, answer) -> float:
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        return 1.0 if answer.lower() in (text or "").lower() else 0.0

    def brief(completion) -> float:
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        return 1.0 if len(text or "") < 40 else 0.0

    rubric = vf.Rubric(funcs=[correct_city, brief], weights=[weight, 0.0])
    return vf.SingleTurnEnv(dataset=dataset, system_prompt="You know geography.", rubric=rubric)


class Countdown(vf.MultiTurnEnv):
    """Guess the hidden number; the environment says lower or higher after each wrong guess."""

    async def setup_state(self, state):
        state["solved"] = False
        return state

    async def env_response(self, messages, state, **kwargs):
        guess = re.findall(r"-?\d+", messages[-1]["content"] or "")
        target = int(state["answer"])
        if guess and int(guess[-1]) == target:
            state["solved"] = True
            state["final_env_response"] = [vf.UserMessage(content="Correct!")]  # ends without another turn
            return state["final_env_response"]
        hint = "no number in your reply" if not guess else ("lower" if int(guess[-1]) > target else "higher")
        return [vf.UserMessage(content=f"Wrong: {hint}. Guess again.")]

    @vf.stop
    async def is_done(self, state) -> bool:  # a stop condition of the user's own (verifiers' is_completed runs it)
        return state["solved"]


def countdown(max_turns: int = 4) -> Countdown:
    dataset = Dataset.from_list([{"question": "Guess my number between 1 and 9.", "answer": str(n)} for n in (3, 7)])

    def solved(state) -> float:
        return 1.0 if state["solved"] else 0.0

    return Countdown(dataset=dataset, rubric=vf.Rubric(funcs=[solved]), max_turns=max_turns)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return int(a) * int(b)


def calculator() -> vf.ToolEnv:
    pairs = [(12, 34), (7, 89)]
    dataset = Dataset.from_list([{"question": f"What is {a} times {b}? Use the multiply tool.", "answer": str(a * b)}
                                 for a, b in pairs])

    def product_stated(completion, answer) -> float:
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        return 1.0 if answer in (text or "") else 0.0

    return vf.ToolEnv(dataset=dataset, tools=[multiply], rubric=vf.Rubric(funcs=[product_stated]), max_turns=4)
