"""StationEnv: a tool task that needs two dependent calls, small enough for a 135M-parameter model.

The user asks for the temperature in a city. Temperatures are read at weather stations whose ids the
model cannot know: it must first call `find_station(city)`, then `read_station(station_id)` with the id
the first call returned, then answer with the number. Station ids and temperatures come from
`random.Random(seed)`, so nothing can be guessed. The score checks content, graded so that a group of
attempts differs while the model rarely gets everything right:

    any tool call, even a broken one                                 0.1
    find_station called for the asked city                          +0.2
    read_station called with that city's station id                 +0.3
    a later answer (no tool call) that states the station's number  +0.4

Each right call is also rewarded on its own turn (`episode.reward_turn`, 0.2 and 0.3), and the answer's
turn gets 0.4, so `--rl-advantage turn` can credit the turn that earned it; the default `outcome`
ignores these. Metrics: `found_station`, `read_station`, `answered`, `wrong_id` (read_station with an
id that no find_station call of the episode returned: a guessed or copied id).

Cities are split as envs/cities.py says: 16 for training, 16 held back (4 of the first 20 and 12 that
only evaluation sees).
Used by benchmarks/beyond_sft.py.

Left out: ambiguity (one station per city) and any check of the answer's wording beyond the number.
"""

from __future__ import annotations

import json
import random
import re

from aitrain_grpo import Episode, ToolEnvironment, tool
from envs.cities import CITIES, MORE_HELD_OUT, split_cities

QUESTION = ("What is the temperature in {city} right now? First find the city's weather station with "
            "find_station, then read that station with read_station, then tell me the number.")
EXAMPLE = (' A call looks like this:\n<tool_call>\n{"name": "find_station", "arguments": {"city": "Tokyo"}}'
           '\n</tool_call>')
FOUND, READ, ANSWERED = 0.2, 0.3, 0.4


class StationEnv(ToolEnvironment):
    """Find a city's weather station, read it, report the temperature: two dependent tool calls."""

    max_turns = 4

    def __init__(self, split: str = "train", seed: int = 0, repeats: int = 4, example: bool = True):
        split_cities(split)  # a bad split is refused here, when the environment is made
        if repeats < 1:
            raise ValueError("repeats must be at least 1")
        self.split, self.repeats, self.example = split, repeats, example
        rng = random.Random(seed)
        self.stations: dict[str, str] = {}
        self.temperatures: dict[str, int] = {}
        for cities in (CITIES, MORE_HELD_OUT):  # in this order: the held-out-only cities change no other value
            stations = {city: f"{city[:3].upper()}-{rng.randint(100, 999)}" for city in cities}
            self.stations.update(stations)
            self.temperatures.update({station: rng.randint(-5, 35) for station in stations.values()})

    def cities(self) -> list[str]:
        return split_cities(self.split)

    def build_dataset(self, tokenizer) -> list[dict]:
        example = EXAMPLE if self.example else ""
        return [{"prompt": [{"role": "user", "content": QUESTION.format(city=city) + example}], "city": city}
                for _ in range(self.repeats) for city in self.cities()]

    @tool
    def find_station(self, city: str, episode: Episode) -> str:
        """Find the weather station of a city.

        Args:
            city: The city's name, e.g. Lisbon.
        """
        name = city.strip().title()
        if name not in self.stations:
            raise ValueError(f"no station for {city!r}")
        found = episode.state.setdefault("found", [])
        if name == episode.row["city"] and name not in found:
            episode.reward_turn(FOUND)
        found.append(name)
        return f"The weather station of {name} is {self.stations[name]}."

    @tool
    def read_station(self, station_id: str, episode: Episode) -> str:
        """Read the current temperature at a weather station, in degrees Celsius.

        Args:
            station_id: The station's id, as find_station gives it.
        """
        station = station_id.strip().upper()
        if station not in self.temperatures:
            raise ValueError(f"unknown station {station_id!r}; find_station gives the ids")
        read = episode.state.setdefault("read", [])
        if station == self.stations[episode.row["city"]] and station not in read:
            episode.reward_turn(READ)
        read.append(station)
        return f"{self.temperatures[station]} degrees Celsius at station {station}."

    def solve(self, episode: Episode) -> str:
        """An expert's next message: find the asked city's station, read it, state the number."""
        city = episode.row["city"]
        station = self.stations[city]
        if city not in episode.state.get("found", []):
            return _call("find_station", city=city)
        if station not in episode.state.get("read", []):
            return _call("read_station", station_id=station)
        return f"It is {self.temperatures[station]} degrees Celsius in {city} right now."

    def score_episode(self, episode: Episode) -> float:
        city = episode.row["city"]
        station = self.stations[city]
        found = city in episode.state.get("found", [])
        read = found and station in episode.state.get("read", [])
        returned = {self.stations[name] for name in episode.state.get("found", [])}
        answered_turn = self._answer_turn(episode, station) if read else None
        if answered_turn is not None:
            episode.reward_turn(ANSWERED, turn=answered_turn)
        episode.metrics["found_station"] = float(found)
        episode.metrics["read_station"] = float(read)
        episode.metrics["answered"] = float(answered_turn is not None)
        episode.metrics["wrong_id"] = float(any(s not in returned for s in episode.state.get("read", [])))
        tried = episode.num_tool_calls > 0
        return 0.1 * tried + FOUND * found + READ * read + ANSWERED * (answered_turn is not None)

    def _answer_turn(self, episode: Episode, station: str) -> int | None:
        """The model turn (0-based) that first states the station's number after reading it, without a call."""
        wanted = str(self.temperatures[station])
        seen, turn = False, -1
        for message in episode.messages:
            if message["role"] == "tool" and message["content"].endswith(f"at station {station}."):
                seen = True
            elif message["role"] == "assistant":
                turn += 1
                text = str(message["content"] or "")
                made_call = turn < len(episode.tool_call_forms) and episode.tool_call_forms[turn] is not None
                if seen and not made_call and re.search(rf"(?<![\d-]){re.escape(wanted)}(?!\d)", text):
                    return turn
        return None


def _call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
