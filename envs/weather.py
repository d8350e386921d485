"""WeatherEnv: the smallest tool environment, one a 135M-parameter model can start on.

The user asks for the temperature in a city. The model should call `get_temperature(city)`, read the
result, and answer with the number. The temperatures come from `random.Random(seed)`, so the answer
cannot be guessed without the tool. Graded, so that a group of attempts differs in reward even while
the model rarely gets everything right:

    a <tool_call> block, even a broken one                          0.1
    a well-formed call of get_temperature with valid arguments      +0.1
    ... whose city is the one asked about                           +0.3
    a later answer that states the tool's temperature               +0.5

A valid call of the wrong city pays 0.2, not more: when it paid 0.4 (and the right city 0.6), GRPO
from a weak SFT start learned to look up one training city for every question (benchmarks/TOOL_USE.md).
The tool's description gives a city that is never a task (Tokyo), so copying the example earns nothing
beyond a valid call.

Metrics (logged as env/<name>): `tried_call` (a <tool_call> block was written), `valid_call` (the episode
made a valid call), `right_city`, `answered`.
Each question carries a worked example of a call (`example=False` leaves it out). Cities are split as
envs/cities.py says: `split="held_out"` gives 16 cities that `split="train"` never shows. Used by
benchmarks/learning.py and benchmarks/beyond_sft.py:

    aitrain grpo --model smollm2 --rl-env-module envs.weather --rl-env-class WeatherEnv

Left out: more than one tool, and any check of the answer's wording beyond the number.
"""

from __future__ import annotations

import json
import random
import re

from aitrain_grpo import Episode, ToolEnvironment, tool
from envs.cities import CITIES, MORE_HELD_OUT, split_cities

QUESTIONS = (
    "What is the temperature in {city} right now?",
    "How warm is it in {city} today?",
    "Tell me the current temperature in {city}.",
)
# The base SmolLM2-135M-Instruct never called the tool when only the system message described it
# (0 valid calls in 24 episodes): a hint in the question gives GRPO something to start from.
HINT = " Look it up with the get_temperature tool first, then tell me the number."
# With the hint alone GRPO taught it the form of a call but not its content: it copied the system
# message's placeholder (`{"name": "<function name>", ...}`) and no call was ever valid. A worked
# example of a real call (for a city that is not a task) shows what to fill in.
EXAMPLE = (' For example, for Tokyo you would write:\n<tool_call>\n{"name": "get_temperature", '
           '"arguments": {"city": "Tokyo"}}\n</tool_call>')


class WeatherEnv(ToolEnvironment):
    """Ask for a city's temperature; the model must look it up with the tool and report it."""

    max_turns = 3

    def __init__(self, split: str = "train", seed: int = 0, repeats: int = 4, example: bool = True):
        split_cities(split)  # a bad split is refused here, when the environment is made
        if repeats < 1:
            raise ValueError("repeats must be at least 1")
        self.split = split
        self.repeats = repeats
        self.example = example  # a worked example of a call in each question (EXAMPLE)
        rng = random.Random(seed)
        # MORE_HELD_OUT after CITIES: the held-out-only cities change no other city's value
        self.temperatures = {city: rng.randint(-5, 35) for city in CITIES + MORE_HELD_OUT}

    def cities(self) -> list[str]:
        return split_cities(self.split)

    def build_dataset(self, tokenizer) -> list[dict]:
        rows = []
        for repeat in range(self.repeats):
            for c, city in enumerate(self.cities()):
                question = QUESTIONS[(c + repeat) % len(QUESTIONS)].format(city=city) + HINT
                if self.example:
                    question += EXAMPLE
                rows.append({"prompt": [{"role": "user", "content": question}], "city": city})
        return rows

    @tool
    def get_temperature(self, city: str, episode: Episode) -> str:
        """Get the current temperature of a city, in degrees Celsius.

        Args:
            city: The city's name, e.g. Tokyo.
        """
        name = city.strip().title()
        if name not in self.temperatures:
            raise ValueError(f"unknown city {city!r}")
        episode.state.setdefault("looked_up", []).append(name)
        return f"{self.temperatures[name]} degrees Celsius in {name}"

    def solve(self, episode: Episode) -> str:
        """An expert's next message: call the tool for the asked city, then state its number. Used by
        `aitrain env check` and by `aitrain sft` to write demonstrations (a warm start before GRPO)."""
        city = episode.row["city"]
        if city not in episode.state.get("looked_up", []):
            call = json.dumps({"name": "get_temperature", "arguments": {"city": city}})
            return f"<tool_call>\n{call}\n</tool_call>"
        return f"It is {self.temperatures[city]} degrees Celsius in {city} right now."

    def score_episode(self, episode: Episode) -> float:
        looked_up = episode.state.get("looked_up", [])
        city = episode.row["city"]
        valid_call = bool(looked_up)
        right_city = city in looked_up
        answered = False
        if right_city:
            wanted = str(self.temperatures[city])
            # The turns after the first lookup of the right city; the number must stand on its own.
            seen_result = False
            for message in episode.messages:
                if message["role"] == "tool" and message["content"].endswith(f"in {city}"):
                    seen_result = True
                elif seen_result and message["role"] == "assistant" and "<tool_call>" not in message["content"]:
                    answered = answered or re.search(rf"(?<![\d-]){re.escape(wanted)}(?!\d)", message["content"]) is not None
        tried_call = episode.num_tool_calls > 0
        episode.metrics["tried_call"] = float(tried_call)
        episode.metrics["valid_call"] = float(valid_call)
        episode.metrics["right_city"] = float(right_city)
        episode.metrics["answered"] = float(answered)
        return 0.1 * tried_call + 0.1 * valid_call + 0.3 * right_city + 0.5 * answered
