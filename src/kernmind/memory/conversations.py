"""Conversation memory: what was said, kept per namespace and searchable like archival memory
(docs/tools.md, "Conversation memory").

Design: a conversation is a ``conversations`` row and its messages in order (``user``, ``assistant``
with its tool calls as text, ``tool``, ``system``), each a text of the corpus: full text (with
fulltext.py's bigrams) and a vector, ranked by recall.py. The filter and SQL shapes both backends use
live in records.py, so sqlite.py and postgres.py never import this module.

Error policy: an unknown role or a malformed date is refused (:class:`MemoryRefusal`); the recorder
never raises into the agent (recorder.py).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from kernmind.memory.database import TextHits, Tx
from kernmind.memory.errors import MemoryRefusal
from kernmind.memory.fulltext import NO_TERMS_NOTE, index_text, query_terms
from kernmind.memory.recall import Recall
from kernmind.memory.records import (
    MESSAGE_COLUMNS,
    Facets,
    MessageFilter,
    MessageRow,
    message_row,
    now_ts,
    time_range,
)
from kernmind.memory.texts import TextTable

log = logging.getLogger(__name__)

ROLES = ("user", "assistant", "tool", "system")
MAX_MESSAGE_CHARS = 100_000  # what one message may store (a tool result beyond this is cut)


def check_roles(roles: Sequence[str] | None) -> tuple[str, ...]:
    unknown = [r for r in roles or () if r not in ROLES]
    if unknown:
        raise MemoryRefusal(
            "roles {unknown} are not message roles; use some of {roles}.", unknown=unknown, roles=list(ROLES)
        )
    return tuple(dict.fromkeys(roles or ()))


def message_text(message: dict[str, Any]) -> str:
    """An OpenAI-style chat message as searchable text (tool calls spelled out, images noted)."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [
            p.get("text", "") if p.get("type") == "text" else "[image]"
            for p in content
            if isinstance(p, dict)
        ]
        text = "\n".join(x for x in parts if x)
    else:
        text = str(content or "")
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        text += f"\n[called {fn.get('name', '?')} with {fn.get('arguments', '')}]"
    return text.strip()[:MAX_MESSAGE_CHARS]


class Conversations(TextTable):
    """The recorded conversations of one namespace (vector bookkeeping: texts.py)."""

    table = "messages"
    generation_column = "conversation_gen"
    rewrite_column = "conversation_rewrites"

    label_column = "role"
    thread_column = "conversation_id"  # a conversation is a thread; ``seq`` its messages' order

    def labels(self, value: str) -> list[str]:
        return [value]

    def facets(self, where: MessageFilter) -> Facets:
        return Facets(where.roles, False, where.start, where.end)

    async def start(
        self, title: str = "", started_at: float | None = None, conversation_id: str | None = None
    ) -> str:
        cid = conversation_id or uuid.uuid4().hex
        async with self.db.write() as tx:
            await self.start_in(tx, cid, title, started_at or now_ts())
        return cid

    async def start_in(self, tx: Tx, cid: str, title: str, started_at: float) -> bool:
        """Create the conversation unless it exists; whether it was created."""
        return (
            await tx.run(
                "INSERT INTO conversations (id, namespace, started_at, title) VALUES (?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (cid, self.namespace, started_at, title),
            )
            == 1
        )

    async def add(self, conversation_id: str, role: str, content: str, **details: Any) -> int:
        """One message (``details``: those of :meth:`add_in`) in its own transaction."""
        async with self.db.write() as tx:
            pid = await self.add_in(tx, conversation_id, role, content, **details)
            await self.bump_generation(tx)
        return pid

    async def add_in(
        self,
        tx: Tx,
        conversation_id: str,
        role: str,
        content: str,
        meta: dict[str, Any] | None = None,
        created_at: float | None = None,
        embedding: bytes | None = None,
        embedding_model: str | None = None,
    ) -> int:
        check_roles([role])
        seq_row = await tx.one(
            "SELECT coalesce(max(seq), 0) + 1 FROM messages WHERE namespace = ? AND conversation_id = ?",
            (self.namespace, conversation_id),
        )
        row = await tx.one(
            "INSERT INTO messages (namespace, conversation_id, seq, role, content, meta, created_at, search_text, "
            "embedding, embedding_model) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                self.namespace, conversation_id, seq_row[0] if seq_row else 1, role, content,
                json.dumps(meta) if meta else None, created_at or now_ts(), index_text(content),
                embedding, embedding_model,
            ),
        )  # fmt: skip
        assert row is not None
        if embedding is not None and embedding_model is not None:
            self.expect_vector(embedding_model, len(embedding))
        return int(row[0])

    async def search_text(
        self, query: str, where: MessageFilter, limit: int, offset: int = 0
    ) -> list[MessageRow]:
        return await self.db.message_text.search(self.namespace, query, where, limit, offset)

    async def rank_text(self, query: str, where: MessageFilter, limit: int) -> TextHits:
        return await self.db.message_text.rank(self.namespace, query, where, limit)

    async def get(self, ids: Sequence[int]) -> dict[int, MessageRow]:
        return {r[0]: message_row(r) for r in await self.rows_by_id(MESSAGE_COLUMNS, ids)}

    async def export(self) -> list[dict[str, Any]]:
        """Every conversation with its messages, oldest first (for transfer.py)."""
        async with self.db.read() as tx:
            convs = await tx.all(
                "SELECT id, started_at, title FROM conversations WHERE namespace = ? ORDER BY started_at, id",
                (self.namespace,),
            )
            msgs = await tx.all(
                "SELECT conversation_id, role, content, meta, created_at FROM messages WHERE namespace = ? "
                "ORDER BY conversation_id, seq",
                (self.namespace,),
            )
        by_conv: dict[str, list[dict[str, Any]]] = {}
        for cid, role, content, meta, created_at in msgs:
            by_conv.setdefault(cid, []).append(
                {
                    "role": role,
                    "content": content,
                    "meta": json.loads(meta) if meta else None,
                    "at": created_at,
                }
            )
        return [
            {"id": c[0], "started_at": c[1], "title": c[2], "messages": by_conv.get(c[0], [])} for c in convs
        ]


@dataclass(slots=True)
class MessageSearch:
    results: list[MessageRow]
    mode: str
    note: str | None


async def search_messages(
    recall: Recall,
    conversations: Conversations,
    query: str,
    *,
    roles: Sequence[str] | None = None,
    limit: int = 10,
    start_date: str | None = None,
    end_date: str | None = None,
) -> MessageSearch:
    """Messages best first (hybrid like archival search); an empty query lists the newest."""
    if not 1 <= limit <= 100:
        raise MemoryRefusal("limit must be between 1 and 100, got {limit}.", limit=limit)
    start, end = time_range(start_date, end_date)
    where = MessageFilter(check_roles(roles), start, end)
    if not query.strip():
        return MessageSearch(await conversations.search_text("", where, limit), "recent", None)
    if not query_terms(query):
        return MessageSearch([], "bm25", NO_TERMS_NOTE)
    ranked = await recall.rank(query, where, limit, 0)
    misfit = conversations.misfit_note(recall, "messages")
    return MessageSearch(ranked.rows, ranked.mode, " ".join(n for n in (ranked.note, misfit) if n) or None)
