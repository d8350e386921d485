"""The hotel example environment, played at the text level with scripted policies and its oracle."""

from __future__ import annotations

import statistics

import datasets
import pytest

from aitrain_grpo.env.base import Episode
from aitrain_grpo.engine.runner import play
from envs.hotel import HotelEnv, tool_call_text


@pytest.fixture(scope="module")
def env() -> HotelEnv:
    return HotelEnv(num_tasks=64, seed=0)


@pytest.fixture(scope="module")
def rows(env) -> list[dict]:
    return env.build_dataset(None)


def scripted(*turns: str):
    """A policy that says `turns` in order, then nothing."""
    return lambda episode: turns[episode.turns] if episode.turns < len(turns) else ""


def call(name: str, **arguments) -> str:
    return tool_call_text(name, arguments)


def book(row: dict, hotel_id: str | None = None) -> str:
    return call("book_hotel", hotel_id=hotel_id or row["answer_hotel_id"], check_in=row["check_in"],
                nights=row["nights"], guests=row["guests"])


def fitting_hotels(env: HotelEnv, row: dict) -> list[tuple[int, str]]:
    """(total price, id) of every hotel that meets the row's request, found through the tools."""
    episode = Episode(row=row, messages=[])
    env.reset(episode)
    found = env.search_hotels(episode, city=row["city"], min_rating=row["min_rating"], guests=row["guests"])
    checks = [env.check_availability(episode, h["id"], row["check_in"], row["nights"]) for h in found]
    return sorted((c["total_price"], c["hotel_id"]) for c in checks if c["available"])


def user_request(row: dict) -> str:
    return row["prompt"][-1]["content"]


def test_same_seed_gives_same_tasks_and_another_seed_different_ones(rows):
    assert HotelEnv(seed=0).build_dataset(None) == rows
    assert HotelEnv(seed=1).build_dataset(None) != rows
    assert len(rows) == 64 and len(HotelEnv(num_tasks=5).build_dataset(None)) == 5


def test_every_task_has_exactly_one_cheapest_fitting_hotel(env, rows):
    for row in rows:
        fits = fitting_hotels(env, row)
        assert len(fits) >= 2, row  # "cheapest" is a real choice
        assert fits[0][0] < fits[1][0], row
        assert fits[0][1] == row["answer_hotel_id"]
        assert row["city"] in user_request(row) and row["check_in"] in user_request(row)


def test_some_tasks_leave_out_a_detail_for_the_model_to_ask(rows):
    missing = [row for row in rows if row["missing"]]
    assert 0 < len(missing) < len(rows) // 2
    for row in missing:
        text = user_request(row)
        if row["missing"] == "guests":
            assert "guest" not in text
        else:
            assert "night" not in text


def test_oracle_books_the_right_hotel_on_every_task(env, rows):
    episodes = play(env, rows, env.solve)
    assert statistics.mean(ep.score for ep in episodes) == 1.0
    for ep in episodes:
        assert ep.error is None and not ep.truncated
        assert ep.turns == (4 if ep.row["missing"] else 3)  # (ask,) search, check, book
        assert ep.metrics["correct_booking"] == 1.0 and ep.metrics["bookings"] == 1
        assert ep.num_tool_errors == 0


def test_empty_model_scores_zero_within_two_turns(env, rows):
    episodes = play(env, rows, lambda episode: "")
    assert all(ep.score == 0.0 and ep.turns <= 2 and ep.error is None for ep in episodes)


def test_a_fitting_but_pricier_booking_earns_less_than_the_right_one(env, rows):
    row = rows[0]
    pricier = fitting_hotels(env, row)[1][1]
    search = call("search_hotels", city=row["city"], min_rating=row["min_rating"], guests=row["guests"])
    wrong = play(env, [row], scripted(search, book(row, pricier)))[0]
    right = play(env, [row], scripted(search, book(row)))[0]
    assert 0.0 < wrong.score < right.score == 1.0
    assert wrong.metrics["booked"] == 1.0 and wrong.metrics["correct_booking"] == 0.0
    # Searching and checking without booking is worth less again, but more than nothing.
    check = call("check_availability", hotel_id=row["answer_hotel_id"], check_in=row["check_in"], nights=row["nights"])
    looked = play(env, [row], scripted(search, check))[0]
    assert 0.0 < looked.score < wrong.score
    # A booking for the wrong dates does not count as meeting the request.
    other_day = dict(row, check_in="2027-03-01")
    misdated = play(env, [row], scripted(search, book(other_day)))[0]
    assert misdated.metrics["booked"] == 1.0 and misdated.score < wrong.score


def test_booking_twice_costs(env, rows):
    row = rows[1]
    once = play(env, [row], scripted(book(row)))[0]
    twice = play(env, [row], scripted(book(row) + "\n" + book(row)))[0]
    assert once.score == 1.0
    assert twice.metrics["bookings"] == 2 and twice.score < once.score
    strict = HotelEnv(seed=0, partial_credit=False)
    assert play(strict, [row], scripted(book(row) + book(row)))[0].score == 0.0


def test_refused_bookings_are_errors_and_the_episode_goes_on(env, rows):
    def refused(row: dict) -> tuple[str, str] | None:
        """A hotel in the row's city that is too small, and one that is booked out, for its stay."""
        hotels = env.hotels[row["city"]]
        small = [h.id for h in hotels if h.max_guests < row["guests"]]
        taken = [h.id for h in hotels if h.max_guests >= row["guests"]
                 and h.id not in {i for _, i in fitting_hotels(env, row)} and h.rating >= row["min_rating"]]
        return (small[0], taken[0]) if small and taken else None

    row, (small, taken) = next((row, pair) for row in rows if (pair := refused(row)))
    episode = play(env, [row], scripted(book(row, small) + book(row, taken), book(row)))[0]
    refusals = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert len(refusals) == 2 and all(r.startswith("Error") and "nothing was booked" in r for r in refusals)
    assert "at most" in refusals[0] and "booked out" in refusals[1]
    assert episode.metrics["failed_bookings"] == 2 and episode.num_tool_errors == 2
    assert episode.score == 1.0 and episode.turns == 2


def test_guest_answers_one_question_and_a_second_silent_turn_ends(env, rows):
    row = next(r for r in rows if r["missing"] == "guests")
    episode = play(env, [row], scripted("How many guests?", "Anything else?"))[0]
    assert episode.turns == 2 and episode.done and not episode.truncated
    replies = [m for m in episode.messages if m["role"] == "user"][1:]  # after the request itself
    assert len(replies) == 1 and str(row["guests"]) in replies[0]["content"]
    # Without a question the guest stays silent and the turn ends the episode.
    assert play(env, [row], scripted("I will book it."))[0].turns == 1
    # Asking when nothing is missing gets the request restated.
    full = next(r for r in rows if not r["missing"])
    restated = play(env, [full], scripted("Which city?"))[0]
    assert full["city"] in restated.messages[-2]["content"] and restated.messages[-2]["role"] == "user"


def test_tool_errors_come_back_as_messages(env, rows):
    row = rows[0]
    bad_turn = "\n".join([
        call("cancel_booking", hotel_id="LIS-1"),
        '<tool_call>{"name": "book_hotel", "arguments": {"hotel_id": </tool_call>',
        call("search_hotels", city=row["city"], guests="two"),
        call("search_hotels", city="Atlantis"),
        call("check_availability", hotel_id=row["answer_hotel_id"], check_in="4 Dec", nights=2),
        call("check_availability", hotel_id="NOPE-9", check_in=row["check_in"], nights=2),
    ])
    episode = play(env, [row], scripted(bad_turn))[0]
    replies = [m for m in episode.messages if m["role"] == "tool"]
    assert len(replies) == 6 and all(m["content"].startswith("Error") for m in replies)
    assert episode.num_tool_errors == 6 and episode.error is None
    text = "\n".join(m["content"] for m in replies)
    assert "Lisbon" in text and "YYYY-MM-DD" in text and "NOPE-9" in text
    assert episode.score == pytest.approx(0.1)  # a known tool was named, nothing else went right


def test_turn_cap_ends_a_model_that_never_books(rows):
    env = HotelEnv(max_turns=3)
    row = rows[0]
    episode = play(env, [row], lambda ep: call("search_hotels", city=row["city"]))[0]
    assert episode.turns == 3 and episode.truncated
    assert episode.score == pytest.approx(0.2)


def test_tool_schemas_describe_the_three_tools(env):
    schemas = {s["function"]["name"]: s["function"] for s in env.tools}
    assert set(schemas) == {"search_hotels", "check_availability", "book_hotel"}
    expected = {
        "search_hotels": ({"city", "min_rating", "guests"}, {"city"}),
        "check_availability": ({"hotel_id", "check_in", "nights"}, {"hotel_id", "check_in", "nights"}),
        "book_hotel": ({"hotel_id", "check_in", "nights", "guests"}, {"hotel_id", "check_in", "nights", "guests"}),
    }
    for name, (params, required) in expected.items():
        schema = schemas[name]
        assert schema["description"]
        assert set(schema["parameters"]["properties"]) == params  # `episode` stays hidden
        assert set(schema["parameters"]["required"]) == required
        assert all(p.get("description") and p.get("type") for p in schema["parameters"]["properties"].values())
    assert schemas["search_hotels"]["parameters"]["properties"]["min_rating"]["type"] == "number"


def test_rows_survive_a_datasets_round_trip(rows):
    dataset = datasets.Dataset.from_list(rows)
    assert dataset.to_list() == rows


def test_without_partial_credit_scores_are_zero_or_one(rows):
    strict = HotelEnv(seed=0, partial_credit=False)
    pricier = {row["task_id"]: fitting_hotels(strict, row)[1][1] for row in rows[:8]}

    def search_then_book_pricier(ep: Episode) -> str:
        if ep.turns == 0:
            return call("search_hotels", city=ep.row["city"])
        return book(ep.row, pricier[ep.row["task_id"]])

    policies = [strict.solve, lambda ep: "", search_then_book_pricier]
    scores = [ep.score for policy in policies for ep in play(strict, rows[:8], policy)]
    assert set(scores) == {0.0, 1.0}
    assert all(s == 1.0 for s in scores[:8]) and all(s == 0.0 for s in scores[8:])


@pytest.mark.parametrize("kwargs", [
    {"num_tasks": 0}, {"max_turns": 0}, {"num_tasks": "64"}, {"seed": 1.5}, {"partial_credit": "yes"},
])
def test_bad_constructor_arguments_raise(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        HotelEnv(**kwargs)
