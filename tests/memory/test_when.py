"""when.py: the times a query names, read the way a person means them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kernmind.memory.when import TimeRef, affinity, time_in

pytestmark = pytest.mark.sqlite_only("pure functions: no database involved")

NOW = datetime(2024, 3, 20, 12, tzinfo=UTC).timestamp()  # a Wednesday


def day(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("query", "start", "end", "relation"),
    [
        ("How far was Leo running in May 2023?", "2023-05-01", "2023-06-01", "during"),
        ("what happened on 8 May 2023", "2023-05-08", "2023-05-09", "during"),
        ("the May 8th, 2023 meeting", "2023-05-08", "2023-05-09", "during"),
        ("notes from 2023-05-08", "2023-05-08", "2023-05-09", "during"),
        ("anything from 2023-05?", "2023-05-01", "2023-06-01", "during"),
        ("plans for early June 2023", "2023-06-01", "2023-06-11", "during"),
        ("what did we do in 2022", "2022-01-01", "2023-01-01", "during"),
        ("what did we do in May", "2023-05-01", "2023-06-01", "during"),  # the latest May before now
        ("what did we do in March", "2024-03-01", "2024-04-01", "during"),
        ("what did I say yesterday", "2024-03-19", "2024-03-20", "during"),
        ("what did we discuss last week", "2024-03-11", "2024-03-18", "during"),
        ("this week's plans", "2024-03-18", "2024-03-25", "during"),
        ("bills from last month", "2024-02-01", "2024-03-01", "during"),
        ("who called before June 2023", "2023-06-01", "2023-07-01", "before"),
        ("what changed after May 2023", "2023-05-01", "2023-06-01", "after"),
    ],
)
def test_named_times(query: str, start: str, end: str, relation: str) -> None:
    ref = time_in(query, NOW)
    assert ref is not None and (ref.start, ref.end, ref.relation) == (day(start), day(end), relation)


def test_since_means_from_then_on() -> None:
    ref = time_in("what has Anna done since 2022?", NOW)
    assert ref is not None and ref.window == (day("2022-01-01"), None)


def test_an_event_is_returned_for_the_caller_to_find() -> None:
    ref = time_in("What did Omar say about Dublin before the move?", NOW)
    assert ref is not None and ref.anchor == "the move" and ref.relation == "before"
    placed = ref.around(day("2023-04-09"), day("2023-04-10"))
    assert placed.window == (None, day("2023-04-09"))
    after = time_in("what did she do after her sister's wedding?", NOW)
    assert after is not None and after.anchor == "her sister's wedding" and after.relation == "after"


@pytest.mark.parametrize(
    "query", ["When did Maya adopt Biscuit?", "may I ask about the cat", "Room 2023 keys"]
)
def test_no_time_named(query: str) -> None:
    assert time_in(query, NOW) is None


def test_affinity_is_1_inside_and_falls_off_outside() -> None:
    ref = TimeRef(day("2023-05-01"), day("2023-06-01"))
    inside, near, far = affinity([day("2023-05-15"), day("2023-06-10"), day("2024-06-01")], ref)
    assert inside == 1.0 and 0.5 < near < 1.0 and far < 0.2
    before = TimeRef(day("2023-05-01"), day("2023-05-02"), "before")
    assert affinity([day("2023-01-01"), day("2023-08-01")], before)[0] == 1.0
    assert affinity([day("2023-01-01"), day("2023-08-01")], before)[1] < 0.5
