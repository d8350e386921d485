"""A worked example environment: book the cheapest hotel that fits a guest's request.

Read it top to bottom as a guide to writing your own environment. The `aitrain` command imports the
class by module path and passes the JSON config as keyword arguments:

    aitrain grpo --model Qwen/Qwen2.5-0.5B-Instruct \\
        --rl-env-module envs.hotel --rl-env-class HotelEnv --rl-env-config '{"num_tasks": 256, "seed": 1}'

The pieces, in the order the engine uses them:

- `__init__` takes plain JSON values (validate them: a bad value should fail at once, with a message)
  and builds everything from `random.Random(seed)`, so a seed always means the same hotels and tasks.
- `build_dataset(tokenizer)` returns one row per task: a `prompt` (chat messages) plus JSON-simple
  columns (str/int/float/bool). Each row reaches the episode as `episode.row`; the columns here hold
  the task's facts and its one right answer, which the model never sees.
- `reset(episode)` fills `episode.state`, the scratch space for one episode (bookings, searches, ...).
- Methods marked `@tool` are offered to the model. Type hints and the docstring's `Args:` become the
  JSON schema rendered into the prompt; a parameter named `episode` is passed by the engine and hidden
  from the model. Raise `ValueError` with a helpful message and the model sees `Error: ...` instead.
- `step(episode, completion)` answers each model turn. `ToolEnvironment.step` already runs the tool
  calls, one after another in the order written; this class ends the episode once a booking
  succeeds, and `no_tool_call` lets a simulated guest answer the first question (1 task in 4 leaves
  out the number of guests or nights). Any other turn without a tool call ends the episode, and so
  does the turn cap, `self.max_turns`. A tool's description is its docstring's text before `Args:`.
- `score_episode(episode)` returns a number in [0, 1] and fills `episode.metrics` (logged as `env/<name>`).
- `solve(episode)` is an optional oracle: the message an expert would send next.

Scoring. A correct booking (the answer hotel, with the task's check-in, nights and guests) scores 1.0.
With `partial_credit=True` (the default) lesser episodes earn steps below it, so that a group of
attempts at one task differs in reward even while the model cannot yet book: GRPO learns only from
differences within a group, and a group of all zeros teaches nothing.

    booking that meets every constraint but is not the cheapest      0.6
    otherwise, each of: a well-formed call of a known tool           +0.1
                        a search of the task's city                  +0.1
                        an availability check of the answer hotel    +0.2
    each successful booking after the first                          -0.3 (floored at 0)

With `partial_credit=False` an episode scores 1.0 for exactly one booking, the right one, else 0.0.

Test an environment before training on it: `aitrain env check --rl-env-module envs.hotel
--rl-env-class HotelEnv` plays the `solve` oracle (it should score 1.0) and an empty model (it should
score 0.0); tests/test_hotel.py drives scripted turns through `aitrain_grpo.engine.runner.play`.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from aitrain_grpo import Episode, ToolEnvironment, tool

CITIES = {"LIS": "Lisbon", "OPO": "Porto", "MAD": "Madrid", "PAR": "Paris", "BER": "Berlin"}
FIRST_NIGHT = date(2026, 12, 1)  # tasks and booked-out nights fall in the 42 nights from here
WINDOW_NIGHTS = 42
MIN_RATINGS = (3.0, 3.5, 4.0, 4.5)
STYLES = ("Grand", "Royal", "Little", "Blue", "Old Town", "Garden", "Harbour", "Central", "Golden", "Quiet")
KINDS = ("Hotel", "Inn", "Suites", "House", "Lodge", "Residence")

SYSTEM_PROMPT = (
    "You are a travel agent booking a hotel for a guest. Use the tools to search hotels, check "
    "availability and book exactly one stay that meets every request at the lowest total price. "
    "If a detail you need is missing, ask the guest before booking. Dates are written YYYY-MM-DD."
)
REQUEST_TEMPLATES = (
    "Book the cheapest hotel in {city} rated {rating} or more{party}, {stay}.",
    "I need a room in {city}{party}, {stay}. It must be rated at least {rating}; pick the cheapest option.",
)
QUESTIONS = {"guests": "How many guests will be staying?", "nights": "How many nights will you stay?"}


@dataclass(frozen=True)
class Hotel:
    id: str
    name: str
    city: str
    rating: float
    price_per_night: int
    max_guests: int
    booked_out: frozenset[date]

    def is_free(self, check_in: date, nights: int) -> bool:
        return all(check_in + timedelta(days=i) not in self.booked_out for i in range(nights))

    def listing(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "rating": self.rating,
                "price_per_night": self.price_per_night, "max_guests": self.max_guests}


def build_catalogue(rng: random.Random) -> dict[str, list[Hotel]]:
    """4-6 hotels per city, each booked out on a few blocks of nights."""
    catalogue = {}
    for code, city in CITIES.items():
        names = rng.sample([f"{s} {k}" for s in STYLES for k in KINDS], rng.randint(4, 6))
        hotels = []
        for number, name in enumerate(names, start=1):
            booked = set()
            for _ in range(rng.randint(1, 4)):
                start = rng.randrange(WINDOW_NIGHTS)
                booked.update(FIRST_NIGHT + timedelta(days=start + i) for i in range(rng.randint(1, 6)))
            hotels.append(Hotel(
                id=f"{code}-{number}", name=name, city=city, rating=round(rng.uniform(2.5, 5.0), 1),
                price_per_night=rng.randrange(60, 300, 5), max_guests=rng.choice((1, 2, 2, 3, 4, 4, 6)),
                booked_out=frozenset(booked),
            ))
        catalogue[city] = hotels
    return catalogue


def parse_date(text: str) -> date:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text.strip()):
        raise ValueError(f"check_in must be a date written YYYY-MM-DD, got {text!r}")
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"check_in {text!r} is not a real date") from None


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call written the way the model should write it (Hermes/Qwen format)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class HotelEnv(ToolEnvironment):
    """Book the cheapest hotel in a city that meets a rating, a party size and free nights."""

    def __init__(self, num_tasks: int = 64, seed: int = 0, max_turns: int = 6, partial_credit: bool = True):
        for name, value in (("num_tasks", num_tasks), ("max_turns", max_turns)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if not isinstance(partial_credit, bool):
            raise ValueError(f"partial_credit must be true or false, got {partial_credit!r}")
        self.num_tasks, self.seed, self.partial_credit = num_tasks, seed, partial_credit
        self.max_turns = max_turns  # the engine's turn cap (the run config may lower it further)
        rng = random.Random(seed)  # never the global random state: a seed must mean one catalogue
        self.hotels = build_catalogue(rng)
        self.hotels_by_id = {h.id: h for city in self.hotels.values() for h in city}
        self.tasks = [self._make_task(rng, i) for i in range(num_tasks)]

    # ------------------------------------------------------------------------------------- tasks

    def _make_task(self, rng: random.Random, task_id: int) -> dict[str, Any]:
        # Draw until at least two hotels fit (so "cheapest" is a real choice) and the cheapest of
        # them is unique (so exactly one booking is right).
        for _ in range(10_000):
            city = rng.choice(list(CITIES.values()))
            min_rating, guests, nights = rng.choice(MIN_RATINGS), rng.randint(1, 4), rng.randint(1, 5)
            check_in = FIRST_NIGHT + timedelta(days=rng.randrange(WINDOW_NIGHTS - nights))
            fits = sorted(
                (h for h in self.hotels[city]
                 if h.rating >= min_rating and h.max_guests >= guests and h.is_free(check_in, nights)),
                key=lambda h: h.price_per_night,
            )
            if len(fits) >= 2 and fits[0].price_per_night < fits[1].price_per_night:
                break
        else:
            raise RuntimeError("could not draw a task with a unique answer; try another seed")
        missing = rng.choice(("guests", "nights")) if rng.random() < 0.25 else ""
        return {
            "task_id": task_id, "city": city, "min_rating": min_rating, "guests": guests,
            "check_in": check_in.isoformat(), "nights": nights, "missing": missing,
            "template": rng.randrange(len(REQUEST_TEMPLATES)), "answer_hotel_id": fits[0].id,
        }

    @staticmethod
    def request_text(task: dict[str, Any], template: int = 0, leave_out: str = "") -> str:
        party = "" if leave_out == "guests" else f" for {_plural(task['guests'], 'guest')}"
        stay = (f"checking in on {task['check_in']}" if leave_out == "nights"
                else f"{_plural(task['nights'], 'night')} from {task['check_in']}")
        rating = f"{task['min_rating']:g}"
        return REQUEST_TEMPLATES[template].format(city=task["city"], rating=rating, party=party, stay=stay)

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        # The tokenizer is there for environments that need token counts; this one does not.
        return [
            {"prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": self.request_text(task, task["template"], task["missing"])}],
             **task}
            for task in self.tasks
        ]

    # ------------------------------------------------------------------------------------- episode

    def reset(self, episode: Episode) -> None:
        episode.state.update(
            bookings=[], failed_bookings=[], searches=[], checks=[],
            known_tool_calls=0, questions=0, guest_replied=False,
        )

    def _hotel(self, hotel_id: str) -> Hotel:
        hotel = self.hotels_by_id.get(hotel_id.strip().upper())
        if hotel is None:
            raise ValueError(f"unknown hotel id {hotel_id!r}; ids look like 'LIS-3' and come from search_hotels")
        return hotel

    @staticmethod
    def _check_count(name: str, value: int, most: int) -> None:
        if not 1 <= value <= most:
            raise ValueError(f"{name} must be between 1 and {most}, got {value}")

    @tool
    def search_hotels(self, episode: Episode, city: str, min_rating: float = 0.0, guests: int = 1) -> list[dict]:
        """List the hotels in a city with at least a given rating that take a given number of guests.

        Availability is not checked here: use check_availability for that.

        Args:
            city: The city, e.g. "Lisbon".
            min_rating: The lowest acceptable rating, from 1.0 to 5.0.
            guests: How many guests will share the room.
        """
        canonical = {c.lower(): c for c in CITIES.values()}.get(city.strip().lower())
        if canonical is None:
            raise ValueError(f"unknown city {city!r}; known cities: {', '.join(CITIES.values())}")
        self._check_count("guests", guests, 20)
        episode.state["searches"].append({"city": canonical, "min_rating": min_rating, "guests": guests})
        return [h.listing() for h in self.hotels[canonical] if h.rating >= min_rating and h.max_guests >= guests]

    @tool
    def check_availability(self, episode: Episode, hotel_id: str, check_in: str, nights: int) -> dict:
        """Check whether a hotel is free for a stay, and what the stay would cost.

        Args:
            hotel_id: The hotel's id from search_hotels, e.g. "LIS-3".
            check_in: The first night, written YYYY-MM-DD.
            nights: How many nights.
        """
        hotel, first = self._hotel(hotel_id), parse_date(check_in)
        self._check_count("nights", nights, 30)
        episode.state["checks"].append({"hotel_id": hotel.id, "check_in": first.isoformat(), "nights": nights})
        return {"hotel_id": hotel.id, "available": hotel.is_free(first, nights),
                "total_price": hotel.price_per_night * nights}

    @tool
    def book_hotel(self, episode: Episode, hotel_id: str, check_in: str, nights: int, guests: int) -> dict:
        """Book a stay. The booking is final, so check the request and availability first.

        Args:
            hotel_id: The hotel's id from search_hotels, e.g. "LIS-3".
            check_in: The first night, written YYYY-MM-DD.
            nights: How many nights.
            guests: How many guests will share the room.
        """
        attempt = {"hotel_id": hotel_id, "check_in": check_in, "nights": nights, "guests": guests}
        try:
            hotel, first = self._hotel(hotel_id), parse_date(check_in)
            self._check_count("nights", nights, 30)
            self._check_count("guests", guests, 20)
            if guests > hotel.max_guests:
                raise ValueError(f"{hotel.id} takes at most {_plural(hotel.max_guests, 'guest')}; nothing was booked")
            if not hotel.is_free(first, nights):
                raise ValueError(f"{hotel.id} is booked out on some of those nights; nothing was booked")
        except ValueError:
            episode.state["failed_bookings"].append(attempt)
            raise
        booking = {"confirmation": f"{hotel.id}-{first:%Y%m%d}-{nights}N-{guests}G", "hotel_id": hotel.id,
                   "hotel_name": hotel.name, "check_in": first.isoformat(), "nights": nights, "guests": guests,
                   "total_price": hotel.price_per_night * nights}
        episode.state["bookings"].append(booking)
        return booking

    # The tool calls of one turn run one after another, in the order the model wrote them (each in a
    # worker thread, so other episodes go on meanwhile): a check before a booking sees the world as the
    # model expects. Episodes, not calls, run concurrently.
    async def step(self, episode: Episode, completion: str):
        episode.state["known_tool_calls"] += sum(call["name"] in self.tool_specs for call in episode.tool_calls)
        bookings_before = len(episode.state["bookings"])
        reply = await super().step(episode, completion)  # runs the tool calls (or no_tool_call)
        if len(episode.state["bookings"]) > bookings_before:
            return None  # the guest has a booking: the episode is over
        return reply

    def no_tool_call(self, episode: Episode, completion: str):
        """The simulated guest answers the first question; any other turn without a tool call ends it."""
        if "?" not in completion:
            return None
        episode.state["questions"] += 1
        if episode.state["guest_replied"]:
            return None
        episode.state["guest_replied"] = True
        return self.guest_reply(episode.row)

    def guest_reply(self, row: dict[str, Any]) -> str:
        if row["missing"] == "guests":
            return f"Sorry, it's for {_plural(row['guests'], 'guest')}."
        if row["missing"] == "nights":
            return f"Sorry, {_plural(row['nights'], 'night')}, please."
        return "Everything is in my request: " + self.request_text(row)

    # ------------------------------------------------------------------------------------- scoring

    def _meets_request(self, booking: dict[str, Any], row: dict[str, Any]) -> bool:
        hotel = self.hotels_by_id[booking["hotel_id"]]
        return (hotel.city == row["city"] and hotel.rating >= row["min_rating"]
                and (booking["check_in"], booking["nights"], booking["guests"])
                == (row["check_in"], row["nights"], row["guests"]))

    def score_episode(self, episode: Episode) -> float:
        row, state = episode.row, episode.state
        bookings = state["bookings"]  # only successful ones: the hotel was free and took the party
        fitting = [b for b in bookings if self._meets_request(b, row)]
        correct = any(b["hotel_id"] == row["answer_hotel_id"] for b in fitting)
        searched_city = any(s["city"] == row["city"] for s in state["searches"])
        checked_answer = any(c["hotel_id"] == row["answer_hotel_id"] for c in state["checks"])
        episode.metrics.update(
            booked=float(bool(bookings)), correct_booking=float(correct), bookings=len(bookings),
            failed_bookings=len(state["failed_bookings"]), searches=len(state["searches"]),
            availability_checks=len(state["checks"]), questions=state["questions"],
        )
        if not self.partial_credit:
            return 1.0 if correct and len(bookings) == 1 else 0.0
        if correct:
            score = 1.0
        elif fitting:
            score = 0.6
        else:
            score = 0.1 * (state["known_tool_calls"] > 0) + 0.1 * searched_city + 0.2 * checked_answer
        return round(max(0.0, score - 0.3 * max(0, len(bookings) - 1)), 4)

    # ------------------------------------------------------------------------------------- oracle

    def solve(self, episode: Episode) -> str:
        """An expert's next message: ask for a missing detail, search, check the answer, book it."""
        row, state = episode.row, episode.state
        if row["missing"] and not state["guest_replied"]:
            return QUESTIONS[row["missing"]]
        if not any(s["city"] == row["city"] for s in state["searches"]):
            search = {"city": row["city"], "min_rating": row["min_rating"], "guests": row["guests"]}
            return tool_call_text("search_hotels", search)
        stay = {"hotel_id": row["answer_hotel_id"], "check_in": row["check_in"], "nights": row["nights"]}
        if not any(c == stay for c in state["checks"]):
            return tool_call_text("check_availability", stay)
        return tool_call_text("book_hotel", {**stay, "guests": row["guests"]})
