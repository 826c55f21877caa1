"""Archival passages of one namespace: storing, replacing, deleting, fetching, and their vectors'
bookkeeping (what the tools promise: docs/tools.md, "Archival memory").

Design: a passage is text, tags (JSON plus ``passage_tags`` rows for indexed filters), times,
``search_text`` (fulltext.py), an optional vector and a thread position ``seq`` (computed inside the
INSERT). ``content_key``, a digest of :func:`normalized` text, is looked up in the insert's write
transaction, so two writers never store a duplicate; only live passages can be superseded, so chains
never branch or loop. Every change bumps ``archive_gen`` (a delete or supersede also
``archive_rewrites``: texts.py).

Error policy: empty or oversized content, bad tags, ids that are not live passages of this namespace
are refused (:class:`MemoryRefusal`); nothing is stored then.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernmind.input_limits import THREAD_CHARS
from kernmind.memory.database import Database, PassageFilter, TextHits, Tx, namespace_and_time_sql
from kernmind.memory.errors import MemoryRefusal
from kernmind.memory.fulltext import index_text
from kernmind.memory.records import Facets, PassageIn, PassageRow, now_ts
from kernmind.memory.texts import TextTable, chunks, marks

MAX_ROW_ID = 2**63 - 1  # SQLite's (and PostgreSQL's bigint) largest integer
MAX_TAG_CHARS = 100
MAX_THREAD_CHARS = THREAD_CHARS
MAX_SUPERSEDES = 100  # ids one insert may supersede
_SPACES = re.compile(r"\s+")


def normalized(content: str) -> str:
    """The text as duplicates are compared (the rule: docs/tools.md, "Archival memory"): NFKC, no
    format characters (category ``Cf``), case folded, whitespace runs as one space, stripped."""
    text = unicodedata.normalize("NFKC", content)
    if not text.isascii():
        text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return _SPACES.sub(" ", text.casefold()).strip()


def content_key(content: str) -> str:
    """What the ``content_key`` column holds: a digest of :func:`normalized` (indexed, fixed size)."""
    return hashlib.sha256(normalized(content).encode()).hexdigest()[:32]


def check_ids(ids: Iterable[int], what: str = "supersedes") -> list[int]:
    """Passage ids as a caller sent them: whole numbers in range, each once, at most MAX_SUPERSEDES."""
    out = list(dict.fromkeys(ids))
    bad = [i for i in out if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= MAX_ROW_ID]
    if bad:
        raise MemoryRefusal(
            "{remember} refused: {what} holds {bad}, which are not passage ids (whole numbers from 1, as "
            "{remember} and {search} return them). Nothing was stored.",
            what=what,
            bad=bad,
        )
    if len(out) > MAX_SUPERSEDES:
        raise MemoryRefusal(
            "{remember} refused: {what} names {n} passages; one insert supersedes at most {max}. "
            "Nothing was stored.",
            what=what,
            n=len(out),
            max=MAX_SUPERSEDES,
        )
    return out


def normalize_tags(tags: Iterable[str] | None) -> list[str]:
    out: dict[str, None] = {}
    for t in tags or ():
        t = t.strip()
        if t:
            if len(t) > MAX_TAG_CHARS:
                raise MemoryRefusal(
                    "tag {start!r}… is {chars} characters; tags are at most {max}.",
                    start=t[:20],
                    chars=len(t),
                    max=MAX_TAG_CHARS,
                )
            out.setdefault(t, None)
    return list(out)


def check_thread(thread: str | None) -> str | None:
    """A thread label as a caller sent it: stripped; None or blank for none; at most
    MAX_THREAD_CHARS characters, none of them control or format characters (they would make two
    labels that look alike differ)."""
    if thread is None or not thread.strip():
        return None
    label = thread.strip()
    if len(label) > MAX_THREAD_CHARS:
        raise MemoryRefusal(
            "thread {start!r}… is {chars} characters; a thread label is at most {max} (a short name for the "
            "conversation, session or document, e.g. 'call-2024-03-12').",
            start=label[:20],
            chars=len(label),
            max=MAX_THREAD_CHARS,
        )
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Cn") for c in label):
        raise MemoryRefusal(
            "thread {label!r} holds control, format or unassigned characters; use visible characters only.",
            label=label,
        )
    return label


def filter_sql(
    namespace: str, where: PassageFilter, *, drive_from_tags: bool = False
) -> tuple[str, list[Any]]:
    """SQL conditions on passages ``p`` (each starting with `` AND``) and their parameters.

    Tag conditions are correlated primary-key probes of ``passage_tags`` by default (cheap
    per candidate row when the candidates come from a full-text match, and nothing is
    materialised whatever the share of passages carrying the tag); ``drive_from_tags``
    phrases them as ``p.id IN (…)`` so the engine can start from the tag index when listing
    every match.
    """
    sql, params = namespace_and_time_sql(namespace, where.start, where.end, "occurred_at")
    if where.hides:
        sql += " AND p.superseded_by IS NULL"
    if where.thread is not None:
        sql += " AND p.thread = ?"
        params.append(where.thread)
    wanted = normalize_tags(where.tags)
    if not wanted:
        return sql, params
    marks = ", ".join("?" * len(wanted))
    if drive_from_tags:
        having = (
            f" GROUP BY passage_id HAVING count(*) = {len(wanted)}" if where.tag_match_mode == "all" else ""
        )
        sql += f" AND p.id IN (SELECT passage_id FROM passage_tags WHERE namespace = ? AND tag IN ({marks}){having})"
        return sql, [*params, namespace, *wanted]
    if where.tag_match_mode == "all" and len(wanted) > 1:
        sql += (
            f" AND (SELECT count(*) FROM passage_tags t WHERE t.passage_id = p.id AND t.tag IN ({marks}))"
            f" = {len(wanted)}"
        )
    else:
        sql += f" AND EXISTS (SELECT 1 FROM passage_tags t WHERE t.passage_id = p.id AND t.tag IN ({marks}))"
    return sql, [*params, *wanted]


PASSAGE_COLUMNS = "p.id, p.content, p.tags, p.created_at, p.occurred_at, p.superseded_by, p.thread, p.seq"


def passage_row(r: Sequence[Any], score: float | None = None) -> PassageRow:
    """A row of :data:`PASSAGE_COLUMNS` as a :class:`PassageRow`."""
    return PassageRow(r[0], r[1], json.loads(r[2]), r[3], r[4], score, r[5], thread=r[6], seq=r[7])


@dataclass(slots=True)
class Stored:
    """What :meth:`Passages.store` did: the passage that now holds the text (new, or the live
    duplicate that already held it) and the passages it superseded."""

    id: int
    created_at: float
    occurred_at: float
    duplicate_of: int | None = None
    superseded: list[int] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)  # the stored passage's (a duplicate keeps its own)
    embedded: bool = False  # whether the stored passage has a vector
    thread: str | None = None
    seq: int | None = None  # its position in its thread (1, 2, …)


class Passages(TextTable):
    """The archival passages of one namespace (vector bookkeeping: texts.py)."""

    table = "passages"
    generation_column = "archive_gen"
    rewrite_column = "archive_rewrites"

    def __init__(self, db: Database, namespace: str, *, max_chars: int = 10_000) -> None:
        super().__init__(db, namespace)
        self.max_chars = max_chars

    def check(self, content: str) -> None:
        if not content.strip():
            raise MemoryRefusal("{remember} refused: content is empty. Pass the text to remember.")
        if len(content) > self.max_chars:
            raise MemoryRefusal(
                "{remember} refused: content is {chars} characters, {over} over the limit of {limit}. "
                "Split it into several shorter passages and store each one.",
                chars=len(content),
                over=len(content) - self.max_chars,
                limit=self.max_chars,
            )

    async def add(self, items: Sequence[PassageIn]) -> list[tuple[int, float]]:
        """Store passages in one transaction, as they are (no duplicate check: bulk loads,
        benchmarks); (id, created_at) for each."""
        for item in items:
            self.check(item.content)
        async with self.db.write() as tx:
            out = [await self.add_in(tx, item) for item in items]
            await self.bump_generation(tx)
        return out

    async def add_in(self, tx: Tx, item: PassageIn) -> tuple[int, float]:
        """One passage inside the caller's transaction (which must also bump the generation); a
        passage of a thread goes after the thread's last one (``seq``: its position, from 1)."""
        tags = normalize_tags(item.tags)
        thread = check_thread(item.thread)
        ts = item.created_at if item.created_at is not None else now_ts()
        occurred = item.occurred_at if item.occurred_at is not None else ts
        # a thread's next position is read inside the insert: one statement, in the write transaction
        seq_sql = (
            "NULL"
            if thread is None
            else "(SELECT coalesce(max(seq), 0) + 1 FROM passages WHERE namespace = ? AND thread = ?)"
        )
        row = await tx.one(
            "INSERT INTO passages (namespace, content, search_text, tags, created_at, occurred_at, content_key, "
            f"embedding, embedding_model, thread, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {seq_sql}) "
            "RETURNING id, seq",
            (
                self.namespace, item.content, index_text(item.content), json.dumps(tags), ts, occurred,
                content_key(item.content), item.embedding, item.embedding_model, thread,
                *(() if thread is None else (self.namespace, thread)),
            ),
        )  # fmt: skip
        assert row is not None
        pid = int(row[0])
        item.seq = None if row[1] is None else int(row[1])
        if item.embedding is not None and item.embedding_model is not None:
            self.expect_vector(item.embedding_model, len(item.embedding))
        if tags:
            await tx.many(
                "INSERT INTO passage_tags (passage_id, namespace, tag) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                [(pid, self.namespace, t) for t in tags],
            )
        return pid, ts

    async def delete(self, passage_id: int) -> tuple[PassageRow, list[int]]:
        """Delete a passage; (what it was, the passages that are live again because it is gone)."""
        if not 1 <= passage_id <= MAX_ROW_ID:
            raise MemoryRefusal(
                "{forget} refused: {id} is not a passage id (ids are whole numbers from 1 to {max}, as "
                "{remember} and {search} return them). Find the id with {search}.",
                id=passage_id,
                max=MAX_ROW_ID,
            )
        async with self.db.write() as tx:
            r = await tx.one(
                f"SELECT {PASSAGE_COLUMNS} FROM passages p WHERE p.id = ? AND p.namespace = ?",
                (passage_id, self.namespace),
            )
            if r is None:
                raise MemoryRefusal(
                    "{forget} refused: there is no passage with id {id} in this memory. Find the id with {search}.",
                    id=passage_id,
                )
            row = passage_row(r)
            replaced = await tx.all(
                "SELECT id FROM passages WHERE superseded_by = ? AND namespace = ? ORDER BY id",
                (passage_id, self.namespace),
            )
            # splice it out of its chain: what it superseded now points at its successor (None: live again)
            await tx.run(
                "UPDATE passages SET superseded_by = ? WHERE superseded_by = ? AND namespace = ?",
                (row.superseded_by, passage_id, self.namespace),
            )
            await tx.run("DELETE FROM passages WHERE id = ?", (passage_id,))
            await self.bump_generation(tx, rewrite=True)
        return row, [] if row.superseded_by is not None else [int(x[0]) for x in replaced]

    async def get(self, ids: Sequence[int]) -> dict[int, PassageRow]:
        return {r[0]: passage_row(r) for r in await self.rows_by_id(PASSAGE_COLUMNS, ids)}

    async def all(self) -> list[PassageRow]:
        """Every passage of the namespace, superseded ones included, oldest first."""
        async with self.db.read() as tx:
            rows = await tx.all(
                f"SELECT {PASSAGE_COLUMNS} FROM passages p WHERE p.namespace = ? ORDER BY p.id",
                (self.namespace,),
            )
        return [passage_row(r) for r in rows]

    async def find_in(self, tx: Tx, content: str, tags: list[str], created_at: float) -> int | None:
        """The id of a passage with exactly this content, tags and creation time (an import's twin)."""
        row = await tx.one(
            "SELECT id FROM passages WHERE namespace = ? AND created_at = ? AND content = ? AND tags = ? "
            "ORDER BY id LIMIT 1",
            (self.namespace, created_at, content, json.dumps(tags)),
        )
        return None if row is None else int(row[0])

    # ---------------------------------------------------------------- duplicates and superseding

    async def live_duplicate(
        self, content: str, tx: Tx | None = None, thread: str | None = None
    ) -> Stored | None:
        """The oldest live passage of ``thread`` (None: of no thread) whose :func:`normalized` text
        equals ``content``'s (a conversation's "Yes!" is not a copy of another conversation's)."""
        if tx is None:
            async with self.db.read() as rtx:
                return await self.live_duplicate(content, rtx, thread)
        want = normalized(content)
        same_thread = "thread IS NULL" if thread is None else "thread = ?"
        rows = await tx.all(
            "SELECT id, content, tags, created_at, occurred_at, embedding IS NOT NULL, thread, seq FROM passages "
            f"WHERE namespace = ? AND content_key = ? AND superseded_by IS NULL AND {same_thread} ORDER BY id",
            (self.namespace, content_key(content), *([] if thread is None else [thread])),
        )
        for r in rows:
            if normalized(r[1]) == want:  # the digest narrows; the text decides
                return Stored(int(r[0]), r[3], r[4], int(r[0]), [], json.loads(r[2]), bool(r[5]), r[6], r[7])
        return None

    async def store(self, item: PassageIn, supersedes: Sequence[int] = ()) -> Stored:
        """Store one passage unless a live passage already says the same (then that one is
        returned, with ``duplicate_of``), and mark ``supersedes`` as replaced by whichever
        holds the text — all in one transaction, or nothing when any id is refused."""
        self.check(item.content)
        wanted = check_ids(supersedes)
        thread = item.thread = check_thread(item.thread)
        async with self.db.write() as tx:
            out = await self.live_duplicate(item.content, tx, thread)
            targets = [i for i in wanted if out is None or i != out.id]  # a passage never supersedes itself
            await self._check_supersedable(tx, targets)
            if out is None:
                pid, created = await self.add_in(tx, item)
                out = Stored(
                    pid, created, item.occurred_at if item.occurred_at is not None else created,
                    tags=normalize_tags(item.tags), embedded=item.embedding is not None, thread=thread,
                    seq=item.seq,
                )  # fmt: skip
            elif not targets:
                return out  # nothing written
            if targets:
                for chunk in chunks(targets):
                    await tx.run(
                        f"UPDATE passages SET superseded_by = ? WHERE namespace = ? AND id IN ({marks(chunk)})",
                        (out.id, self.namespace, *chunk),
                    )
            out.superseded = targets
            await self.bump_generation(tx, rewrite=bool(targets))
        return out

    async def _check_supersedable(self, tx: Tx, ids: Sequence[int]) -> None:
        """Refuse ids that are not live passages of this namespace."""
        if not ids:
            return
        found: dict[int, int | None] = {}
        for chunk in chunks(ids):
            rows = await tx.all(
                f"SELECT id, superseded_by FROM passages WHERE namespace = ? AND id IN ({marks(chunk)})",
                (self.namespace, *chunk),
            )
            found.update((int(r[0]), r[1]) for r in rows)
        unknown = [i for i in ids if i not in found]
        if unknown:
            raise MemoryRefusal(
                "{remember} refused: supersedes names {ids}, but there is no passage with {that} in this memory. "
                "Nothing was stored. Find the ids of the passages this one replaces with {search}.",
                ids=unknown,
                that="that id" if len(unknown) == 1 else "those ids",
            )
        replaced = {i: found[i] for i in ids if found[i] is not None}
        if replaced:
            raise MemoryRefusal(
                "{remember} refused: {detail}. Only live passages can be superseded: supersede the newer "
                "passage instead (the newest of its chain; {search} with include_superseded=true shows each "
                "passage's superseded_by). Nothing was stored.",
                detail="; ".join(
                    f"passage {i} is already superseded by passage {by}" for i, by in replaced.items()
                ),
            )

    async def browse(self, where: PassageFilter, limit: int, offset: int = 0) -> list[PassageRow]:
        """The passages that pass ``where`` in the order they happened: by ``occurred_at`` (a stored
        passage's is when it was stored), or, within one thread, in the thread's order (``seq``);
        ties by id. Scores are None."""
        conditions, params = filter_sql(self.namespace, where, drive_from_tags=bool(where.tags))
        order = "p.seq, p.occurred_at, p.id" if where.thread is not None else "p.occurred_at, p.id"
        async with self.db.read() as tx:
            rows = await tx.all(
                f"SELECT {PASSAGE_COLUMNS} FROM passages p WHERE 1 = 1{conditions} ORDER BY {order} "
                "LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
        return [passage_row(r) for r in rows]

    async def search_text(
        self, query: str, where: PassageFilter, limit: int, offset: int = 0
    ) -> list[PassageRow]:
        """Full-text ranked passages (the backend's search; see fts5.py)."""
        return await self.db.passage_text.search(self.namespace, query, where, limit, offset)

    async def rank_text(self, query: str, where: PassageFilter, limit: int) -> TextHits:
        """:meth:`search_text` with the query's term statistics (for fusion with meaning)."""
        return await self.db.passage_text.rank(self.namespace, query, where, limit)

    label_column = "tags"

    def labels(self, value: str) -> list[str]:
        return list(json.loads(value))

    time_column = "occurred_at"
    hidden_column = "superseded_by"
    thread_column = "thread"

    def facets(self, where: PassageFilter) -> Facets:
        return Facets(
            where.tags, where.tag_match_mode == "all", where.start, where.end, where.hides, where.thread
        )
