"""Synthetic conversations for the tiny model: its tokenizer's corpus and its warm-up data.

Chats about booking hotels (English words, cities, dates, numbers) with and without OpenAI-style tool
calls against `HOTEL_TOOLS`. `synthetic_conversation` draws words uniformly (the tokenizer's corpus);
`warmup_conversation` redraws the assistant's prose with Zipf's law, as real text has it, and keeps
half of the tool-calling conversations (tiny.py explains why both matter).

Left out: any meaning (answers are word salad) and any language but English.
"""

from __future__ import annotations

import itertools
import json
import random

# Share of tool-calling conversations the warm-up keeps (see `warmup_conversation`).
WARMUP_TOOL_CALL_KEEP = 0.5

_WORDS = """
the a an and or but so if then when while because of to in on at by for with from about into over
after before under between through during without again once here there all any both each few more
most other some such no not only own same than too very can will just should now is are was were be
been being have has had do does did say said make made go went take took see saw come came know
knew get got give gave find found think thought tell told ask asked work worked seem feel try leave
call called keep let begin help show hear play run move live believe bring happen write sit stand
lose pay meet include continue set learn change lead understand watch follow stop create speak read
allow add spend grow open walk win offer remember love consider appear buy wait serve die send
expect build stay fall cut reach kill remain suggest raise pass sell require report decide pull
time year people way day man woman child world life hand part place case week company system
program question government number night point home water room mother area money story fact month
lot right study book eye job word business issue side kind head house service friend father power
hour game line end member law car city community name president team minute idea kid body
information back parent face others level office door health person art war history party result
morning reason research girl guy moment air teacher force education good new first last long great
little old big high different small large next early young important public bad able happy quiet
simple clear warm cold bright dark quick slow easy hard sure free full real best better certain
banana apple orange garden river mountain ocean table window paper music picture animal flower
""".split()

_CITIES = """Paris London Berlin Madrid Rome Lisbon Vienna Prague Oslo Tokyo Kyoto Seoul Sydney Toronto
Chicago Boston Denver Austin Seattle Dublin Athens Cairo Nairobi Lima Bogota Havana Istanbul
Amsterdam Barcelona Florence""".split()

_HOTEL_WORDS = """Grand Plaza Royal Park Harbor Garden Central Palace Riverside Sunset Ocean Alpine Maple
Crown Lakeside Metro Golden Silver Corner Station Old Town""".split()
_HOTEL_KINDS = ["Hotel", "Inn", "Suites", "Lodge", "Resort", "House"]

_DOMAIN_WORDS = """hotel room rooms booking book booked reservation guest guests night nights check
available availability price prices total budget breakfast suite double single city date dates
confirm confirmed confirmation cancel search results stay arrival departure rating stars cheap
nearby airport""".split()


def _function_schema(name: str, description: str, optional=(), **params: tuple[str, str]) -> dict:
    properties = {key: {"type": kind, "description": text} for key, (kind, text) in params.items()}
    required = [key for key in params if key not in optional]
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_DATE = "YYYY-MM-DD."
HOTEL_TOOLS = [
    _function_schema("search_hotels", "Find hotels in a city.", optional=("max_price",),
                     city=("string", "City name."), max_price=("integer", "Highest price per night.")),
    _function_schema("check_availability", "Check free rooms for a stay.", hotel_id=("string", "Hotel id."),
                     check_in=("string", f"Arrival date, {_DATE}"),
                     check_out=("string", f"Departure date, {_DATE}")),
    _function_schema("book_hotel", "Book a room for a guest.", hotel_id=("string", "Hotel id."),
                     guest_name=("string", "Full name of the guest."),
                     check_in=("string", f"Arrival date, {_DATE}"), nights=("integer", "Number of nights.")),
]

_SYSTEM_PROMPTS = ["You are a helpful assistant.", "Answer briefly.", "You are a friendly travel agent.",
                   "You are a hotel booking assistant. Use the tools to help the guest."]

_NAMES = "Ada Ben Chen Dana Eli Fatima Gus Hana Ivan Jo Kai Lena Maya Noor Omar Pia Raj Sara Tom Uma".split()


def _date(rng: random.Random) -> str:
    return f"{rng.choice([2025, 2026, 2027])}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _hotel(rng: random.Random) -> str:
    return f"{rng.choice(_HOTEL_WORDS)} {rng.choice(_HOTEL_KINDS)}"


def _words(rng: random.Random, low: int, high: int) -> str:
    pool = _WORDS if rng.random() < 0.7 else _WORDS + _DOMAIN_WORDS + _CITIES
    # Skewed towards short answers: the model learns a higher chance of ending at every word, so
    # sampled turns nearly always close within a small token budget.
    count = low + int((high - low + 1) * rng.random() ** 2)
    words = [rng.choice(pool) for _ in range(count)]
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 500)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "!", "?"])


def _user_message(rng: random.Random) -> str:
    city, date = rng.choice(_CITIES), _date(rng)
    templates = [
        f"Find a hotel in {city} for {date}.",
        f"I need a room in {city} from {date} for {rng.randint(1, 9)} nights.",
        f"Book the {_hotel(rng)} for {rng.choice(_NAMES)} on {date}.",
        f"Is the {_hotel(rng)} in {city} available on {date}?",
        f"Guess my number between 1 and {rng.choice([10, 50, 100])}.",
        f"Tell me about {rng.choice(_WORDS + _CITIES)}.",
        f"What is {rng.randint(0, 99)} plus {rng.randint(0, 99)}?",
        "Hello, who are you?",
        _words(rng, 3, 14),
    ]
    return rng.choice(templates)


def _tool_call(rng: random.Random, tools: list[dict]) -> dict:
    name = rng.choice(tools)["function"]["name"]
    hotel_id = f"h{rng.randint(1, 999)}"
    if name == "search_hotels":
        args = {"city": rng.choice(_CITIES)}
        if rng.random() < 0.5:
            args["max_price"] = rng.randint(50, 400)
    elif name == "check_availability":
        args = {"hotel_id": hotel_id, "check_in": _date(rng), "check_out": _date(rng)}
    else:
        args = {"hotel_id": hotel_id, "guest_name": rng.choice(_NAMES), "check_in": _date(rng),
                "nights": rng.randint(1, 9)}
    # Both spellings of arguments occur in the wild; the template must render either.
    arguments = json.dumps(args) if rng.random() < 0.3 else args
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(rng: random.Random, call: dict) -> str:
    name = call["function"]["name"]
    if name == "search_hotels":
        hotels = [{"id": f"h{rng.randint(1, 999)}", "name": _hotel(rng), "price": rng.randint(40, 500),
                   "rating": rng.randint(1, 5)} for _ in range(rng.randint(1, 3))]
        return json.dumps({"results": hotels})
    if name == "check_availability":
        return json.dumps({"available": rng.random() < 0.6, "rooms": rng.randint(0, 12)})
    return json.dumps({"confirmation": f"C{rng.randint(10000, 99999)}", "total": rng.randint(80, 3000)})


def synthetic_conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    """One random conversation and the tools it was rendered with (None for a plain chat)."""
    # A random subset of the tools keeps the system block short and varied.
    tools = [t for t in HOTEL_TOOLS if rng.random() < 0.6] or [rng.choice(HOTEL_TOOLS)]
    use_tools = rng.random() < 0.3
    messages: list[dict] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(_SYSTEM_PROMPTS)})
    for _ in range(rng.choice([1, 1, 1, 2])):
        messages.append({"role": "user", "content": _user_message(rng)})
        if use_tools and rng.random() < 0.7:
            calls = [_tool_call(rng, tools) for _ in range(rng.choice([1, 1, 1, 2]))]
            content = _words(rng, 2, 6) if rng.random() < 0.2 else ""
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            messages.extend({"role": "tool", "content": _tool_result(rng, c)} for c in calls)
        messages.append({"role": "assistant", "content": _words(rng, 3, 30)})
    return messages, (tools if use_tools else None)


# Warm-up prose draws words with Zipf's law over _WORDS, which starts with the most common English
# words, instead of uniformly: like real text, " a", " an", " and" are frequent. The tokenizer's
# corpus keeps uniform words, so the vocabulary does not depend on this.
_ZIPF_CUMULATIVE = list(itertools.accumulate(1.0 / rank for rank in range(1, len(_WORDS) + 1)))


def _zipf_words(rng: random.Random, low: int, high: int) -> str:
    count = low + int((high - low + 1) * rng.random() ** 2)
    words = rng.choices(_WORDS, cum_weights=_ZIPF_CUMULATIVE, k=count)
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 500)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "!", "?"])


def warmup_conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    """A synthetic conversation as the warm-up sees it, with Zipf-weighted prose.

    A conversation with tool calls renders to ~400 tokens (the tools block alone ~280), a plain one to
    ~50, so tool JSON would fill most of the warm-up; keeping only half of the tool-calling ones leaves
    the model's plain answers less drawn to JSON keys like "name", while the 512-token windows show a
    call together with the tools block that licenses it."""
    while True:
        messages, tools = synthetic_conversation(rng)
        calls_tools = any(m.get("tool_calls") for m in messages)
        if not calls_tools or rng.random() < WARMUP_TOOL_CALL_KEEP:
            break
    for m in messages:
        if m["role"] == "assistant" and m.get("content"):
            m["content"] = _zipf_words(rng, 2, 6) if m.get("tool_calls") else _zipf_words(rng, 3, 30)
    return messages, tools
