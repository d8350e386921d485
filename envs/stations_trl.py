"""envs.stations written once in TRL's `environment_factory` form, for the head-to-head with TRL.

`StationsTRL` is a plain class as TRL's docs write one: built with no arguments, `reset(**row)` per
episode, its public methods the tools, no import from aitrain_grpo in the class itself. TRL runs it
natively (`GRPOTrainer(environment_factory=StationsTRL, reward_funcs=[station_reward])`) and aitrain
through its adapter (`--rl-env trl:envs.stations_trl:StationsTRL` with `rows` and `reward_func` in
`--rl-env-config`; benchmarks/head_to_head.py builds both).

It reuses envs/stations.py's world: the same cities and split (envs/cities.py), the same station ids
and temperatures (StationEnv's seed 0), the same question, example, tool docstrings and replies, so a
model sees exactly the tokens it sees in `envs.stations` (SFT demonstrations and `aitrain eval` on the
held-back split use StationEnv itself). Three choices keep the two trainers' views identical:
- The tools have no return annotation: `get_json_schema` would add a "return" key that StationEnv's
  schemas do not have, and the system prompt would differ by a few tokens.
- A tool that fails returns StationEnv's error text ("Error: ValueError: ...") instead of raising: TRL
  shows a raised error as `{'error': '...'}`, aitrain as `Error: ...`.
- The score is `station_reward`, a TRL reward function that reads only the conversation (the tool
  results shown and the model's turns) and the instance's city: TRL's `get_reward()` sees no text, so
  it cannot check the answer. It counts results *shown*, so a call on the last allowed turn, which
  aitrain runs without showing and TRL does not run, counts in neither.

Score (StationEnv's weights; success = 1.0): 0.1 for any tool result shown, +0.2 for the asked city's
station shown, +0.3 for its reading shown, +0.4 for a later model turn without a call that states the
number. StationEnv also gives its 0.1 for a call that failed to parse (no result shown): not here.

`station_reward_per_call` is a deliberately gamed variant (benchmarks/SHORTCUTS.md): its 0.1 is paid for
every result shown, an error included (the total capped at 1.0), so a failed call earns what a good one
does and an episode that will not reach the answer earns more by calling on than by answering wrong.
It is the issue-41 tool run that the shortcut warning must catch; no default uses it. From the SFT start
the policy learned the task instead (the answer's 0.4 outweighs a call's 0.1), so
`station_reward_calls_pay` pays 0.3 a call: there four calls of any kind are worth a solved episode.

Left out: per-turn rewards (`--rl-advantage turn`; the head-to-head runs `outcome`) and malformed calls
(wrong argument names): TRL answers those with its own `{'error': ...}` text, aitrain with a schema
check, and neither can be changed from the environment.
"""

from __future__ import annotations

import re

from envs.cities import split_cities
from envs.stations import StationEnv

_WORLD = StationEnv()  # seed 0: the station ids and temperatures every StationEnv of the benchmarks uses
MAX_TURNS = 4  # StationEnv.max_turns: model turns per episode (TRL: max_tool_calling_iterations = 3)
FOUND, READ, ANSWERED, TRIED = 0.2, 0.3, 0.4, 0.1
CALL_PAID = 0.3  # station_reward_calls_pay's price of any call past the first


class StationsTRL:
    """Find a city's weather station, read it, report the temperature (TRL environment_factory form)."""

    def __init__(self):
        self.stations, self.temperatures = _WORLD.stations, _WORLD.temperatures
        self.city: str | None = None

    def reset(self, **kwargs) -> None:
        """TRL passes every column of the row; the prompt is the row's, unchanged (None)."""
        self.city = kwargs["city"]
        return None

    def find_station(self, city: str):
        """Find the weather station of a city.

        Args:
            city: The city's name, e.g. Lisbon.
        """
        name = str(city).strip().title()
        if name not in self.stations:
            return f"Error: ValueError: no station for {city!r}"
        return f"The weather station of {name} is {self.stations[name]}."

    def read_station(self, station_id: str):
        """Read the current temperature at a weather station, in degrees Celsius.

        Args:
            station_id: The station's id, as find_station gives it.
        """
        station = str(station_id).strip().upper()
        if station not in self.temperatures:
            return f"Error: ValueError: unknown station {station_id!r}; find_station gives the ids"
        return f"{self.temperatures[station]} degrees Celsius at station {station}."


def _made_call(message: dict) -> bool:
    """A model turn with a tool call: TRL's parsed `tool_calls`, or aitrain's raw `<tool_call>` text."""
    return bool(message.get("tool_calls")) or "<tool_call>" in str(message.get("content") or "")


def episode_score(messages: list[dict], environment: StationsTRL) -> float:
    """The score of one episode from its messages after the prompt (see the module docstring)."""
    city = environment.city
    station = environment.stations[city]
    wanted = str(environment.temperatures[station])
    shown = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
    found = f"The weather station of {city} is {station}." in shown
    read_at = next((i for i, m in enumerate(messages) if m.get("role") == "tool"
                    and str(m.get("content")) == f"{wanted} degrees Celsius at station {station}."), None)
    read = found and read_at is not None
    answered = False
    if read:
        for i in range(read_at + 1, len(messages)):
            message = messages[i]
            followed_by_result = i + 1 < len(messages) and messages[i + 1].get("role") == "tool"
            if message.get("role") == "assistant" and not _made_call(message) and not followed_by_result:
                if re.search(rf"(?<![\d-]){re.escape(wanted)}(?!\d)", str(message.get("content") or "")):
                    answered = True
                    break
    return TRIED * bool(shown) + FOUND * found + READ * read + ANSWERED * answered


def station_reward(completions, environments, **kwargs) -> list[float]:
    """TRL reward function: one score per completion (its messages after the prompt)."""
    return [episode_score(list(completion), env) for completion, env in zip(completions, environments)]


def station_reward_per_call(completions, environments, **kwargs) -> list[float]:
    """`station_reward` with its 0.1 paid per tool result shown, failed calls included, at most 1.0 (opt in)."""
    scores = []
    for completion, env in zip(completions, environments):
        messages = list(completion)
        shown = sum(m.get("role") == "tool" for m in messages)
        scores.append(min(1.0, episode_score(messages, env) + TRIED * max(shown - 1, 0)))  # scores are in [0, 1]
    return scores


def station_reward_calls_pay(completions, environments, **kwargs) -> list[float]:
    """`station_reward` plus 0.3 for every tool result shown past the first, failed calls included, at most
    1.0 (opt in): four calls of any kind earn full marks, whatever they found (benchmarks/SHORTCUTS.md)."""
    scores = []
    for completion, env in zip(completions, environments):
        messages = list(completion)
        shown = sum(m.get("role") == "tool" for m in messages)
        scores.append(min(1.0, episode_score(messages, env) + CALL_PAID * max(shown - 1, 0)))
    return scores


def rows(split: str = "train", repeats: int = 4) -> list[dict]:
    """The dataset rows of `split`: StationEnv's prompts (question and example call) and a `city` column."""
    split_cities(split)
    return StationEnv(split=split, repeats=repeats).build_dataset(None)
