"""Upgrade: the memory the server's own token kept apart joins the local user's (docs/security.md).

Design: before round 4 the ``--token`` principal's memory lived in ``default/<agent>``; opening
``<agent>`` moves whatever that still holds into it, in one write transaction, nothing dropped: a
conversation id both hold becomes ``<id>-from-http``; of two blocks with content under one label the
old becomes ``<label>-from-http`` (each rename returned as a sentence), an untouched default block
gives way. Once moved, the check is three indexed look-ups that find nothing.

Error policy: a failure rolls back (both namespaces as they were); the caller logs it and starts
anyway, and the next start tries again.
"""

from __future__ import annotations

import logging

from kernmind.memory.blocks import MAX_LABEL_CHARS
from kernmind.memory.database import Tx
from kernmind.memory.store import MemoryStore

log = logging.getLogger(__name__)

LEGACY_OWNER = "default"  # the --token principal's data key before round 4
SUFFIX = "-from-http"


def legacy_namespace(namespace: str) -> str | None:
    """Where an earlier version kept the --token principal's ``namespace`` (None: not the local
    user's namespace, which has no ``/``)."""
    return None if "/" in namespace else f"{LEGACY_OWNER}/{namespace}"


async def merge_legacy(store: MemoryStore) -> list[str]:
    """Move what ``default/<namespace>`` holds into ``store``'s namespace; sentences saying what
    moved and what was renamed (empty when there was nothing to move)."""
    old = legacy_namespace(store.namespace)
    if old is None:
        return []
    async with store.db.read() as tx:
        found = [
            await tx.one(f"SELECT 1 FROM {table} WHERE namespace = ? LIMIT 1", (old,))
            for table in ("blocks", "passages", "conversations")
        ]
    if not any(found):
        return []
    new = store.namespace
    said: list[str] = []
    async with store.db.write() as tx:
        await tx.run(
            "INSERT INTO namespaces (namespace, created_at) SELECT ?, created_at FROM namespaces "
            "WHERE namespace = ? ON CONFLICT DO NOTHING",
            (new, old),
        )
        blocks = await _merge_blocks(tx, old, new, said)
        passages = await tx.run("UPDATE passages SET namespace = ? WHERE namespace = ?", (new, old))
        await tx.run("UPDATE passage_tags SET namespace = ? WHERE namespace = ?", (new, old))
        conversations = await _merge_conversations(tx, old, new, said)
        await tx.run(
            "UPDATE namespaces SET archive_gen = archive_gen + 1, conversation_gen = conversation_gen + 1, "
            "archive_rewrites = archive_rewrites + 1, conversation_rewrites = conversation_rewrites + 1 "
            "WHERE namespace = ?",
            (new,),
        )
        await tx.run("DELETE FROM namespaces WHERE namespace = ?", (old,))
    said.insert(
        0,
        f"memory upgrade: moved what the server's own token kept in namespace {old!r} into {new!r} "
        f"({blocks} blocks, {passages} passages, {conversations} conversations): the stdio user and "
        "the --token principal are one principal now.",
    )
    for sentence in said:
        log.warning("%s", sentence)
    return said


async def _merge_blocks(tx: Tx, old: str, new: str, said: list[str]) -> int:
    moved = 0
    for label, value, version in await tx.all(
        "SELECT label, value, version FROM blocks WHERE namespace = ? ORDER BY label", (old,)
    ):
        here = await tx.one(
            "SELECT value, version FROM blocks WHERE namespace = ? AND label = ?", (new, label)
        )
        target = label
        if here is not None:
            if value == "" and version == 1:  # the old side's untouched default: nothing to keep
                await _drop_block(tx, old, label)
                continue
            if here[0] == "" and here[1] == 1:  # ours is the untouched default: theirs takes its place
                await _drop_block(tx, new, label)
            else:
                target = await _free_label(tx, new, label)
                said.append(
                    f"memory upgrade: both namespaces had a block {label!r}; the one from {old!r} is "
                    f"kept as {target!r} (nothing was overwritten)."
                )
        for table in ("blocks", "block_history"):
            await tx.run(
                f"UPDATE {table} SET namespace = ?, label = ? WHERE namespace = ? AND label = ?",
                (new, target, old, label),
            )
        moved += 1
    # History of blocks deleted earlier in the old namespace goes along (it is history, not a block).
    await tx.run("UPDATE block_history SET namespace = ? WHERE namespace = ?", (new, old))
    return moved


async def _drop_block(tx: Tx, namespace: str, label: str) -> None:
    for table in ("blocks", "block_history"):
        await tx.run(f"DELETE FROM {table} WHERE namespace = ? AND label = ?", (namespace, label))


async def _free_label(tx: Tx, namespace: str, label: str) -> str:
    n = 1
    while True:
        tail = SUFFIX if n == 1 else f"{SUFFIX}-{n}"
        candidate = label[: MAX_LABEL_CHARS - len(tail)] + tail
        if (
            await tx.one("SELECT 1 FROM blocks WHERE namespace = ? AND label = ?", (namespace, candidate))
            is None
        ):
            return candidate
        n += 1


async def _merge_conversations(tx: Tx, old: str, new: str, said: list[str]) -> int:
    moved = 0
    for (cid,) in await tx.all("SELECT id FROM conversations WHERE namespace = ? ORDER BY id", (old,)):
        target = cid
        n = 1
        while await tx.one("SELECT 1 FROM conversations WHERE namespace = ? AND id = ?", (new, target)):
            target = f"{cid}{SUFFIX}" if n == 1 else f"{cid}{SUFFIX}-{n}"
            n += 1
        if target != cid:
            said.append(
                f"memory upgrade: conversation {cid!r} existed in both namespaces; kept as {target!r}."
            )
        await tx.run(
            "UPDATE messages SET namespace = ?, conversation_id = ? WHERE namespace = ? AND conversation_id = ?",
            (new, target, old, cid),
        )
        await tx.run(
            "UPDATE conversations SET namespace = ?, id = ? WHERE namespace = ? AND id = ?",
            (new, target, old, cid),
        )
        moved += 1
    return moved
