"""The memory domain's records (blocks, their history, passages) and its notion of time.

Design: plain dataclasses every layer passes around; times are epoch seconds inside and ISO 8601 in
UTC (``…Z``) outside. Error policy: :func:`parse_when` refuses text that is not an ISO 8601 date or
datetime (:class:`MemoryRefusal`, saying what a valid one looks like).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from kernmind.memory.database import namespace_and_time_sql
from kernmind.memory.errors import MemoryRefusal


def now_ts() -> float:
    return time.time()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_when(text: str, *, end: bool = False) -> float:
    """ISO-8601 date or datetime -> epoch seconds (naive means UTC).

    A date alone as an end bound means "through the end of that day".
    """
    raw = text.strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", raw):
            day = datetime.fromisoformat(raw).replace(tzinfo=UTC)
            ts = day.timestamp()
            return ts + 86400 if end else ts
        dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as exc:
        raise MemoryRefusal(
            "{text!r} is not an ISO-8601 date or datetime; use e.g. '2025-06-01' or '2025-06-01T14:30:00Z'.",
            text=text,
        ) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def time_range(start: str | None, end: str | None) -> tuple[float | None, float | None]:
    """ISO bounds -> epoch seconds (an end date alone includes that day); refuses an empty range."""
    lo = parse_when(start) if start else None
    hi = parse_when(end, end=True) if end else None
    if lo is not None and hi is not None and lo >= hi:
        raise MemoryRefusal("the start of the time range must be before its end.")
    return lo, hi


@dataclass(slots=True)
class BlockRow:
    label: str
    value: str
    description: str
    limit: int
    read_only: bool
    version: int
    created_at: float
    updated_at: float
    previous: str | None = None  # the value before the write that produced this row, if any

    @property
    def chars(self) -> int:
        return len(self.value)

    def meta(self) -> dict[str, Any]:
        return {"description": self.description, "limit": self.limit, "read_only": self.read_only}


@dataclass(slots=True)
class HistoryRow:
    id: int
    label: str
    version: int
    op: str
    old_value: str | None
    new_value: str | None
    at: float
    undone: bool
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class PassageRow:
    id: int
    content: str
    tags: list[str]
    created_at: float  # when it was stored
    occurred_at: float  # when the fact happened or was said (what time filters read)
    score: float | None = None  # search: in [0, 1], higher is better (fusion.py)
    superseded_by: int | None = None  # the passage that replaced it (None: live)
    match: str | None = None  # search: words | meaning | both
    thread: str | None = None  # the conversation, session or document it belongs to (None: none)
    seq: int | None = None  # its position in its thread, from 1 (None: no thread)


def happened_at(row: PassageRow | MessageRow) -> float:
    """When what a text says happened, as searches that name a time compare it (recall.py): its
    ``occurred_at`` where the row has one, else when it was stored."""
    occurred = getattr(row, "occurred_at", None)
    return occurred if occurred is not None else row.created_at


@dataclass(slots=True)
class PassageIn:
    content: str
    tags: list[str] = field(default_factory=list)
    created_at: float | None = None  # None: now
    embedding: bytes | None = None
    embedding_model: str | None = None
    occurred_at: float | None = None  # None: the same as created_at
    thread: str | None = None
    seq: int | None = None  # set by Passages.add_in: the position it got in its thread


@dataclass(slots=True)
class MessageRow:
    id: int
    conversation_id: str
    role: str
    content: str
    created_at: float
    score: float | None = None  # search: in [0, 1], higher is better (fusion.py)
    match: str | None = None  # search: words | meaning | both
    seq: int | None = None  # its position in its conversation, from 1

    @property
    def thread(self) -> str:
        """A conversation is a thread (the same facts as a passage's ``thread``/``seq``)."""
        return self.conversation_id


# --- what the vector index reads from a corpus (vector_index.py) -----------------------------


@dataclass(frozen=True, slots=True)
class Generation:
    """A corpus's change counters (see the module docstring)."""

    changes: int
    rewrites: int


@dataclass(frozen=True, slots=True)
class StoredVector:
    id: int
    blob: bytes  # little-endian float32, L2-normalised
    at: float  # the time filters read: a passage's occurred_at, a message's created_at
    labels: list[str]
    thread: str | None = None  # a passage's thread, a message's conversation (None: none)
    seq: int | None = None  # its position in that thread, from 1


@dataclass(frozen=True, slots=True)
class Facets:
    """What a filter asks of a text in the index's terms: any (or all) of some labels, a time
    (``StoredVector.at``) in [start, end), and, with ``live_only``, none of the texts a later
    one replaced (the corpus's hidden ids: superseded passages); with ``thread``, only the
    texts of that thread (``StoredVector.thread``)."""

    labels: tuple[str, ...] = ()
    all_labels: bool = False
    start: float | None = None
    end: float | None = None
    live_only: bool = False
    thread: str | None = None

    @property
    def narrows(self) -> bool:
        return (
            bool(self.labels)
            or self.start is not None
            or self.end is not None
            or self.live_only
            or self.thread is not None
        )


@dataclass(frozen=True, slots=True)
class Neighbour:
    """The text next to another in its thread: its id, text and position."""

    id: int
    content: str
    seq: int


@dataclass(frozen=True, slots=True)
class Neighbours:
    """A text's previous and next texts in its thread (None: it is the first / the last, or has no thread)."""

    thread: str
    seq: int
    previous: Neighbour | None = None
    next: Neighbour | None = None


class VectorSource(Protocol):
    async def generation(self) -> Generation: ...

    async def vectors_after(self, model: str, after_id: int) -> list[StoredVector]: ...

    async def vector_ids(self, model: str) -> list[int]: ...

    async def vectors_of(self, model: str, ids: Sequence[int]) -> list[StoredVector]: ...

    async def hidden_ids(self) -> list[int]:
        """Texts that searches leave out unless asked (superseded passages); read again after a rewrite."""
        ...


# --- conversation messages: the filter and the SQL shapes both backends use ---------------
@dataclass(frozen=True, slots=True)
class MessageFilter:
    roles: tuple[str, ...] = ()
    start: float | None = None
    end: float | None = None

    @property
    def narrows(self) -> bool:
        return bool(self.roles) or self.start is not None or self.end is not None


def message_filter_sql(namespace: str, where: MessageFilter) -> tuple[str, list[Any]]:
    sql, params = namespace_and_time_sql(namespace, where.start, where.end)
    if where.roles:
        sql += f" AND p.role IN ({', '.join('?' * len(where.roles))})"
        params += list(where.roles)
    return sql, params


MESSAGE_COLUMNS = "p.id, p.conversation_id, p.role, p.content, p.created_at, p.seq"


def message_row(r: Sequence[Any], score: float | None = None) -> MessageRow:
    return MessageRow(r[0], r[1], r[2], r[3], r[4], score, seq=r[5])
