"""Times named in a search query: "in May 2023", "on 8 May 2023", "last week", "before June",
"after the move" (what a search does with them: docs/tools.md, "Archival memory", when).

Design: :func:`time_in` returns the first time expression of an English query as a :class:`TimeRef`
(the span ``[start, end)`` in UTC epoch seconds, ``during``/``before``/``after``, the words): days,
months and their thirds ("early May"), years (a month without a year: the latest up to ``now``),
relative times ("3 months ago", "recently": 30 days); around an event ("before the move") the event is
``anchor`` text for recall.py to find. "When did …" names no time.

Error policy: pure functions over strings; what does not parse is not a time (None).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

DAY = 86400.0
MONTHS = {
    name.lower(): i
    for i in range(1, 13)
    for name in (calendar.month_name[i], calendar.month_abbr[i], "Sept" if i == 9 else calendar.month_abbr[i])
}
_MONTH = r"(?P<month>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_DAYNUM = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_PART = r"(?:(?P<part>early|mid|late|end of|beginning of|the end of|the beginning of)[\s-]+)?"
_NUMBERS = {
    w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())
}

Relation = Literal["during", "before", "after"]


@dataclass(frozen=True, slots=True)
class TimeRef:
    """A time a query names: ``[start, end)`` (either may be open), how the query relates to it, the
    words that named it, and for an event ("before the move") the event's words instead of a span."""

    start: float | None
    end: float | None
    relation: Relation = "during"
    words: str = ""
    anchor: str | None = None

    def around(self, start: float, end: float) -> TimeRef:
        """This reference with an anchor's span filled in (``before``/``after`` it)."""
        return TimeRef(start, end, self.relation, self.words)

    @property
    def window(self) -> tuple[float | None, float | None]:
        """The span a passage's time should fall in."""
        if self.relation == "before":
            return None, self.start
        if self.relation == "after":
            return self.end, None
        return self.start, self.end


def _ts(dt: datetime) -> float:
    return dt.replace(tzinfo=UTC).timestamp() if dt.tzinfo is None else dt.timestamp()


def _month_span(year: int, month: int, part: str | None = None) -> tuple[float, float]:
    first = datetime(year, month, 1, tzinfo=UTC)
    days = calendar.monthrange(year, month)[1]
    start, end = _ts(first), _ts(first) + days * DAY
    if part:
        third = (end - start) / 3
        if part in ("early", "beginning of", "the beginning of"):
            end = start + third
        elif part == "mid":
            start, end = start + third, start + 2 * third
        else:  # late, end of
            start = end - third
    return start, end


def _absolute(text: str, now: datetime) -> tuple[tuple[float, float], re.Match[str]] | None:
    patterns = [
        (rf"\b(?P<iso>{_YEAR}-(?P<m>[01]\d)-(?P<d>[0-3]\d))\b", "iso-day"),
        (rf"\b{_DAYNUM}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b", "day"),
        (rf"\b{_MONTH}\s+{_DAYNUM},?\s+{_YEAR}\b", "day"),
        (rf"\b{_YEAR}-(?P<m>[01]\d)\b", "iso-month"),
        (rf"\b{_PART}{_MONTH},?\s+(?:of\s+)?{_YEAR}\b", "month"),
        (rf"\b(?:in|during|of|since|until|before|after)\s+(?:the\s+year\s+)?{_YEAR}\b", "year"),
        (rf"\b(?:in|during|since|until|before|after)\s+{_PART}{_MONTH}\b", "bare-month"),
    ]
    for pattern, kind in patterns:
        m = re.search(pattern, text, re.IGNORECASE)
        if not m:
            continue
        g = m.groupdict()
        try:
            if kind == "iso-day":
                start = _ts(datetime(int(g["year"]), int(g["m"]), int(g["d"])))
                return (start, start + DAY), m
            if kind == "day":
                start = _ts(datetime(int(g["year"]), MONTHS[g["month"].lower()], int(g["day"])))
                return (start, start + DAY), m
            if kind == "iso-month":
                return _month_span(int(g["year"]), int(g["m"])), m
            if kind == "month":
                return _month_span(int(g["year"]), MONTHS[g["month"].lower()], _part(g)), m
            if kind == "year":
                year = int(g["year"])
                return (_ts(datetime(year, 1, 1)), _ts(datetime(year + 1, 1, 1))), m
            month = MONTHS[g["month"].lower()]
            year = now.year if month <= now.month else now.year - 1
            return _month_span(year, month, _part(g)), m
        except ValueError:  # 31 February and the like: not a date
            continue
    return None


def _part(g: dict[str, str | None]) -> str | None:
    part = g.get("part")
    return part.lower() if part else None


def _relative(text: str, now: datetime) -> tuple[tuple[float, float], re.Match[str]] | None:
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    monday = today - timedelta(days=today.weekday())
    m = re.search(
        r"\b(?P<what>today|yesterday|recently|lately|(?P<which>this|last|past|previous)\s+"
        r"(?P<unit>week|weekend|month|year)|(?P<n>\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|"
        r"eleven|twelve|a\s+couple\s+of|a\s+few)\s+(?P<units>day|week|month|year)s?\s+ago)\b",
        text,
        re.IGNORECASE,
    )
    if not m:
        return None
    what = m.group("what").lower()
    if what == "today":
        return (_ts(today), _ts(today) + DAY), m
    if what == "yesterday":
        return (_ts(today) - DAY, _ts(today)), m
    if what in ("recently", "lately"):
        return (_ts(today) - 30 * DAY, now.timestamp() + 1), m
    if m.group("which"):
        last = m.group("which").lower() != "this"
        unit = m.group("unit").lower()
        if unit == "week":
            start = monday - timedelta(weeks=1) if last else monday
            return (_ts(start), _ts(start + timedelta(weeks=1))), m
        if unit == "weekend":
            saturday = (
                monday
                + timedelta(days=5)
                - (timedelta(weeks=1) if last or today.weekday() < 5 else timedelta())
            )
            return (_ts(saturday), _ts(saturday + timedelta(days=2))), m
        if unit == "month":
            year, month = (now.year, now.month) if not last else _previous_month(now.year, now.month)
            return _month_span(year, month), m
        year = now.year - 1 if last else now.year
        return (_ts(datetime(year, 1, 1)), _ts(datetime(year + 1, 1, 1))), m
    raw = m.group("n").lower()
    n = (
        2
        if raw.startswith("a couple")
        else 3
        if raw == "a few"
        else 1
        if raw in ("a", "an")
        else _NUMBERS.get(raw)
    )
    count = n if n is not None else int(raw)
    unit = m.group("units").lower()
    days = {"day": 1, "week": 7, "month": 30.44, "year": 365.25}[unit] * count
    width = {"day": 1, "week": 7, "month": 30.44, "year": 365.25}[unit]
    centre = now.timestamp() - days * DAY
    return (centre - width * DAY / 2, centre + width * DAY / 2), m


def _previous_month(year: int, month: int) -> tuple[int, int]:
    return (year - 1, 12) if month == 1 else (year, month - 1)


_EVENT = re.compile(
    r"\b(?P<rel>before|after|since|prior\s+to|following)\s+(?P<event>(?:the|my|our|his|her|their|\w+'s)\s+"
    r"[\w' -]+?)\s*(?:[?.!,;]|$)",
    re.IGNORECASE,
)


def time_in(query: str, now: float) -> TimeRef | None:
    """The time ``query`` names, if any (see the module docstring); ``now`` anchors relative times."""
    at = datetime.fromtimestamp(now, UTC)
    found = _absolute(query, at) or _relative(query, at)
    if found is not None:
        (start, end), m = found
        head = m.group(0).lower()
        relation = _relation_before(query, m.start())
        if head.startswith("since") or relation == "since":  # since May: from its start on
            return TimeRef(start, None, "during", m.group(0).strip())
        if head.startswith("after"):
            relation = "after"
        elif head.startswith(("until", "before")):
            relation = "before"
        return TimeRef(start, end, relation, m.group(0).strip())  # type: ignore[arg-type]
    event = _EVENT.search(query)
    if event is not None:
        rel = event.group("rel").lower()
        relation: Relation = "before" if rel in ("before", "prior to") else "after"
        return TimeRef(None, None, relation, event.group(0).strip(" ?.!,;"), event.group("event").strip())
    return None


def _relation_before(query: str, at: int) -> str:
    """'before'/'after'/'since' when one of those words comes right before the time's words."""
    head = query[:at].rstrip()
    last = head.rsplit(None, 2)[-2:] if head else []
    joined = " ".join(last).lower()
    if joined.endswith(("before", "until", "till", "prior to")):
        return "before"
    if joined.endswith("since"):
        return "since"
    if joined.endswith(("after", "following")):
        return "after"
    return "during"


def affinity(times: list[float], ref: TimeRef, scale: float | None = None) -> list[float]:
    """How well each time fits ``ref``: 1 inside its window, falling off outside it over ``scale``
    seconds (default: the span's own length, at least a day)."""
    start, end = ref.window
    span = (ref.end - ref.start) if ref.start is not None and ref.end is not None else 30 * DAY
    width = scale or max(span, DAY)
    out = []
    for t in times:
        if start is not None and t < start:
            gap = start - t
        elif end is not None and t >= end:
            gap = t - end
        else:
            gap = 0.0
        out.append(1.0 / (1.0 + gap / width))
    return out
