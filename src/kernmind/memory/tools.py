"""The MCP surface of memory: block tools, archival tools, block resources and the ``memory`` prompt.

``server.py`` does exactly::

    memory = MemoryTools(settings)
    memory.register(server)          # tools, resources, prompt
    async with memory.running():     # inside the server's lifespan: opens the store
        ...

Design
------
* Tools are thin: validate, call the store/archive (block_store.py, archival.py), shape a
  pydantic result (so clients get ``outputSchema`` + ``structuredContent``), then notify.
* Every block write publishes ``resource updated`` for ``memory://blocks/{label}`` (and the
  listing ``memory://blocks`` when blocks appear or disappear) through the SDK's
  subscription bus, which serves ``subscriptions/listen`` streams (2026-07-28 clients). For
  handshake-era clients (2025-11-25) the legacy ``resources/subscribe``/``unsubscribe``
  requests are served too and subscribed sessions get ``notifications/resources/updated``.
  Notifications are best effort: a failure to notify never fails the write.
* The store is opened in :meth:`MemoryTools.running` (the server's lifespan); tools called
  before that get a clear error.

Error policy
------------
Anything the model can fix raises ``ToolError`` (an ``isError`` result with our text) saying
what to do instead; the store guarantees a refused write changed nothing. Unexpected
exceptions propagate to the SDK, which logs them and reports a generic tool error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Annotated, Any, Literal, TypeVar

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp_types import EmptyResult, SubscribeRequestParams, ToolAnnotations, UnsubscribeRequestParams
from pydantic import BaseModel, Field

from kernmind.config import Settings
from kernmind.memory.archival import Archive
from kernmind.memory.block_results import (
    Block,
    BlockDeleted,
    BlockHistory,
    BlockInfo,
    BlockList,
    BlockWrite,
    HistoryEntry,
    UndoResult,
    render_blocks,
)
from kernmind.memory.embeddings import Embedder, EmbeddingUnavailable, make_embedder
from kernmind.memory.errors import BLOCK_TOOL_WORDS, MemoryRefusal, Words
from kernmind.memory.memory_tool import DIALECT_WORDS, MemoryDirectory, label_of
from kernmind.memory.records import iso
from kernmind.memory.store import MemoryStore
from kernmind.sdk_compat import lowlevel_server, session_connection

log = logging.getLogger(__name__)

BLOCKS_URI = "memory://blocks"
T = TypeVar("T")

Label = Annotated[
    str, Field(description="The block's label, e.g. 'human' or 'persona' ('/' for folders).", max_length=200)
]
ExpectedVersion = Annotated[
    int | None,
    Field(description="Refuse the write unless the block is at this version (from memory_read/memory_list)."),
]


class Passage(BaseModel):
    id: int
    content: str
    tags: list[str]
    created_at: str
    score: float | None = Field(description="higher is better (bm25, or fused rank score in hybrid mode)")


class ArchivalInsertResult(BaseModel):
    id: int
    created_at: str
    embedded: bool = Field(description="whether the passage got an embedding (meaning search)")
    note: str | None = None


class ArchivalSearchResult(BaseModel):
    results: list[Passage] = Field(description="best first")
    mode: Literal["bm25", "hybrid", "recent"] = Field(
        description="bm25: full text; hybrid: full text fused with embeddings; recent: empty query, newest first"
    )
    note: str | None = Field(default=None, description="e.g. why search fell back to full text")
    page: int
    top_k: int


class ArchivalDeleteResult(BaseModel):
    id: int
    deleted: bool
    content: str


def block_uri(label: str) -> str:
    return f"{BLOCKS_URI}/{label}"


class MemoryTools:
    """Owns the memory store for one server and registers the memory surface on it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._store: MemoryStore | None = None
        self._archive: Archive | None = None
        # legacy resources/subscribe: uri -> client connections (weakly held: a closed one drops out)
        self._legacy_subs: dict[str, weakref.WeakSet[Any]] = {}

    # ------------------------------------------------------------ lifecycle

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        store = await MemoryStore.from_settings(self.settings).open()
        embedder = make_embedder(self.settings)
        archive = Archive(store.passages, embedder)
        self._store, self._archive = store, archive
        log.info(
            "memory: %s (namespace %r, meaning search: %s)",
            store.location,
            store.namespace,
            embedder.model if embedder is not None else "off",
        )
        try:
            async with anyio.create_task_group() as background:
                background.start_soon(self._warm_up, embedder)
                background.start_soon(archive.recall.backfill)
                try:
                    yield
                finally:
                    background.cancel_scope.cancel()
        finally:
            self._store = self._archive = None
            if embedder is not None:
                with contextlib.suppress(Exception):
                    await embedder.aclose()
            await store.close()

    @staticmethod
    async def _warm_up(embedder: Embedder | None) -> None:
        """Load the embedding model now, off the request path (the first search would wait)."""
        if embedder is None:
            return
        try:
            await embedder.ready()
        except EmbeddingUnavailable as exc:
            log.warning("meaning search unavailable, full text only: %s", exc)

    @property
    def store(self) -> MemoryStore:
        if self._store is None:
            raise ToolError("Memory is not open yet (the server is starting or stopping); try again shortly.")
        return self._store

    @property
    def archive(self) -> Archive:
        if self._archive is None:
            raise ToolError("Memory is not open yet (the server is starting or stopping); try again shortly.")
        return self._archive

    # ------------------------------------------------------------ helpers

    @staticmethod
    @contextlib.contextmanager
    def _refusals(words: Words = BLOCK_TOOL_WORDS) -> Iterator[None]:
        """The one place a domain refusal becomes a tool error (the model reads its text)."""
        try:
            yield
        except MemoryRefusal as exc:
            raise ToolError(exc.render(words)) from exc

    @classmethod
    async def _call(cls, coro: Awaitable[T], words: Words = BLOCK_TOOL_WORDS) -> T:
        with cls._refusals(words):
            return await coro

    async def _notify(self, ctx: Context | None, label: str, *, listing: bool = False) -> None:
        uris = [block_uri(label), BLOCKS_URI] if listing else [block_uri(label)]
        for uri in uris:
            if ctx is not None:
                try:
                    await ctx.notify_resource_updated(uri)
                except Exception as exc:  # best effort
                    log.debug("notify_resource_updated(%s) failed: %s", uri, exc)
            for session in list(self._legacy_subs.get(uri, ())):
                try:
                    await session.send_resource_updated(uri)
                except Exception as exc:  # a closed session: forget it
                    log.debug("legacy resource notification to a session failed: %s", exc)
                    self._legacy_subs[uri].discard(session)

    def _register_legacy_subscriptions(self, server: MCPServer) -> None:
        """Serve ``resources/subscribe``/``unsubscribe`` for handshake-era clients."""
        lowlevel = lowlevel_server(server)
        if lowlevel.get_request_handler("resources/subscribe") is not None:  # someone else serves it
            return

        def peer(ctx: Any) -> Any:
            # ctx.session is a per-request proxy; the connection behind it lives as long as the client.
            return session_connection(ctx.session)

        async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
            self._legacy_subs.setdefault(str(params.uri), weakref.WeakSet()).add(peer(ctx))
            return EmptyResult()

        async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
            subs = self._legacy_subs.get(str(params.uri))
            if subs is not None:
                subs.discard(peer(ctx))
            return EmptyResult()

        lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
        lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)

    # ------------------------------------------------------------ registration

    def register(self, server: MCPServer) -> None:
        self._register_block_tools(server)
        self._register_archival_tools(server)
        self._register_memory_tool(server)
        self._register_resources(server)
        self._register_legacy_subscriptions(server)

    def _register_block_tools(self, server: MCPServer) -> None:
        ro = ToolAnnotations(read_only_hint=True, open_world_hint=False)
        edit = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
        destructive = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
        call = self._call

        async def write(
            ctx: Context, label: str, op: Callable[[], Awaitable[Any]], message: str
        ) -> BlockWrite:
            row = await call(op())
            await self._notify(ctx, label)
            return BlockWrite.after(row, message, row.previous)

        @server.tool(
            description="List every memory block: label, description, chars, limit, read_only and version.",
            annotations=ro,
        )
        async def memory_list() -> BlockList:
            return BlockList(blocks=[BlockInfo.of(r) for r in await self.store.blocks.list()])

        @server.tool(
            description=(
                "Read one memory block: its value and metadata. A very large value comes back in parts "
                "(whole lines up to the output budget); view_range=[start, end] reads given lines."
            ),
            annotations=ro,
        )
        async def memory_read(
            label: Label,
            view_range: Annotated[
                list[int] | None,
                Field(
                    description="[start, end] lines to read, 1-based and inclusive; end -1 = the last line."
                ),
            ] = None,
        ) -> Block:
            row = await call(self.store.blocks.get(label))
            with self._refusals():
                return Block.view(row, view_range, self.settings.max_output_chars)

        @server.tool(
            description="Create a new memory block. An existing label is an error (edit it instead).",
            annotations=edit,
        )
        async def memory_create(
            label: Label,
            ctx: Context,
            value: Annotated[str, Field(description="Initial value.")] = "",
            description: Annotated[
                str, Field(description="What this block is for (shown to the agent).")
            ] = "",
            limit: Annotated[
                int | None, Field(description="Character limit (default: the server's block limit).")
            ] = None,
            read_only: Annotated[bool, Field(description="Refuse all later edits by the agent.")] = False,
        ) -> BlockWrite:
            row = await call(self.store.blocks.create(label, value, description, limit, read_only))
            await self._notify(ctx, label, listing=True)
            return BlockWrite.after(row, f"Created block {label!r}.")

        @server.tool(description="Append text to a memory block, on a new line.", annotations=edit)
        async def memory_append(
            label: Label,
            content: Annotated[str, Field(description="Text to append (added on a new line).")],
            ctx: Context,
            expected_version: ExpectedVersion = None,
        ) -> BlockWrite:
            return await write(
                ctx,
                label,
                lambda: self.store.blocks.append(label, content, expected_version),
                f"Appended to {label!r}.",
            )

        @server.tool(
            description=(
                "Replace text in a memory block. old_str must occur exactly once in the block "
                "(copy it exactly, without line numbers); new_str may be empty to delete it."
            ),
            annotations=edit,
        )
        async def memory_replace(
            label: Label,
            old_str: Annotated[str, Field(description="Exact text to replace; must occur exactly once.")],
            new_str: Annotated[str, Field(description="Replacement text (may be empty).")],
            ctx: Context,
            expected_version: ExpectedVersion = None,
        ) -> BlockWrite:
            return await write(
                ctx,
                label,
                lambda: self.store.blocks.replace(label, old_str, new_str, expected_version),
                f"Replaced text in {label!r}.",
            )

        @server.tool(
            description="Insert text into a memory block after a line (0 = at the top, -1 = at the end).",
            annotations=edit,
        )
        async def memory_insert(
            label: Label,
            new_str: Annotated[str, Field(description="Text to insert (may span several lines).")],
            ctx: Context,
            insert_line: Annotated[
                int, Field(description="Insert after this line number (1-based); 0 = top, -1 = end.", ge=-1)
            ] = -1,
            expected_version: ExpectedVersion = None,
        ) -> BlockWrite:
            return await write(
                ctx,
                label,
                lambda: self.store.blocks.insert(label, new_str, insert_line, expected_version),
                f"Inserted into {label!r}.",
            )

        @server.tool(
            description="Rewrite a memory block completely: its whole value becomes new_memory.",
            annotations=edit,
        )
        async def memory_rethink(
            label: Label,
            new_memory: Annotated[str, Field(description="The block's complete new value.")],
            ctx: Context,
            expected_version: ExpectedVersion = None,
        ) -> BlockWrite:
            return await write(
                ctx,
                label,
                lambda: self.store.blocks.rethink(label, new_memory, expected_version),
                f"Rewrote {label!r}.",
            )

        @server.tool(
            description="Delete a memory block (memory_undo brings it back).", annotations=destructive
        )
        async def memory_delete(
            label: Label, ctx: Context, expected_version: ExpectedVersion = None
        ) -> BlockDeleted:
            row = await call(self.store.blocks.delete(label, expected_version))
            await self._notify(ctx, label, listing=True)
            return BlockDeleted(
                label=label,
                deleted=True,
                last_version=row.version,
                message=f"Deleted block {label!r}; memory_undo(label={label!r}) restores it.",
            )

        @server.tool(
            description="A memory block's change history, newest first: when, operation, old and new value.",
            annotations=ro,
        )
        async def memory_history(
            label: Label,
            limit: Annotated[int, Field(description="Most recent entries to return.", ge=1, le=500)] = 20,
        ) -> BlockHistory:
            rows = await call(self.store.blocks.history(label, limit))
            return BlockHistory(label=label, entries=[HistoryEntry.of(h) for h in rows])

        @server.tool(
            description=(
                "Undo the most recent change to a memory block (call again to go further back). "
                "The undo is itself recorded as a new version."
            ),
            annotations=edit,
        )
        async def memory_undo(
            label: Label, ctx: Context, expected_version: ExpectedVersion = None
        ) -> UndoResult:
            row, entry = await call(self.store.blocks.undo(label, expected_version))
            await self._notify(ctx, label, listing=row is None or entry.op in ("create", "delete"))
            what = f"Undid {entry.op} (version {entry.version}) of {label!r}."
            return UndoResult(
                label=label,
                reverted=HistoryEntry.of(entry),
                block=Block.of(row) if row is not None else None,
                message=what if row is not None else what + " The block no longer exists.",
            )

    def _register_archival_tools(self, server: MCPServer) -> None:
        call = self._call

        @server.tool(
            description=(
                "Store a passage in long-term archival memory (searchable later by words, and by meaning "
                "when embeddings are configured). Tag it for filtering."
            ),
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
        )
        async def archival_memory_insert(
            content: Annotated[str, Field(description="The text to remember.")],
            tags: Annotated[list[str], Field(description="Tags for filtering searches.")] = [],  # noqa: B006
        ) -> ArchivalInsertResult:
            out = await call(self.archive.insert(content, tags))
            return ArchivalInsertResult(
                id=out.id, created_at=iso(out.created_at), embedded=out.embedded, note=out.note
            )

        @server.tool(
            description=(
                "Search archival memory, best match first. Full-text ranking matches word forms and "
                "passages with only some of the words; with embeddings configured it also ranks by meaning. "
                "Filters (tags, dates) apply before top_k and paging. An empty query lists the newest passages."
            ),
            annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
        )
        async def archival_memory_search(
            query: Annotated[str, Field(description="What to look for.")],
            tags: Annotated[list[str] | None, Field(description="Only passages with these tags.")] = None,
            tag_match_mode: Annotated[
                Literal["any", "all"], Field(description="'any': at least one tag; 'all': every tag.")
            ] = "any",
            top_k: Annotated[int, Field(description="Results per page.", ge=1, le=100)] = 10,
            start_datetime: Annotated[
                str | None,
                Field(description="Only passages created at or after this ISO date/datetime (UTC)."),
            ] = None,
            end_datetime: Annotated[
                str | None,
                Field(
                    description="Only passages created before this ISO datetime (a date alone includes that day)."
                ),
            ] = None,
            page: Annotated[int, Field(description="Page of results, from 0.", ge=0)] = 0,
        ) -> ArchivalSearchResult:
            out = await call(
                self.archive.search(
                    query,
                    tags=tags,
                    tag_match_mode=tag_match_mode,
                    top_k=top_k,
                    start_datetime=start_datetime,
                    end_datetime=end_datetime,
                    page=page,
                )
            )
            return ArchivalSearchResult(
                results=[
                    Passage(
                        id=r.id, content=r.content, tags=r.tags, created_at=iso(r.created_at), score=r.score
                    )
                    for r in out.results
                ],
                mode=out.mode,
                note=out.note,
                page=page,
                top_k=top_k,
            )

        @server.tool(
            description="Delete a passage from archival memory by id (from archival_memory_search).",
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
        )
        async def archival_memory_delete(
            id: Annotated[int, Field(description="The passage id.")],
        ) -> ArchivalDeleteResult:
            row = await call(self.archive.delete(id))
            return ArchivalDeleteResult(id=row.id, deleted=True, content=row.content)

    def _register_memory_tool(self, server: MCPServer) -> None:
        commands: dict[str, tuple[str, ...]] = {
            "view": ("path",),
            "create": ("path", "file_text"),
            "str_replace": ("path", "old_str", "new_str"),
            "insert": ("path", "insert_line", "insert_text"),
            "delete": ("path",),
            "rename": ("old_path", "new_path"),
        }

        @server.tool(
            description=(
                "Your memory directory, /memories: view it, then create, edit, rename and delete memory files. "
                "Commands: view (path, optional view_range [start, end]), create (path, file_text), "
                "str_replace (path, old_str, new_str), insert (path, insert_line, insert_text), "
                "delete (path), rename (old_path, new_path). Each file /memories/<label> is a memory block "
                "(the memory_* tools see the same ones); every edit is versioned (memory_history, memory_undo), "
                "and expected_version guards an edit against concurrent changes."
            ),
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
            structured_output=False,
        )
        async def memory(
            command: Annotated[
                Literal["view", "create", "str_replace", "insert", "delete", "rename"],
                Field(description="What to do."),
            ],
            ctx: Context,
            path: Annotated[str | None, Field(description="A path under /memories.")] = None,
            file_text: Annotated[str | None, Field(description="create: the file's whole text.")] = None,
            old_str: Annotated[
                str | None, Field(description="str_replace: text that occurs exactly once.")
            ] = None,
            new_str: Annotated[str | None, Field(description="str_replace: its replacement.")] = None,
            insert_line: Annotated[
                int | None, Field(description="insert: after this line (0 = at the top).", ge=-1)
            ] = None,
            insert_text: Annotated[str | None, Field(description="insert: the text to insert.")] = None,
            view_range: Annotated[
                list[int] | None, Field(description="view: [start, end] lines, 1-based; end -1 = to the end.")
            ] = None,
            old_path: Annotated[str | None, Field(description="rename: the current path.")] = None,
            new_path: Annotated[str | None, Field(description="rename: the new path.")] = None,
            expected_version: ExpectedVersion = None,
        ) -> str:
            given = {
                "path": path, "file_text": file_text, "old_str": old_str, "new_str": new_str,
                "insert_line": insert_line, "insert_text": insert_text, "old_path": old_path, "new_path": new_path,
            }  # fmt: skip
            missing = [name for name in commands[command] if given[name] is None]
            if missing:
                raise ToolError(
                    f"{command} needs {', '.join(commands[command])}; missing: {', '.join(missing)}."
                )
            files = MemoryDirectory(self.store.blocks, self.settings.max_output_chars)
            call = self._call
            if command == "view":
                return await call(files.view(str(path), view_range), DIALECT_WORDS)
            if command == "create":
                out = await call(files.create(str(path), str(file_text), expected_version), DIALECT_WORDS)
            elif command == "str_replace":
                out = await call(
                    files.str_replace(str(path), str(old_str), str(new_str), expected_version), DIALECT_WORDS
                )
            elif command == "insert":
                out = await call(
                    files.insert(str(path), int(insert_line or 0), str(insert_text), expected_version),
                    DIALECT_WORDS,
                )
            elif command == "delete":
                out = await call(files.delete(str(path), expected_version), DIALECT_WORDS)
            else:
                out = await call(files.rename(str(old_path), str(new_path), expected_version), DIALECT_WORDS)
            for label in {label_of(p) for p in (path, old_path, new_path) if p is not None} - {""}:
                await self._notify(ctx, label, listing=command in ("create", "delete", "rename"))
            return out

    def _register_resources(self, server: MCPServer) -> None:
        @server.resource(
            BLOCKS_URI,
            name="memory-blocks",
            title="Memory blocks",
            description="Every memory block of this agent (label, description, chars, limit, version) as JSON.",
            mime_type="application/json",
        )
        async def blocks_listing() -> str:
            rows = await self.store.blocks.list()
            return json.dumps(
                {"blocks": [{**BlockInfo.of(r).model_dump(), "uri": block_uri(r.label)} for r in rows]},
                indent=2,
            )

        @server.resource(
            BLOCKS_URI + "/{+label}",
            name="memory-block",
            title="Memory block",
            description="The value of one memory block.",
            mime_type="text/plain",
        )
        async def block_resource(label: str) -> str:
            try:
                row = await self.store.blocks.get(label)
            except MemoryRefusal as exc:
                raise ResourceNotFoundError(exc.render()) from exc
            return row.value

        @server.prompt(
            name="memory",
            title="Memory blocks",
            description="All memory blocks rendered the way an agent's system prompt shows them (<memory_blocks>).",
        )
        async def memory_prompt() -> str:
            return render_blocks(await self.store.blocks.list())
