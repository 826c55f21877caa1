"""One output budget: what a tool returns fits in the caller's context, and says how to get the rest.

Design: a ``Budget`` is made per answer and spent as it is built; what is left out gets a note in one
wording. Sizes are characters the model reads. Error policy: nothing raises; a budget too small for
one item still admits the first, so an answer is never empty because of the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from pydantic import BaseModel

DEFAULT_OUTPUT_CHARS = 50_000  # --max-output-chars' default


class BudgetSettings(Protocol):
    max_output_chars: int


class KernelCap(NamedTuple):
    """How a kernel caps one cell's printed output before it reaches the server."""

    head: int  # characters sent as they are printed
    tail: int  # past the head, the latest characters held, sent ``interval`` seconds apart at most
    interval: float  # and when the cell ends (with how much was dropped before them)


@dataclass
class Budget:
    """Characters an answer may still hold."""

    chars: int
    used: int = 0

    @classmethod
    def of(cls, settings: BudgetSettings) -> Budget:
        """The budget of one answer under ``settings`` (``--max-output-chars``)."""
        return cls(settings.max_output_chars)

    def head_and_tail(self) -> tuple[int, int]:
        """A stream's share of this budget (``OutputCollector``): a head kept whole, three quarters,
        then the latest output, the rest."""
        head = self.chars * 3 // 4
        return head, self.chars - head

    def kernel_cap(self) -> KernelCap:
        """The cap a kernel puts on a cell's output for answers of this budget
        (``execution/kernels/setup.py``). Its head is twice the budget, so what the server keeps
        of the start and the end arrives as printed; past it the kernel holds a tail at least as
        long as the answer's, and sends it once a second: a running background job's output
        shows its latest lines, and the server reads that much per second, not what was printed."""
        return KernelCap(head=2 * self.chars, tail=max(1000, self.head_and_tail()[1]), interval=1.0)

    def keep_after(self) -> int:
        """Printed characters past which a call's whole output is also kept in a file (the
        answer's head: what comes after it may be cut)."""
        return self.head_and_tail()[0]

    @property
    def left(self) -> int:
        return max(self.chars - self.used, 0)

    def spend(self, size: int) -> None:
        """Count ``size`` characters the answer holds anyway (its envelope, its fields)."""
        self.used += size

    def admit(self, size: int, *, first: bool = False) -> bool:
        """Whether an item of ``size`` characters still fits; counted when it does. ``first``:
        the answer has nothing yet, so the item is admitted whatever its size (cut it with
        :meth:`take` if it is text)."""
        if size <= self.left or first:
            self.used += size
            return True
        return False

    def take(
        self, text: str, *, more: str, keep: Literal["head", "tail", "ends"] = "head"
    ) -> tuple[str, str | None]:
        """As much of ``text`` as fits, and ``None`` or a note on what was cut and how to get
        it (``more``: e.g. ``"read the rest with view_range=[41, -1]"``). ``keep`` says which
        part stays: the start, the end, or both ends with a :func:`gap` marker between them."""
        if len(text) <= self.left:
            self.used += len(text)
            return text, None
        room = shown = self.left
        if keep == "head":
            kept = text[:room]
        elif keep == "tail":
            kept = text[len(text) - room :]
        else:  # the marker counts too: the two ends share what is left beside it
            shown = max(room - len(gap(len(text), "text")), 0)
            head = shown // 2
            kept = text[:head] + gap(len(text) - shown, "text") + text[len(text) - (shown - head) :]
            if len(kept) > room:  # too little room for a marker: the start only
                kept, shown = text[:room], room
        self.used += len(kept)
        return kept, self.note(len(text) - shown, len(text), more)

    def lines(self, lines: Sequence[str]) -> int:
        """How many of ``lines``, from the first, fit whole (each counts its newline); counted.
        0 when not even the first fits: cut that one with :meth:`take`."""
        count = 0
        for line in lines:
            if not self.admit(len(line) + 1):
                break
            count += 1
        return count

    def note(self, cut: int, whole: int, more: str) -> str:
        """``cut`` of ``whole`` characters left out, and ``more``: how to get them."""
        return (
            f"{cut:,} of {whole:,} characters left out to stay within the output budget "
            f"({self.chars:,} characters); {more}"
        )


def listed_size(item: BaseModel) -> int:
    """Characters ``item`` takes as a member of a list in a tool's text answer (the SDK writes
    a structured result as JSON indented by two: a list's members sit four spaces deep)."""
    text = item.model_dump_json(indent=2)
    return len(text) + 4 * (text.count("\n") + 1) + 2


def left_out(count: int, what: str, budget: Budget, how: str) -> str:
    """``3 more passages left out to stay within the output budget (…); <how>``."""
    return (
        f"{count} more {what} left out to stay within the output budget ({budget.chars:,} characters); {how}"
    )


def next_page(page: int, per_page: int, shown: int) -> tuple[int, int]:
    """The ``(per_page, page)`` to ask for next when only ``shown`` of ``page``'s ``per_page``
    results fit: a page size no larger than ``shown`` whose pages start exactly at the first
    result not shown, so nothing is skipped or repeated."""
    start = page * per_page + shown
    size = next(s for s in range(max(shown, 1), 0, -1) if start % s == 0)
    return size, start // size


def shown_lines(first: int, last: int, total: int, budget: Budget, more: str) -> str:
    """``Lines 1-40 of 900 shown to stay within the output budget (…); <more>``."""
    return (
        f"Lines {first}-{last} of {total} shown to stay within the output budget "
        f"({budget.chars:,} characters); {more}"
    )


def gap(count: int, what: str = "output") -> str:
    """The marker put where ``count`` characters were cut out of the middle of a text."""
    return f"\n… [{what} truncated: {count} characters dropped] …\n"
