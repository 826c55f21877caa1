"""Export and import one namespace as a JSON document (``"format": "kernmind-memory"``).

Design: an export holds blocks (optionally with history), passages (id, content, tags, times,
``superseded_by``, thread and ``seq``) and conversations, not vectors; format 2 added ids,
``occurred_at`` and ``superseded_by``, format 3 threads; older documents import as before. An import is
one transaction: passages get new ids, a thread's passages go in ``seq`` order, conversations keep
their ids (importing twice adds them once).

Error policy: a document that is not an export, a bad label or thread, a block over the ceiling, an
existing label (unless ``overwrite``, or an untouched default block), a passage id given twice or
``superseded_by`` links that loop are refused (:class:`MemoryRefusal`); nothing is imported then.
"""

from __future__ import annotations

import uuid
from typing import Any

from kernmind.memory import blocks as rules
from kernmind.memory.conversations import check_roles
from kernmind.memory.errors import MemoryRefusal, Verb
from kernmind.memory.passages import check_thread, normalize_tags
from kernmind.memory.records import PassageIn, iso, now_ts, parse_when
from kernmind.memory.store import MemoryStore

FORMAT = "kernmind-memory"
FORMAT_VERSION = 3


async def export_namespace(store: MemoryStore, *, with_history: bool = False) -> dict[str, Any]:
    blocks = await store.blocks.list()
    passages = await store.passages.all()
    doc: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "namespace": store.namespace,
        "exported_at": iso(now_ts()),
        "blocks": [
            {
                "label": b.label,
                "value": b.value,
                "description": b.description,
                "limit": b.limit,
                "read_only": b.read_only,
                "version": b.version,
                "created_at": iso(b.created_at),
                "updated_at": iso(b.updated_at),
            }
            for b in blocks
        ],
        "passages": [
            {
                "id": p.id,
                "content": p.content,
                "tags": p.tags,
                "created_at": iso(p.created_at),
                "occurred_at": iso(p.occurred_at),
                "superseded_by": p.superseded_by,
                "thread": p.thread,
                "seq": p.seq,
            }
            for p in passages
        ],
        "conversations": [
            {
                **c,
                "started_at": iso(c["started_at"]),
                "messages": [{**m, "at": iso(m["at"])} for m in c["messages"]],
            }
            for c in await store.conversations.export()
        ],
    }
    if with_history:
        async with store.db.read() as tx:
            rows = await tx.all(
                "SELECT label, version, op, old_value, new_value, at FROM block_history WHERE namespace = ? "
                "ORDER BY id",
                (store.namespace,),
            )
        doc["history"] = [
            {"label": h[0], "version": h[1], "op": h[2], "old": h[3], "new": h[4], "at": iso(h[5])}
            for h in rows
        ]
    return doc


async def import_namespace(
    store: MemoryStore, doc: dict[str, Any], *, overwrite: bool = False
) -> dict[str, int]:
    """Load an export into ``store``'s namespace in one transaction (all or nothing).

    A block whose label exists is refused unless ``overwrite`` or the block is an untouched
    default (empty, version 1); then its value, description, limit and read-only flag are
    overwritten as a new version, recorded as op ``import``. Passages identical to one
    already stored (same content, tags and time) are skipped, and keep their own
    ``superseded_by``; each passage the import adds is linked to its successor's new id.
    """
    if doc.get("format") != FORMAT:
        raise MemoryRefusal('not a kernmind memory export (missing "format": "kernmind-memory").')
    stats = {
        "blocks_created": 0,
        "blocks_replaced": 0,
        "passages_added": 0,
        "passages_skipped": 0,
        "conversations_added": 0,
        "conversations_skipped": 0,
    }
    conversations = doc.get("conversations") or []
    for c in conversations:
        for m in c.get("messages") or []:
            check_roles([str(m.get("role"))])
    blocks, passages = store.blocks, store.passages
    docs = doc.get("passages") or []
    items = [
        PassageIn(
            str(p.get("content", "")),
            [str(t) for t in p.get("tags") or []],
            parse_when(str(p["created_at"])) if p.get("created_at") else None,
            occurred_at=parse_when(str(p["occurred_at"])) if p.get("occurred_at") else None,
            thread=check_thread(str(p["thread"])) if p.get("thread") is not None else None,
        )
        for p in docs
    ]
    for item in items:
        passages.check(item.content)
    doc_ids, successors = supersede_links(docs)
    order = thread_order(items, [p.get("seq") for p in docs])
    async with store.db.write() as tx:
        for b in doc.get("blocks") or []:
            label = str(b["label"])
            rules.check_label(label)
            value = str(b.get("value", ""))
            if len(value) > blocks.max_limit:
                raise MemoryRefusal(
                    "block {label!r} in the export holds {chars} characters, more than this server's ceiling "
                    "of {ceiling} per block; shorten it in the export (long material belongs in archival memory).",
                    label=label,
                    chars=len(value),
                    ceiling=blocks.max_limit,
                )
            description = str(b.get("description", ""))
            limit = min(max(int(b.get("limit", blocks.default_limit)), len(value), 1), blocks.max_limit)
            read_only = bool(b.get("read_only", False))
            row = await blocks.fetch(tx, label)
            if row is None:
                await blocks.insert_row(tx, label, value, description, limit, read_only, Verb.IMPORT)
                stats["blocks_created"] += 1
                continue
            if not overwrite and not (row.value == "" and row.version == 1):  # untouched default block
                raise MemoryRefusal(
                    "block {label!r} already exists in namespace {namespace!r}; use {overwrite} to overwrite "
                    "existing blocks.",
                    label=label,
                    namespace=store.namespace,
                )
            ts = now_ts()
            await tx.run(
                "UPDATE blocks SET value = ?, description = ?, char_limit = ?, read_only = ?, "
                "version = version + 1, updated_at = ? WHERE namespace = ? AND label = ?",
                (value, description, limit, int(read_only), ts, store.namespace, label),
            )
            meta = {"description": description, "limit": limit, "read_only": read_only}
            await blocks.record(tx, label, row.version + 1, Verb.IMPORT, row.value, value, meta, ts)
            stats["blocks_replaced"] += 1
        new_ids: dict[int, int] = {}  # document id -> id here
        added: set[int] = set()  # document ids of passages this import adds
        for i in order:
            doc_id, item = doc_ids[i], items[i]
            item.tags = normalize_tags(item.tags)
            twin = None
            if item.created_at is not None:
                twin = await passages.find_in(tx, item.content, item.tags, item.created_at)
            if twin is not None:
                stats["passages_skipped"] += 1
            else:
                twin, _ = await passages.add_in(tx, item)
                stats["passages_added"] += 1
                if doc_id is not None:
                    added.add(doc_id)
            if doc_id is not None:
                new_ids[doc_id] = twin
        linked = 0
        for doc_id, successor in successors.items():
            if doc_id in added and successor in new_ids:
                linked += await tx.run(
                    "UPDATE passages SET superseded_by = ? WHERE id = ? AND namespace = ?",
                    (new_ids[successor], new_ids[doc_id], store.namespace),
                )
        await passages.bump_generation(tx, rewrite=linked > 0)
        for c in conversations:
            cid = str(c.get("id") or uuid.uuid4().hex)
            started = parse_when(str(c["started_at"])) if c.get("started_at") else now_ts()
            if not await store.conversations.start_in(tx, cid, str(c.get("title", "")), started):
                stats["conversations_skipped"] += 1  # imported before (same id)
                continue
            for m in c.get("messages") or []:
                at = parse_when(str(m["at"])) if m.get("at") else None
                await store.conversations.add_in(
                    tx, cid, str(m["role"]), str(m.get("content", "")), m.get("meta"), at
                )
            stats["conversations_added"] += 1
        await store.conversations.bump_generation(tx)
    return stats


def thread_order(items: list[PassageIn], seqs: list[Any]) -> list[int]:
    """The order to add passages in: the document's, except that each thread's passages take that
    thread's places in the order of their ``seq`` (passages without one stay where they are)."""
    places: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        if item.thread is not None:
            places.setdefault(item.thread, []).append(i)
    order = list(range(len(items)))

    def position(i: int) -> tuple[int, int]:
        seq = seqs[i]
        return (seq, i) if isinstance(seq, int) and not isinstance(seq, bool) else (2**62, i)

    for spots in places.values():
        for spot, i in zip(spots, sorted(spots, key=position), strict=True):
            order[spot] = i
    return order


def supersede_links(docs: list[Any]) -> tuple[list[int | None], dict[int, int]]:
    """Each exported passage's document id (None: a version-1 document), and the
    ``superseded_by`` links between them; refuses ids given twice and links that loop."""
    ids: list[int | None] = []
    for p in docs:
        raw = p.get("id")
        ids.append(raw if isinstance(raw, int) and not isinstance(raw, bool) else None)
    seen = [i for i in ids if i is not None]
    if len(seen) != len(set(seen)):
        twice = sorted({i for i in seen if seen.count(i) > 1})
        raise MemoryRefusal(
            "passage ids {twice} appear more than once in the export; nothing was imported.", twice=twice
        )
    links = {
        i: p["superseded_by"]
        for i, p in zip(ids, docs, strict=True)
        if i is not None and isinstance(p.get("superseded_by"), int) and p["superseded_by"] != i
    }
    for start in links:
        at, steps = start, 0
        while at in links:
            at, steps = links[at], steps + 1
            if steps > len(links):
                raise MemoryRefusal(
                    "the superseded_by links of passage {id} in the export go round in a loop; nothing was imported.",
                    id=start,
                )
    return ids, links
