"""One output budget: what a tool returns fits in the caller's context, and says how to get the rest.

Design
------
A :class:`Budget` is a number of characters an answer may hold (``--max-output-chars``),
spent as the answer is built: :meth:`Budget.take` keeps as much of a text as fits,
:meth:`Budget.admit` says whether a whole item (a passage, a message, a file entry) still
fits. What does not fit is left out, never silently: each left-out part gets a note that
says what is missing and how to get it — the next page, a ``view_range``, a byte range, a
resource to read — written by the tool that knows its own arguments (:func:`left_out`,
:func:`next_page` help word it the same way everywhere).

A budget is made per answer from the settings (:meth:`Budget.of`): two answers never
share one. Sizes are counted in characters of what the model reads (the text, or the JSON
of an item as the SDK writes it: :func:`listed_size`), which is what a context window fills with.

Error policy
------------
Nothing here raises: a budget too small for even one item still admits the first (cut by
:meth:`Budget.take` where it is text), so an answer is never empty because of the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel


class BudgetSettings(Protocol):
    max_output_chars: int


@dataclass
class Budget:
    """Characters an answer may still hold."""

    chars: int
    used: int = 0

    @classmethod
    def of(cls, settings: BudgetSettings) -> Budget:
        """The budget of one answer under ``settings`` (``--max-output-chars``)."""
        return cls(settings.max_output_chars)

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

    def take(self, text: str, *, more: str) -> tuple[str, str | None]:
        """As much of ``text`` as fits, and ``None`` or a note on what was cut and how to get
        it (``more``: e.g. ``"read the rest with view_range=[41, -1]"``)."""
        if len(text) <= self.left:
            self.used += len(text)
            return text, None
        kept = text[: self.left]
        self.used += len(kept)
        return kept, (
            f"{len(text) - len(kept):,} of {len(text):,} characters left out to stay within the output "
            f"budget ({self.chars:,} characters); {more}"
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
