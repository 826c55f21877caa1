"""Copy one namespace, everything in it, from one memory database to another (``kernmind memory migrate``).

Design: unlike export/import, a migration keeps all of a namespace: blocks with versions, times and
every history entry (``memory_undo`` still works), passages with tags, times, threads and vectors,
conversations with their messages and vectors; read through the source's backend, written in one
write transaction on the destination (all or nothing). Passages and messages get new ids
(``superseded_by`` follows). ``sqlite:PATH``, a plain path or ``postgresql://…`` name the databases.

Error policy: a destination that already holds the namespace (beyond untouched default blocks), or a
source without it, is refused (:class:`MemoryRefusal`) and nothing is written.
"""

from __future__ import annotations

from typing import Any

from kernmind.memory.errors import MemoryRefusal
from kernmind.memory.passages import content_key
from kernmind.memory.store import open_database

# table -> (columns copied as they are, the order that keeps history in sequence)
TABLES: dict[str, tuple[str, str]] = {
    "blocks": ("label, value, description, char_limit, read_only, version, created_at, updated_at", "label"),
    "block_history": ("label, version, op, old_value, new_value, meta, at, undone", "id"),
    "conversations": ("id, started_at, title", "id"),
    "messages": (
        "conversation_id, seq, role, content, meta, created_at, search_text, embedding, embedding_model",
        "id",
    ),
}
PASSAGE_COLUMNS = (
    "content, search_text, tags, created_at, occurred_at, embedding, embedding_model, thread, seq"
)


def database_location(text: str) -> str:
    """``sqlite:PATH`` -> PATH; URLs and plain paths as they are."""
    return text[len("sqlite:") :] if text.startswith("sqlite:") else text


async def migrate_namespace(source: str, destination: str, namespace: str) -> dict[str, int]:
    src = await open_database(database_location(source)).open()
    try:
        dst = await open_database(database_location(destination)).open()
        try:
            return await _copy(src, dst, namespace)
        finally:
            await dst.close()
    finally:
        await src.close()


async def _copy(src: Any, dst: Any, namespace: str) -> dict[str, int]:
    async with src.read() as tx:
        ns = await tx.one("SELECT created_at FROM namespaces WHERE namespace = ?", (namespace,))
        if ns is None:
            raise MemoryRefusal("the source has no namespace {ns!r}; pick one with --agent.", ns=namespace)
        rows = {
            t: await tx.all(f"SELECT {c} FROM {t} WHERE namespace = ? ORDER BY {order}", (namespace,))
            for t, (c, order) in TABLES.items()
        }
        passages = await tx.all(
            f"SELECT id, superseded_by, {PASSAGE_COLUMNS} FROM passages WHERE namespace = ? ORDER BY id",
            (namespace,),
        )
        tags = await tx.all("SELECT passage_id, tag FROM passage_tags WHERE namespace = ?", (namespace,))
    stats = {name: len(r) for name, r in rows.items()} | {"passages": len(passages)}
    async with dst.write() as tx:
        existing = await tx.one(
            "SELECT (SELECT count(*) FROM blocks WHERE namespace = ? AND (version > 1 OR value <> '')) "
            "+ (SELECT count(*) FROM passages WHERE namespace = ?) + (SELECT count(*) FROM messages WHERE namespace = ?)",
            (namespace, namespace, namespace),
        )
        if existing and existing[0]:
            raise MemoryRefusal(
                "the destination already holds memory in namespace {ns!r}; migrate into an empty namespace "
                "(another --agent, or export/import to merge).",
                ns=namespace,
            )
        for table in "blocks block_history messages conversations passage_tags passages namespaces".split():
            await tx.run(f"DELETE FROM {table} WHERE namespace = ?", (namespace,))
        await tx.run("INSERT INTO namespaces (namespace, created_at) VALUES (?, ?)", (namespace, ns[0]))
        for table, (columns, _order) in TABLES.items():
            marks = ", ".join("?" * (columns.count(",") + 2))
            await tx.many(
                f"INSERT INTO {table} (namespace, {columns}) VALUES ({marks})",
                [(namespace, *r) for r in rows[table]],
            )
        new_ids: dict[int, int] = {}
        for old_id, _successor, *values in passages:
            row = await tx.one(
                f"INSERT INTO passages (namespace, content_key, {PASSAGE_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (namespace, content_key(values[0]), *values),
            )
            assert row is not None
            new_ids[old_id] = int(row[0])
        await tx.many(
            "UPDATE passages SET superseded_by = ? WHERE id = ?",
            [(new_ids[successor], new_ids[pid]) for pid, successor, *_ in passages if successor in new_ids],
        )
        await tx.many(
            "INSERT INTO passage_tags (passage_id, namespace, tag) VALUES (?, ?, ?)",
            [(new_ids[pid], namespace, tag) for pid, tag in tags],
        )
        await tx.run(
            "UPDATE namespaces SET archive_gen = archive_gen + 1, conversation_gen = conversation_gen + 1, "
            "archive_rewrites = archive_rewrites + 1, conversation_rewrites = conversation_rewrites + 1 "
            "WHERE namespace = ?",
            (namespace,),
        )
    return stats
