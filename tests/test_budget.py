"""The output budget: what fits is kept, what does not is named with how to get it."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from kernmind.budget import Budget, gap, left_out, listed_size, next_page, shown_lines
from kernmind.config import Settings
from kernmind.execution.kernels.setup import setup_code


def test_take_keeps_what_fits_and_says_what_was_cut() -> None:
    budget = Budget(10)
    assert budget.take("abcd", more="-") == ("abcd", None)
    kept, note = budget.take("0123456789", more="read on with offset=6.")
    assert kept == "012345" and budget.left == 0
    assert (
        note
        == "4 of 10 characters left out to stay within the output budget (10 characters); read on with offset=6."
    )
    assert budget.take("x", more="-") == (
        "",
        "1 of 1 characters left out to stay within the output budget (10 characters); -",
    )


def test_admit_counts_whole_items_and_always_lets_the_first_in() -> None:
    budget = Budget(100)
    budget.spend(30)
    assert budget.admit(60) and budget.left == 10
    assert not budget.admit(11) and budget.left == 10
    assert Budget(5).admit(50, first=True)


def test_a_budget_comes_from_the_settings() -> None:
    assert Budget.of(Settings(max_output_chars=12_345)).chars == 12_345


@pytest.mark.parametrize(
    ("page", "per_page", "shown"), [(0, 10, 3), (2, 10, 3), (1, 100, 1), (0, 100, 7), (3, 8, 6), (0, 5, 5)]
)
def test_next_page_starts_exactly_at_the_first_result_not_shown(page: int, per_page: int, shown: int) -> None:
    size, nxt = next_page(page, per_page, shown)
    assert 1 <= size <= max(shown, 1)
    assert nxt * size == page * per_page + shown


def test_listed_size_is_what_the_sdk_writes_for_an_item_of_a_list() -> None:
    import pydantic_core

    class Item(BaseModel):
        id: int
        text: str
        tags: list[str]

    class Answer(BaseModel):
        results: list[Item]

    one, two = Item(id=1, text="a" * 40, tags=["x", "y"]), Item(id=2, text="b", tags=[])
    written = len(pydantic_core.to_json(Answer(results=[one, two]), indent=2))
    empty = len(pydantic_core.to_json(Answer(results=[]), indent=2))
    assert abs(written - empty - listed_size(one) - listed_size(two)) <= 8  # the list's own brackets


def test_left_out_names_count_budget_and_way() -> None:
    assert left_out(3, "passages", Budget(5000), "use page=2") == (
        "3 more passages left out to stay within the output budget (5,000 characters); use page=2"
    )


def test_take_can_keep_the_end_or_both_ends_around_a_marker() -> None:
    text = "".join(f"{i:03}" for i in range(300))  # 900 characters
    tail, note = Budget(30).take(text, more="see the head.", keep="tail")
    assert tail == text[-30:] and note is not None and note.startswith("870 of 900 characters left out")
    ends, note = Budget(200).take(text, more="-", keep="ends")
    assert len(ends) <= 200 and ends.startswith("000001") and ends.endswith("298299")
    assert "text truncated" in ends and note is not None
    dropped = int(ends.split("truncated: ")[1].split(" ")[0])
    assert 900 - dropped == len(ends) - len(gap(dropped, "text"))  # the count is what was really cut
    assert Budget(200).take("short", more="-", keep="ends") == ("short", None)
    tiny, _ = Budget(10).take(text, more="-", keep="ends")  # no room for a marker: the start
    assert tiny == text[:10]


def test_lines_keeps_whole_lines_while_they_fit() -> None:
    budget = Budget(20)
    assert budget.lines(["12345", "12345", "12345", "12345"]) == 3 and budget.left == 2
    assert Budget(20).lines(["x" * 30, "y"]) == 0  # the first alone does not fit: cut it with take
    assert Budget(100).lines(["a", "b"]) == 2


def test_the_notes_name_what_was_shown_and_how_to_get_the_rest() -> None:
    assert shown_lines(1, 40, 900, Budget(5000), "read on with view_range=[41, -1].") == (
        "Lines 1-40 of 900 shown to stay within the output budget (5,000 characters); "
        "read on with view_range=[41, -1]."
    )
    assert gap(12) == "\n… [output truncated: 12 characters dropped] …\n"


def test_the_kernels_output_cap_is_sized_by_the_answers_budget() -> None:
    """The kernel sends twice the budget as printed, then holds a tail at least as long as the
    collector keeps (so the tail a job shows is the real end of its output) and sends it once a
    second; the setup cell every kernel runs carries exactly those sizes."""
    cap = Budget(50_000).kernel_cap()
    assert (cap.head, cap.tail, cap.interval) == (100_000, 12_500, 1.0)
    assert cap.tail >= Budget(50_000).head_and_tail()[1]
    small = Budget(1001).kernel_cap()
    assert small.head == 2002 and small.tail == 1000 >= Budget(1001).head_and_tail()[1]
    # and past the answer's head (2,250 of 3,000) the whole output is also kept in a file
    assert "_kernmind_cap_output(6000, 1000, 1.0, 2250)" in setup_code(Budget(3000))
    assert "_kernmind_cap_output(6000, 1000, 1.0, 0)" in setup_code(Budget(3000), keep_output=False)
