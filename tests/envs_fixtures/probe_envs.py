"""Environments for tests/test_probes.py: honest ones whose score only the task earns, and hackable ones,
each paying for one shortcut that env check's probes (aitrain_grpo/evaluation/probes.py) should name.

All are "add two numbers" tasks answered as `<answer>N</answer>`; `solve` answers right.
"""

from __future__ import annotations

import re

from aitrain_grpo import Environment, Episode, ToolEnvironment, tool

ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


class HonestSumEnv(Environment):
    """1.0 for the right sum in the format, 0.0 for anything else. Declares a probe it keeps low."""

    max_turns = 2

    def __init__(self, num_tasks: int = 8):
        self.num_tasks = num_tasks

    def build_dataset(self, tokenizer):
        return [{"prompt": f"What is {i} + {i + 7}? Reply as <answer>N</answer>.", "sum": 2 * i + 7}
                for i in range(self.num_tasks)]

    def score_episode(self, episode: Episode) -> float:
        found = ANSWER.search(episode.last_completion)
        return 1.0 if found and int(found.group(1)) == episode.row["sum"] else 0.0

    def solve(self, episode: Episode) -> str:
        return f"<answer>{episode.row['sum']}</answer>"

    def probes(self):
        return {"always-six": ["<answer>6</answer>"]}  # every sum is odd: never right


class FormatPaysEnv(HonestSumEnv):
    """Half the score for the answer tags alone, whatever they hold: `probe:format` earns it."""

    def score_episode(self, episode: Episode) -> float:
        tags = "<answer>" in episode.last_completion and "</answer>" in episode.last_completion
        return 0.5 * tags + 0.5 * super().score_episode(episode)


class EchoPaysEnv(HonestSumEnv):
    """Pays the share of the prompt's words the reply repeats: `probe:echo` scores like the oracle."""

    def score_episode(self, episode: Episode) -> float:
        if super().score_episode(episode) == 1.0:
            return 1.0
        asked = set(episode.messages[0]["content"].split())
        said = set(episode.last_completion.split())
        return len(asked & said) / len(asked)


class LengthPaysEnv(HonestSumEnv):
    """Pays long replies (a word count over 40): `probe:repeat` earns it."""

    def score_episode(self, episode: Episode) -> float:
        return max(super().score_episode(episode), min(1.0, len(episode.last_completion.split()) / 40))


class MajorityEnv(HonestSumEnv):
    """Seven tasks of eight have the sum 7: the declared `always-seven` probe scores near the oracle."""

    def build_dataset(self, tokenizer):
        return [{"prompt": f"What is {a} + {7 - a}? Reply as <answer>N</answer>.", "sum": 7} for a in range(7)] + [
            {"prompt": "What is 4 + 4? Reply as <answer>N</answer>.", "sum": 8}]

    def probes(self):
        return {"always-seven": lambda episode: "<answer>7</answer>"}


class BadProbesEnv(HonestSumEnv):
    """`probes()` returns a list, not a dict of names: a broken contract."""

    def probes(self):
        return ["<answer>6</answer>"]


class LookupEnv(ToolEnvironment):
    """Look a city's code up, then submit it; 1.0 for the right code submitted, 0.0 otherwise."""

    max_turns = 4
    CODES = {"Lisbon": 351, "Oslo": 47, "Lima": 51, "Quito": 593}

    def build_dataset(self, tokenizer):
        return [{"prompt": f"Find the calling code of {city} with lookup, then submit it.", "city": city}
                for city in self.CODES]

    @tool
    def lookup(self, city: str, episode: Episode) -> str:
        """Look a city's calling code up.

        Args:
            city: The city's name.
        """
        episode.state.setdefault("called", set()).add("lookup")
        return str(self.CODES.get(city, "unknown city"))

    @tool
    def submit(self, code: int, episode: Episode) -> str:
        """Submit the calling code.

        Args:
            code: The calling code.
        """
        episode.state.setdefault("called", set()).add("submit")
        episode.state["submitted"] = code
        return "submitted"

    def score_episode(self, episode: Episode) -> float:
        return 1.0 if episode.state.get("submitted") == self.CODES[episode.row["city"]] else 0.0

    def solve(self, episode: Episode) -> str:
        city = episode.row["city"]
        if episode.turns == 0:
            return f'<tool_call>{{"name": "lookup", "arguments": {{"city": "{city}"}}}}</tool_call>'
        if episode.turns == 1:
            return f'<tool_call>{{"name": "submit", "arguments": {{"code": {self.CODES[city]}}}}}</tool_call>'
        return "Done."


class CallsPayEnv(LookupEnv):
    """Pays every distinct tool called, whatever it was called with: `probe:tools` earns it."""

    def score_episode(self, episode: Episode) -> float:
        return max(super().score_episode(episode), 0.4 * len(episode.state.get("called", ())))
