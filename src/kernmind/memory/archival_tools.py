"""The archival tools (``archival_memory_*``) and ``conversation_search`` on an MCP server.

Design: thin wrappers over archival.py and conversations.py (docs/tools.md, "Archival memory"):
schemas check arguments, :func:`errors.call` words refusals, results are pydantic models. A search
says how it ranked (``mode``) and what to know (``note``), and keeps to the output budget (budget.py):
messages clipped to ``MESSAGE_CLIP_CHARS``, a note naming the ``page`` and ``top_k`` that continue.

Error policy: bad arguments are refusals saying what to send instead; an unavailable embedder never
fails a call.
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

from kernmind import input_limits as limits
from kernmind.budget import Budget, left_out, listed_size, next_page
from kernmind.config import Settings
from kernmind.memory.archival import Archive, InsertOutcome, SearchOutcome
from kernmind.memory.block_results import clip
from kernmind.memory.conversations import MessageSearch, search_messages
from kernmind.memory.errors import call
from kernmind.memory.recall import Recall
from kernmind.memory.records import PassageRow, iso
from kernmind.memory.store import MemoryStore


class Host(Protocol):
    """What the archival tools need from memory's surface (tools.py's ``MemoryTools``)."""

    settings: Settings

    @property
    def store(self) -> MemoryStore: ...

    @property
    def archive(self) -> Archive: ...

    @property
    def messages(self) -> Recall: ...


MESSAGE_CLIP_CHARS = 2000
ENVELOPE_CHARS = (
    500  # a search result's fields besides its list (mode, page, top_k) and a note on what was left out
)
SCORE = (
    "how well it matches, from 0 to 1 (higher is better): the share of the query's words it holds, fused with "
    "how close it is in meaning; null when listing the newest"
)
MATCH = "what matched: 'words' (the query's words), 'meaning' (no word, but close in meaning) or 'both'"
Match = Literal["words", "meaning", "both"]


class Passage(BaseModel):
    id: int
    content: str
    tags: list[str]
    created_at: str = Field(description="when it was stored")
    occurred_at: str = Field(description="when the fact happened or was said (what date filters read)")
    score: float | None = Field(description=SCORE)
    match: Match | None = Field(default=None, description=MATCH)
    superseded_by: int | None = Field(
        default=None,
        description="the passage that replaced this one (only with include_superseded); null: current",
    )
    thread: str | None = Field(
        default=None, description="the conversation, session or document it belongs to (null: none)"
    )

    @classmethod
    def of(cls, r: PassageRow) -> Passage:
        return cls(
            id=r.id, content=r.content, tags=r.tags, created_at=iso(r.created_at),
            occurred_at=iso(r.occurred_at), score=r.score, match=r.match, superseded_by=r.superseded_by,
            thread=r.thread,
        )  # fmt: skip


class ArchivalInsertResult(BaseModel):
    id: int = Field(
        description="the passage holding the text: the new one, or the duplicate that already did"
    )
    created_at: str
    occurred_at: str
    duplicate_of: int | None = Field(
        description="set when a live passage already said this (case and whitespace aside): nothing new was stored"
    )
    superseded: list[int] = Field(description="passages this one now supersedes")
    similar: list[int] = Field(
        default_factory=list,
        description="live passages close in meaning (possible restatements or older versions): see note",
    )
    embedded: bool = Field(description="whether the passage has an embedding (meaning search)")
    thread: str | None = Field(default=None, description="the thread it belongs to (null: none)")
    note: str | None = None

    @classmethod
    def of(cls, out: InsertOutcome) -> ArchivalInsertResult:
        return cls(
            id=out.id, created_at=iso(out.created_at), occurred_at=iso(out.occurred_at),
            duplicate_of=out.duplicate_of, superseded=out.superseded, similar=out.similar,
            embedded=out.embedded, thread=out.thread, note=out.note,
        )  # fmt: skip


class ArchivalSearchResult(BaseModel):
    results: list[Passage] = Field(description="best first")
    mode: Literal["bm25", "hybrid", "recent", "time"] = Field(
        description="bm25: full text; hybrid: full text fused with embeddings; recent: empty query, newest "
        "first; time: empty query with a date range or thread, in the order the passages happened"
    )
    note: str | None = Field(
        default=None,
        description="e.g. why search fell back to full text, or which page and top_k return the results "
        "left out to stay within the output budget",
    )
    page: int
    top_k: int

    @classmethod
    def of(cls, out: SearchOutcome, *, page: int, top_k: int, budget: Budget) -> ArchivalSearchResult:
        """The page's passages that fit ``budget`` (the first one cut when it alone does not),
        and a note naming the page and ``top_k`` that return the ones left out."""
        notes = [out.note] if out.note else []
        budget.spend(ENVELOPE_CHARS + len(out.note or ""))
        results: list[Passage] = []
        for row in out.results:
            passage = Passage.of(row)
            size = listed_size(passage)
            if budget.admit(size):
                results.append(passage)
                continue
            if results:
                break
            fields = size - len(passage.content)  # one passage longer than the whole budget: its start
            passage.content, cut = Budget(max(budget.left - fields, 0)).take(
                passage.content,
                more=f"passage {row.id} is longer than one answer may be (the server's --max-output-chars).",
            )
            budget.spend(fields + len(passage.content))
            results.append(passage)
            notes.append(cut or "")
        if len(results) < len(out.results):
            if out.mode == "time" and out.note:  # its "passages n-m, next page=…" no longer holds
                notes.remove(out.note)
            size, nxt = next_page(page, top_k, len(results))
            how = f"call archival_memory_search again with top_k={size}, page={nxt} for the next ones"
            notes.append(left_out(len(out.results) - len(results), "passages of this page", budget, how))
        return cls(results=results, mode=out.mode, note=" ".join(notes) or None, page=page, top_k=top_k)


class ArchivalDeleteResult(BaseModel):
    id: int
    deleted: bool
    content: str = Field(
        description="the deleted passage's text (its start, when longer than the output budget)"
    )
    restored: list[int] = Field(
        default_factory=list, description="passages this one had superseded, live (searchable) again"
    )
    note: str | None = None


class Message(BaseModel):
    id: int
    conversation_id: str
    role: str
    content: str = Field(description=f"the message, clipped to {MESSAGE_CLIP_CHARS} characters")
    created_at: str
    score: float | None = Field(description=SCORE)
    match: Match | None = Field(default=None, description=MATCH)


class ConversationSearchResult(BaseModel):
    results: list[Message] = Field(description="best first")
    mode: Literal["bm25", "hybrid", "recent"]
    note: str | None = None

    @classmethod
    def of(cls, out: MessageSearch, budget: Budget) -> ConversationSearchResult:
        """The matches that fit ``budget``, each clipped to ``MESSAGE_CLIP_CHARS``."""
        results: list[Message] = []
        note = out.note
        budget.spend(ENVELOPE_CHARS + len(note or ""))
        for r in out.results:
            message = Message(
                id=r.id, conversation_id=r.conversation_id, role=r.role,
                content=clip(r.content, MESSAGE_CLIP_CHARS) or "", created_at=iso(r.created_at),
                score=r.score, match=r.match,
            )  # fmt: skip
            if not budget.admit(listed_size(message), first=not results):
                how = "narrow the query, roles or dates (start_date/end_date) to reach them"
                note = (note + "; " if note else "") + left_out(
                    len(out.results) - len(results), "matches", budget, how
                )
                break
            results.append(message)
        return cls(results=results, mode=out.mode, note=note)  # type: ignore[arg-type]


def register_archival_tools(memory_tools: Host, server: MCPServer) -> None:

    @server.tool(
        description=(
            "Store a passage in long-term archival memory (searchable later by words, and by meaning "
            "when embeddings are configured). Tag it for filtering. Give occurred_at when the fact happened "
            "or was said at another time than now (date filters in search read it). When a fact changes "
            "(a new address, a changed plan), pass the ids of the passages it replaces in supersedes: they "
            "are kept but left out of searches (deleting the new passage brings them back). Text a current "
            "passage already holds is not stored twice; the result's note names passages close in meaning."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    )
    async def archival_memory_insert(
        content: Annotated[str, Field(description="The text to remember.")],
        tags: Annotated[
            list[str], Field(description="Tags for filtering searches.", max_length=limits.TAGS)
        ] = [],  # noqa: B006
        occurred_at: Annotated[
            str | None,
            Field(
                description=(
                    "When the fact happened or was said: ISO date ('2023-05-07') or datetime "
                    "('2023-05-07T18:30:00Z'; without an offset it is UTC). Default: now."
                ),
                max_length=limits.DATE_CHARS,
            ),
        ] = None,
        supersedes: Annotated[
            list[int],
            Field(
                description=(
                    "Ids of current passages this one replaces (from archival_memory_search). They stay "
                    "stored, marked superseded_by this passage, and searches leave them out unless "
                    "include_superseded is true. A passage already superseded cannot be superseded again: "
                    "name its newer version."
                ),
                max_length=limits.TAGS,
            ),
        ] = [],  # noqa: B006
        thread: Annotated[
            str | None,
            Field(
                description=(
                    "A short label grouping passages that belong together: one conversation, session or "
                    "document (e.g. 'call-2024-03-12'). Passages of a thread keep the order they were "
                    "inserted in; search reads each with its neighbours and can filter on the thread."
                ),
                max_length=limits.THREAD_CHARS,
            ),
        ] = None,
    ) -> ArchivalInsertResult:
        out = await call(
            memory_tools.archive.insert(
                content, tags, occurred_at=occurred_at, supersedes=supersedes, thread=thread
            )
        )
        return ArchivalInsertResult.of(out)

    @server.tool(
        description=(
            "Search archival memory, best match first. Full-text ranking matches word forms and "
            "passages with only some of the words; with embeddings configured it also ranks by meaning. "
            "Filters (tags, dates) apply before top_k and paging; the dates are when the facts happened "
            "(occurred_at). Passages replaced by newer ones (superseded) are left out unless "
            "include_superseded is true. An empty query with start_datetime/end_datetime or thread lists those "
            "passages in the order they happened (a thread: in its order), paged; with neither, the newest."
        ),
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
    async def archival_memory_search(
        query: Annotated[
            str,
            Field(
                description=(
                    "What to look for; leave it out (or empty) with a date range or thread to list those "
                    "passages in order."
                ),
                max_length=limits.QUERY_CHARS,
            ),
        ] = "",
        tags: Annotated[
            list[str] | None, Field(description="Only passages with these tags.", max_length=limits.TAGS)
        ] = None,
        tag_match_mode: Annotated[
            Literal["any", "all"], Field(description="'any': at least one tag; 'all': every tag.")
        ] = "any",
        top_k: Annotated[int, Field(description="Results per page.", ge=1, le=100)] = 10,
        start_datetime: Annotated[
            str | None,
            Field(
                description="Only passages whose fact occurred at or after this ISO date/datetime (UTC).",
                max_length=limits.DATE_CHARS,
            ),
        ] = None,
        end_datetime: Annotated[
            str | None,
            Field(
                description=(
                    "Only passages whose fact occurred before this ISO datetime (a date alone includes that day)."
                ),
                max_length=limits.DATE_CHARS,
            ),
        ] = None,
        page: Annotated[int, Field(description="Page of results, from 0.", ge=0)] = 0,
        include_superseded: Annotated[
            bool,
            Field(
                description=(
                    "Also return passages replaced by newer ones (each says superseded_by): the history of "
                    "a fact that changed."
                )
            ),
        ] = False,
        thread: Annotated[
            str | None,
            Field(description="Only passages of this thread.", max_length=limits.THREAD_CHARS),
        ] = None,
    ) -> ArchivalSearchResult:
        out = await call(
            memory_tools.archive.search(
                query,
                tags=tags,
                tag_match_mode=tag_match_mode,
                top_k=top_k,
                start_datetime=start_datetime,
                end_datetime=end_datetime,
                page=page,
                include_superseded=include_superseded,
                thread=thread,
            )
        )
        return ArchivalSearchResult.of(out, page=page, top_k=top_k, budget=Budget.of(memory_tools.settings))

    @server.tool(
        description=(
            "Delete a passage from archival memory by id (from archival_memory_search). Passages it had "
            "superseded become current again."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
    )
    async def archival_memory_delete(
        id: Annotated[int, Field(description="The passage id.")],
    ) -> ArchivalDeleteResult:
        row, restored = await call(memory_tools.archive.delete(id))
        budget = Budget.of(memory_tools.settings)
        budget.spend(ENVELOPE_CHARS + 8 * len(restored))
        content, note = budget.take(
            row.content, more="the passage is deleted; this is the start of its text."
        )
        return ArchivalDeleteResult(id=row.id, deleted=True, content=content, restored=restored, note=note)


def register_conversation_search(memory_tools: Host, server: MCPServer) -> None:
    @server.tool(
        description=(
            "Search past conversations (what the user and you said, your tool calls and their results), "
            "best match first, by words and by meaning. roles narrows to some of user, assistant, tool, "
            "system; start_date/end_date (ISO 8601) to a time range. An empty query lists the newest messages."
        ),
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
    async def conversation_search(
        query: Annotated[str, Field(description="What to look for.", max_length=limits.QUERY_CHARS)],
        roles: Annotated[
            list[Literal["user", "assistant", "tool", "system"]] | None,
            Field(description="Only messages with these roles."),
        ] = None,
        limit: Annotated[int, Field(description="Most messages to return.", ge=1, le=100)] = 10,
        start_date: Annotated[
            str | None,
            Field(
                description="Only messages at or after this ISO date/datetime (UTC).",
                max_length=limits.DATE_CHARS,
            ),
        ] = None,
        end_date: Annotated[
            str | None,
            Field(
                description="Only messages before this ISO datetime (a date alone includes that day).",
                max_length=limits.DATE_CHARS,
            ),
        ] = None,
    ) -> ConversationSearchResult:
        out = await call(
            search_messages(
                memory_tools.messages, memory_tools.store.conversations, query,
                roles=roles, limit=limit, start_date=start_date, end_date=end_date,
            )
        )  # fmt: skip
        return ConversationSearchResult.of(out, Budget.of(memory_tools.settings))
