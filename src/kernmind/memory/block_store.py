"""Memory blocks of one namespace, kept transactionally with versions, history and undo.

Design: every write is a read-modify-write in the database's write transaction (the rules and the
edit from blocks.py, ``version + 1``, a ``block_history`` row), ``expected_version`` checked inside it,
so two writers never both win. ``undo`` reverts the latest change not yet undone and is itself a new
version (op ``undo``: undoable too); a fresh namespace is seeded once with the default blocks (op
``seed``), and a default block the agent deleted is not seeded again. Ops are :class:`Verb` names.

Error policy: every refusal is a :class:`MemoryRefusal`; the transaction rolls back, so a refused
write changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kernmind.memory import blocks as rules
from kernmind.memory.database import Database, Row, Tx
from kernmind.memory.errors import MemoryRefusal, Verb
from kernmind.memory.records import BlockRow, HistoryRow, now_ts

_COLS = "label, value, description, char_limit, read_only, version, created_at, updated_at"
_HISTORY_COLS = "id, label, version, op, old_value, new_value, at, undone, meta"


def _block(r: Row) -> BlockRow:
    return BlockRow(r[0], r[1], r[2], int(r[3]), bool(r[4]), int(r[5]), r[6], r[7])


def _history(r: Row) -> HistoryRow:
    return HistoryRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), json.loads(r[8] or "{}"))


class Blocks:
    """The memory blocks of one namespace (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        namespace: str,
        *,
        default_limit: int,
        max_limit: int,
        max_blocks: int | None = None,
    ) -> None:
        self.db = db
        self.namespace = namespace
        self.max_limit = max_limit
        self.default_limit = min(default_limit, max_limit)
        self.max_blocks = max_blocks  # None: no cap (the command line's imports)

    # ------------------------------------------------------------ reads

    async def list(self, offset: int = 0, limit: int | None = None) -> list[BlockRow]:
        """Blocks in creation order; ``offset``/``limit`` for a page of them."""
        page = "" if limit is None else f" LIMIT {int(limit)} OFFSET {int(offset)}"
        async with self.db.read() as tx:
            rows = await tx.all(
                f"SELECT {_COLS} FROM blocks WHERE namespace = ? ORDER BY created_at, label{page}",
                (self.namespace,),
            )
        return [_block(r) for r in rows]

    async def count(self) -> int:
        async with self.db.read() as tx:
            return await self._count(tx)

    async def _count(self, tx: Tx) -> int:
        row = await tx.one("SELECT count(*) FROM blocks WHERE namespace = ?", (self.namespace,))
        return int(row[0]) if row else 0

    async def _check_room(self, tx: Tx) -> None:
        """Refuse one more block when the namespace holds ``max_blocks`` already."""
        if self.max_blocks is not None and (count := await self._count(tx)) >= self.max_blocks:
            raise rules.too_many_blocks(count, self.max_blocks)

    async def get(self, label: str) -> BlockRow:
        async with self.db.read() as tx:
            row = await self.fetch(tx, label)
            if row is None:
                raise await self.unknown(tx, label)
        return row

    async def fetch(self, tx: Tx, label: str) -> BlockRow | None:
        r = await tx.one(
            f"SELECT {_COLS} FROM blocks WHERE namespace = ? AND label = ?", (self.namespace, label)
        )
        return _block(r) if r else None

    async def writable(
        self, tx: Tx, label: str, row: BlockRow | None, op: Verb, expected_version: int | None
    ) -> BlockRow:
        """``row``, the block ``label`` as fetched, if it exists and ``op`` may change it; else the refusal."""
        if row is None:
            raise await self.unknown(tx, label)
        rules.check_writable(row, op, expected_version)
        return row

    async def unknown(self, tx: Tx, label: str) -> MemoryRefusal:
        rows = await tx.all(
            "SELECT label FROM blocks WHERE namespace = ? ORDER BY created_at", (self.namespace,)
        )
        return rules.unknown_label(label, [r[0] for r in rows])

    async def history(self, label: str, limit: int = 20, offset: int = 0) -> list[HistoryRow]:
        async with self.db.read() as tx:
            rows = await tx.all(
                f"SELECT {_HISTORY_COLS} FROM block_history WHERE namespace = ? AND label = ? "
                "ORDER BY id DESC LIMIT ? OFFSET ?",
                (self.namespace, label, limit, offset),
            )
            if not rows and await self.fetch(tx, label) is None:
                raise await self.unknown(tx, label)
        return [_history(r) for r in rows]

    # ------------------------------------------------------------ writes

    async def seed(self, defaults: dict[str, str]) -> None:
        """Create the namespace; the first time, with ``defaults`` (label -> description) as empty blocks."""
        async with self.db.write() as tx:
            created = await tx.run(
                "INSERT INTO namespaces (namespace, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (self.namespace, now_ts()),
            )
            if created == 1:
                for label, description in defaults.items():
                    await self.insert_row(tx, label, "", description, self.default_limit, False, "seed")

    async def insert_row(
        self,
        tx: Tx,
        label: str,
        value: str,
        description: str,
        limit: int,
        read_only: bool,
        op: str,
        *,
        version: int = 1,
        created_at: float | None = None,
        renamed_from: str | None = None,
    ) -> BlockRow:
        ts = now_ts()
        row = BlockRow(label, value, description, limit, read_only, version, created_at or ts, ts)
        await tx.run(
            f"INSERT INTO blocks (namespace, {_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.namespace, label, value, description, limit, int(read_only), version, row.created_at, ts),
        )
        meta = row.meta() if renamed_from is None else {**row.meta(), "from": renamed_from}
        await self.record(tx, label, version, op, None, value, meta, ts)
        return row

    async def record(
        self,
        tx: Tx,
        label: str,
        version: int,
        op: str,
        old: str | None,
        new: str | None,
        meta: dict[str, Any] | None,
        ts: float,
    ) -> None:
        await tx.run(
            "INSERT INTO block_history (namespace, label, version, op, old_value, new_value, meta, at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (self.namespace, label, version, op, old, new, json.dumps(meta) if meta else None, ts),
        )

    async def create(
        self,
        label: str,
        value: str = "",
        description: str = "",
        limit: int | None = None,
        read_only: bool = False,
    ) -> BlockRow:
        rules.check_label(label)
        limit = self.default_limit if limit is None else limit
        rules.check_limit_value(limit, self.max_limit)
        rules.check_initial_value(value, limit)
        async with self.db.write() as tx:
            existing = await self.fetch(tx, label)
            if existing is not None:
                raise rules.already_exists(existing)
            await self._check_room(tx)
            return await self.insert_row(tx, label, value, description, limit, read_only, Verb.CREATE)

    async def modify(
        self,
        label: str,
        op: Verb,
        edit: Callable[[BlockRow], str],
        expected_version: int | None = None,
    ) -> BlockRow:
        """Read-modify-write of one block's value; ``edit`` returns the new value or refuses."""
        async with self.db.write() as tx:
            row = await self.writable(tx, label, await self.fetch(tx, label), op, expected_version)
            new_value = edit(row)
            rules.check_fits(row, new_value, op)
            return await self.update_value(tx, row, new_value, op)

    async def update_value(self, tx: Tx, row: BlockRow, new_value: str, op: str) -> BlockRow:
        ts = now_ts()
        version = row.version + 1
        await tx.run(
            "UPDATE blocks SET value = ?, version = ?, updated_at = ? WHERE namespace = ? AND label = ?",
            (new_value, version, ts, self.namespace, row.label),
        )
        await self.record(tx, row.label, version, op, row.value, new_value, None, ts)
        return BlockRow(
            row.label,
            new_value,
            row.description,
            row.limit,
            row.read_only,
            version,
            row.created_at,
            ts,
            row.value,
        )

    async def append(self, label: str, content: str, expected_version: int | None = None) -> BlockRow:
        return await self.modify(
            label, Verb.APPEND, lambda row: rules.appended(row, content), expected_version
        )

    async def replace(
        self, label: str, old_str: str, new_str: str, expected_version: int | None = None
    ) -> BlockRow:
        rules.check_replace_args(old_str, new_str)
        return await self.modify(
            label, Verb.REPLACE, lambda row: rules.replaced(row, old_str, new_str), expected_version
        )

    async def insert(
        self, label: str, new_str: str, insert_line: int = -1, expected_version: int | None = None
    ) -> BlockRow:
        rules.refuse_line_prefixes(Verb.INSERT, new_str=new_str)
        return await self.modify(
            label, Verb.INSERT, lambda row: rules.inserted(row, new_str, insert_line), expected_version
        )

    async def rethink(self, label: str, new_memory: str, expected_version: int | None = None) -> BlockRow:
        rules.refuse_line_prefixes(Verb.RETHINK, new_memory=new_memory)
        return await self.modify(label, Verb.RETHINK, lambda _row: new_memory, expected_version)

    async def delete(self, label: str, expected_version: int | None = None) -> BlockRow:
        async with self.db.write() as tx:
            row = await self.writable(tx, label, await self.fetch(tx, label), Verb.DELETE, expected_version)
            await self.remove_row(tx, row, Verb.DELETE)
            return row

    async def remove_row(self, tx: Tx, row: BlockRow, op: str, *, renamed_to: str | None = None) -> None:
        await tx.run("DELETE FROM blocks WHERE namespace = ? AND label = ?", (self.namespace, row.label))
        meta = {**row.meta(), "created_at": row.created_at}
        if renamed_to is not None:
            meta["to"] = renamed_to
        await self.record(tx, row.label, row.version + 1, op, row.value, None, meta, now_ts())

    async def rename(self, label: str, new_label: str, expected_version: int | None = None) -> BlockRow:
        """Move a block to another label (its value, description, limit, read-only flag and times)."""
        rules.check_label(new_label)
        async with self.db.write() as tx:
            row = await self.writable(tx, label, await self.fetch(tx, label), Verb.RENAME, expected_version)
            if (taken := await self.fetch(tx, new_label)) is not None:
                raise rules.already_exists(taken)
            return await self.move_row(tx, row, new_label, Verb.RENAME)

    async def move_row(self, tx: Tx, row: BlockRow, new_label: str, op: str) -> BlockRow:
        await self.remove_row(tx, row, op, renamed_to=new_label)
        return await self.insert_row(
            tx, new_label, row.value, row.description, row.limit, row.read_only, op,
            version=row.version + 1, created_at=row.created_at, renamed_from=row.label,
        )  # fmt: skip

    async def undo(
        self, label: str, expected_version: int | None = None
    ) -> tuple[BlockRow | None, HistoryRow]:
        """Revert the most recent change to ``label`` not yet undone (repeat to go further back).

        Returns the block after the undo (``None`` when the undo removed a block that had just
        been created) and the history entry that was reverted.
        """
        async with self.db.write() as tx:
            h = await tx.one(
                f"SELECT {_HISTORY_COLS} FROM block_history WHERE namespace = ? AND label = ? AND undone = 0 "
                "AND op NOT IN ('undo', 'seed') ORDER BY id DESC LIMIT 1",
                (self.namespace, label),
            )
            row = await self.fetch(tx, label)
            if h is None:
                if row is None:
                    raise await self.unknown(tx, label)
                raise rules.nothing_to_undo(label)
            entry = _history(h)
            result: BlockRow | None
            if entry.op == Verb.RENAME and "to" in entry.meta:  # this label was renamed away
                raise rules.renamed_away(label, entry.meta["to"])
            if entry.op == Verb.RENAME:  # this label was renamed here: rename it back
                origin = entry.meta["from"]
                row = await self.writable(tx, label, row, Verb.UNDO, expected_version)
                if (taken := await self.fetch(tx, origin)) is not None:
                    raise rules.already_exists(taken)
                result = await self.move_row(tx, row, origin, Verb.UNDO)
                await tx.run(
                    "UPDATE block_history SET undone = 1 WHERE id = (SELECT max(id) FROM block_history "
                    "WHERE namespace = ? AND label = ? AND op = ?)",
                    (self.namespace, origin, Verb.RENAME.value),
                )
            elif entry.op == Verb.DELETE:
                if row is not None:
                    raise rules.recreated_since_delete(label)
                await self._check_room(tx)
                meta = entry.meta
                result = await self.insert_row(
                    tx,
                    label,
                    entry.old_value or "",
                    meta.get("description", ""),
                    int(meta.get("limit", self.default_limit)),
                    bool(meta.get("read_only", False)),
                    Verb.UNDO,
                    version=entry.version + 1,
                    created_at=float(meta["created_at"]) if "created_at" in meta else None,
                )
            else:
                row = await self.writable(tx, label, row, Verb.UNDO, expected_version)
                if entry.op == Verb.CREATE:
                    await self.remove_row(tx, row, Verb.UNDO)
                    result = None
                else:
                    result = await self.update_value(tx, row, entry.old_value or "", Verb.UNDO)
            await tx.run("UPDATE block_history SET undone = 1 WHERE id = ?", (entry.id,))
            return result, entry
