"""The MCP surface of memory: block tools, archival tools, block resources and the ``memory`` prompt.

Design: ``server.py`` does ``memory = MemoryTools(settings)``, ``memory.register(server)`` and, in its
lifespan, ``async with memory.running():`` (the database opens in the background; tools called
before or after get a clear error). Tools are thin
(block_tools.py, archival_tools.py); every block write publishes ``resource updated`` for
``memory://blocks/{label}`` (and the listing), to legacy ``resources/subscribe`` clients too; a failure
to notify never fails the write.

Error policy: what the model can fix is a ``MemoryRefusal`` in the words of the surface it went
through (errors.refusals); a write the disk refused, rolled back, becomes a ``StorageError``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import textwrap
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import EmptyResult, SubscribeRequestParams, UnsubscribeRequestParams

from kernmind.budget import Budget
from kernmind.config import Settings
from kernmind.diskio import StorageError, disk_sentence
from kernmind.memory.archival import Archive
from kernmind.memory.block_results import BlockInfo, render_blocks
from kernmind.memory.database import Database
from kernmind.memory.embedder_factory import make_embedder
from kernmind.memory.embeddings import Embedder, EmbeddingUnavailable
from kernmind.memory.errors import call, refusals
from kernmind.memory.legacy_owner import merge_legacy
from kernmind.memory.recall import Recall
from kernmind.memory.records import BlockRow
from kernmind.memory.store import MemoryStore
from kernmind.principals import LOCAL, Principal, current_principal
from kernmind.refusals import Unavailable
from kernmind.sdk_compat import lowlevel_server, registered_tool_names, session_connection, subscription_bus
from kernmind.supervise import task_group as supervised_group

log = logging.getLogger(__name__)

MEMORY_SCHEME = "memory://"
BLOCKS_URI = MEMORY_SCHEME + "blocks"
LISTING_MAX = 1000  # blocks read for the memory://blocks listing (it shows what fits the budget)
OPEN_DELAY = 0.3  # seconds after start before the database opens (unless a call opens it first)
WARM_UP_DELAY = 1.0  # seconds after start before the embedding model loads


def block_uri(label: str) -> str:
    return f"{BLOCKS_URI}/{label}"


@dataclass
class MemorySpace:
    """One namespace's memory: its store and its two searches."""

    store: MemoryStore
    archive: Archive
    messages: Recall


class MemoryTools:
    """Owns the memory of one server and registers the memory surface on it.

    Every principal has its own namespace (``namespace_for``; which: docs/security.md), all in one
    open database; a namespace is made ready (default blocks, searches, backfill, the replica relay)
    the first time its principal calls on memory (``open_space``, before each request ``concerns``
    says reaches memory: a code call opens nothing).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._spaces: dict[str, MemorySpace] = {}
        self._root: MemoryStore | None = None
        self._embedder: Embedder | None = None
        self._background: anyio.abc.TaskGroup | None = None
        self._opening = anyio.Lock()
        self._unopened: dict[str, str] = {}  # namespace -> why it could not be opened (a full disk)
        self._server: MCPServer | None = None
        self._tool_names: set[str] = set()  # the memory tools (``register``), for ``concerns``
        # legacy resources/subscribe: uri -> client connections (weakly held: a closed one drops out)
        self._legacy_subs: dict[str, weakref.WeakSet[Any]] = {}

    # ------------------------------------------------------------ lifecycle

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Memory for the server's lifetime. The database opens in the background: the client's
        handshake does not wait for it, and a memory call that comes first waits for it (or, when
        the database cannot be reached, tries again itself and says why in words)."""
        self._embedder = make_embedder(self.settings)
        try:
            async with supervised_group("memory") as background:  # a failed backfill ends alone
                self._background = background
                background.start_soon(self._open_soon)
                background.start_soon(self._warm_up, self._embedder)
                try:
                    yield
                finally:
                    background.cancel_scope.cancel()
        finally:
            self._spaces.clear()
            root, self._root, self._background = self._root, None, None
            if self._embedder is not None:
                with contextlib.suppress(Exception):
                    await self._embedder.aclose()
            if root is not None:
                await root.close()

    async def _open_soon(self) -> None:
        """Open the database soon after start, but not during the client's handshake (opening
        holds the interpreter for tens of milliseconds); a memory call that comes first opens it
        itself. A failure is logged and the next memory call tries again."""
        await anyio.sleep(OPEN_DELAY)
        try:
            async with self._opening:
                await self._open_root()
        except Exception as exc:
            log.warning("memory not opened at start (the first memory call tries again): %s", exc)

    async def _open_root(self) -> None:
        """Open the database and the server's own namespace (under ``_opening``)."""
        if self._root is not None:
            return
        self._root = root = await MemoryStore.from_settings(self.settings).open()  # (closed by ``running``)
        try:  # an earlier version kept the --token principal's memory apart (legacy_owner.py)
            await merge_legacy(root)
        except Exception:
            log.exception(
                "moving the --token principal's earlier memory failed; kept as it was, retried next start"
            )
        log.info(
            "memory: %s (namespace %r, meaning search: %s)",
            root.location,
            root.namespace,
            self._embedder.model if self._embedder is not None else "off",
        )
        await self._add_space(root)

    def namespace_for(self, principal: Principal) -> str:
        if principal.owner == LOCAL.name:
            return self.settings.agent
        return f"{principal.owner}/{self.settings.agent}"

    async def open_space(self, principal: Principal) -> None:
        """Make ``principal``'s namespace ready (a no-op once it is). Runs before every call of
        every tool: a disk too full to create the namespace must not fail the principal's other
        tools, so that is remembered (the memory tools say it) and tried again at the next call."""
        key = self.namespace_for(principal)
        if key in self._spaces or self._background is None:  # (not running: ``_space`` says so)
            return
        async with self._opening:
            try:  # a no-op once open; a PostgreSQL that is down is answered in words (boundary.py)
                await self._open_root()
            except (OSError, RuntimeError, sqlite3.Error) as exc:  # a bad --db, a newer schema
                why = str(exc).rstrip(".") or type(exc).__name__
                raise Unavailable(
                    f"Memory cannot be opened: {why}. Code and sessions still work; the operator "
                    "can check --db (kernmind doctor shows it)."
                ) from exc
            if key not in self._spaces and self._root is not None:
                store = MemoryStore.from_settings(self.settings, namespace=key, sharing=self._root)
                try:
                    space = await store.open_namespace()
                except Exception as exc:
                    sentence = disk_sentence(exc, "set up this principal's memory", kept="Nothing was lost.")
                    if sentence is None:
                        raise
                    log.warning("memory namespace %r not opened: %s", key, exc)
                    self._unopened[key] = sentence
                    return
                self._unopened.pop(key, None)
                await self._add_space(space)

    async def _add_space(self, store: MemoryStore) -> None:
        space = MemorySpace(
            store,
            Archive(store.passages, self._embedder),
            Recall(store.conversations, self._embedder, what="messages"),
        )
        self._spaces[store.namespace] = space
        background = self._background
        if background is not None:
            background.start_soon(space.archive.recall.backfill)
            background.start_soon(space.messages.backfill)
            if store.db.relays_changes and self._server is not None:
                background.start_soon(self._relay_other_replicas, store.db, store.namespace)

    @staticmethod
    async def _warm_up(embedder: Embedder | None) -> None:
        """Load the embedding model soon, off the request path (the first search would wait),
        but not during the client's handshake: loading holds the interpreter for a few tenths
        of a second, which ``initialize`` and ``tools/list`` would wait for (a search that
        comes first loads it itself)."""
        if embedder is None:
            return
        await anyio.sleep(WARM_UP_DELAY)
        try:
            await embedder.ready()
        except EmbeddingUnavailable as exc:
            log.warning("meaning search unavailable, full text only: %s", exc)

    def _space(self) -> MemorySpace:
        key = self.namespace_for(current_principal())
        space = self._spaces.get(key)
        if space is None:
            if (why := self._unopened.get(key)) is not None:
                raise StorageError(why)
            raise Unavailable(
                "Memory is not open yet (the server is starting or stopping); try again shortly."
            )
        return space

    @property
    def store(self) -> MemoryStore:
        """The caller's namespace."""
        return self._space().store

    @property
    def messages(self) -> Recall:
        """Hybrid search over the caller's recorded conversations."""
        return self._space().messages

    @property
    def archive(self) -> Archive:
        return self._space().archive

    # ------------------------------------------------------------ helpers

    refusals = staticmethod(refusals)
    call = staticmethod(call)

    async def notify(self, ctx: Context | None, label: str, *, listing: bool = False) -> None:
        """A block changed here: tell this server's subscribers, then the other replicas."""
        await self._publish(label, listing, ctx.notify_resource_updated if ctx is not None else None)
        store = self.store
        if store.db.relays_changes:
            try:
                await store.db.announce(store.namespace, label, listing)
            except Exception as exc:  # best effort: the write itself succeeded
                log.warning("could not tell other replicas that %r changed: %s", label, exc)

    async def _publish(
        self, label: str, listing: bool, publish: Callable[[str], Awaitable[None]] | None
    ) -> None:
        uris = [block_uri(label), BLOCKS_URI] if listing else [block_uri(label)]
        for uri in uris:
            if publish is not None:
                try:
                    await publish(uri)
                except Exception as exc:  # best effort
                    log.debug("resource-updated for %s failed: %s", uri, exc)
            for session in list(self._legacy_subs.get(uri, ())):
                try:
                    await session.send_resource_updated(uri)
                except Exception as exc:  # a closed session: forget it
                    log.debug("legacy resource notification to a session failed: %s", exc)
                    self._legacy_subs[uri].discard(session)

    async def _relay_other_replicas(self, db: Database, namespace: str) -> None:
        """Changes announced by other replicas (PostgreSQL NOTIFY) reach this server's subscribers."""
        assert self._server is not None
        bus = subscription_bus(self._server)

        async def publish(uri: str) -> None:
            await bus.publish(ResourceUpdated(uri=uri))

        while True:
            try:
                async for label, listing in db.listen(namespace):
                    await self._publish(label, listing, publish)
            except Exception as exc:  # the connection dropped: listen again shortly
                log.warning("listening for other replicas' changes failed (%s); retrying", exc)
            await anyio.sleep(1)

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
        self._server = server
        from kernmind.memory.archival_tools import register_archival_tools, register_conversation_search
        from kernmind.memory.block_tools import register_block_tools, register_memory_tool

        before = registered_tool_names(server)
        register_block_tools(self, server)
        register_memory_tool(self, server)
        register_archival_tools(self, server)
        register_conversation_search(self, server)
        self._tool_names = registered_tool_names(server) - before
        self._register_resources(server)
        self._register_legacy_subscriptions(server)

    def concerns(self, method: str, params: Any) -> bool:
        """Whether a request reaches memory (its caller's namespace is then opened first, see
        ``open_space``): a memory tool, a ``memory://`` resource, the ``memory`` prompt. A
        ``run_code`` call touches none of the memory machinery."""
        if method == "tools/call":
            return getattr(params, "name", None) in self._tool_names
        if method == "resources/read":
            return str(getattr(params, "uri", "")).startswith(MEMORY_SCHEME)
        return method == "prompts/get" and getattr(params, "name", None) == "memory"

    def _register_resources(self, server: MCPServer) -> None:
        @server.resource(
            BLOCKS_URI,
            name="memory-blocks",
            title="Memory blocks",
            description="Every memory block of this agent (label, description, chars, limit, version) as JSON.",
            mime_type="application/json",
        )
        async def blocks_listing() -> str:
            blocks = self.store.blocks
            rows, total = await blocks.list(0, LISTING_MAX), await blocks.count()
            return blocks_listing_json(rows, total, Budget.of(self.settings))

        @server.resource(
            BLOCKS_URI + "/{+label}",
            name="memory-block",
            title="Memory block",
            description="The value of one memory block.",
            mime_type="text/plain",
        )
        async def block_resource(label: str) -> str:
            row = await self.store.blocks.get(label)  # an unknown label: "not found" (boundary.py)
            return row.value

        @server.prompt(
            name="memory",
            title="Memory blocks",
            description="All memory blocks rendered the way an agent's system prompt shows them (<memory_blocks>).",
        )
        async def memory_prompt() -> str:
            blocks = self.store.blocks
            rows, total = await blocks.list(0, LISTING_MAX), await blocks.count()
            return render_blocks(rows, budget=Budget.of(self.settings), total=total)


def blocks_listing_json(rows: list[BlockRow], total: int, budget: Budget) -> str:
    """The ``memory://blocks`` listing: the first blocks that fit ``budget``, and a note on how to
    read the rest when they do not all fit."""
    items: list[dict[str, Any]] = []
    budget.spend(400)  # the envelope and the note
    for row in rows:
        item = {**BlockInfo.of(row).model_dump(), "uri": block_uri(row.label)}
        if not budget.admit(len(textwrap.indent(json.dumps(item, indent=2), "    ")) + 2, first=not items):
            break
        items.append(item)
    listing: dict[str, Any] = {"blocks": items, "total": total}
    if len(items) < total:
        listing["note"] = (
            f"The first {len(items)} of {total} blocks, to stay within the output budget: the memory_list "
            f"tool pages through the rest (memory_list(offset={len(items)})), and {BLOCKS_URI}/<label> "
            "reads any block."
        )
    return json.dumps(listing, indent=2)
