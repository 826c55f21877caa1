"""The block tools (``memory_*``) and the ``memory`` tool (Anthropic's dialect) on an MCP server.

Design: thin wrappers: schema-checked arguments, the blocks (block_store.py) or the memory directory
(memory_tool.py) through :func:`errors.call` (refusals in the called surface's words), results from
block_results.py, then a notification of ``memory://blocks/{label}`` (and of the listing when blocks
appear or go). Error policy: refusals say what to do instead; a refused write changed nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, Protocol

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import Field

from kernmind import input_limits as limits
from kernmind.budget import Budget
from kernmind.config import Settings
from kernmind.memory.block_results import (
    Block,
    BlockDeleted,
    BlockHistory,
    BlockList,
    BlockWrite,
    UndoResult,
)
from kernmind.memory.errors import call, refusals
from kernmind.memory.memory_tool import DIALECT_WORDS, MemoryDirectory, label_of
from kernmind.memory.store import MemoryStore
from kernmind.refusals import ArgumentRefusal


class Host(Protocol):
    """What the block tools need from memory's surface (tools.py's ``MemoryTools``)."""

    settings: Settings

    @property
    def store(self) -> MemoryStore: ...

    async def notify(self, ctx: Context | None, label: str, *, listing: bool = False) -> None: ...


Label = Annotated[
    str, Field(description="The block's label, e.g. 'human' or 'persona' ('/' for folders).", max_length=200)
]
LIST_MAX = 200  # blocks on one memory_list page (fewer when their descriptions fill the output budget)
ExpectedVersion = Annotated[
    int | None,
    Field(description="Refuse the write unless the block is at this version (from memory_read/memory_list)."),
]


def register_block_tools(memory_tools: Host, server: MCPServer) -> None:
    ro = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    edit = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    destructive = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)

    async def write(ctx: Context, label: str, op: Callable[[], Awaitable[Any]], message: str) -> BlockWrite:
        row = await call(op())
        await memory_tools.notify(ctx, label)
        return BlockWrite.after(row, message, row.previous, Budget.of(memory_tools.settings))

    @server.tool(
        description=(
            "List the memory blocks: label, description, chars, limit, read_only and version, a page at a "
            "time in creation order (next_offset, when not null, lists the next page)."
        ),
        annotations=ro,
    )
    async def memory_list(
        offset: Annotated[int, Field(description="Skip this many blocks (from next_offset).", ge=0)] = 0,
        limit: Annotated[int, Field(description="Most blocks on this page.", ge=1, le=LIST_MAX)] = LIST_MAX,
    ) -> BlockList:
        blocks = memory_tools.store.blocks
        rows, total = await blocks.list(offset, limit), await blocks.count()
        return BlockList.page(rows, offset=offset, total=total, budget=Budget.of(memory_tools.settings))

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
            Field(description="[start, end] lines to read, 1-based and inclusive; end -1 = the last line."),
        ] = None,
    ) -> Block:
        row = await call(memory_tools.store.blocks.get(label))
        with refusals():
            return Block.view(row, view_range, Budget.of(memory_tools.settings))

    @server.tool(
        description="Create a new memory block. An existing label is an error (edit it instead).",
        annotations=edit,
    )
    async def memory_create(
        label: Label,
        ctx: Context,
        value: Annotated[str, Field(description="Initial value.")] = "",
        description: Annotated[
            str,
            Field(
                description="What this block is for (shown to the agent).",
                max_length=limits.DESCRIPTION_CHARS,
            ),
        ] = "",
        limit: Annotated[
            int | None, Field(description="Character limit (default: the server's block limit).")
        ] = None,
        read_only: Annotated[bool, Field(description="Refuse all later edits by the agent.")] = False,
    ) -> BlockWrite:
        row = await call(memory_tools.store.blocks.create(label, value, description, limit, read_only))
        await memory_tools.notify(ctx, label, listing=True)
        return BlockWrite.after(row, f"Created block {label!r}.", budget=Budget.of(memory_tools.settings))

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
            lambda: memory_tools.store.blocks.append(label, content, expected_version),
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
            lambda: memory_tools.store.blocks.replace(label, old_str, new_str, expected_version),
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
            lambda: memory_tools.store.blocks.insert(label, new_str, insert_line, expected_version),
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
            lambda: memory_tools.store.blocks.rethink(label, new_memory, expected_version),
            f"Rewrote {label!r}.",
        )

    @server.tool(description="Delete a memory block (memory_undo brings it back).", annotations=destructive)
    async def memory_delete(
        label: Label, ctx: Context, expected_version: ExpectedVersion = None
    ) -> BlockDeleted:
        row = await call(memory_tools.store.blocks.delete(label, expected_version))
        await memory_tools.notify(ctx, label, listing=True)
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
        offset: Annotated[
            int, Field(description="Skip this many recent entries (from next_offset).", ge=0)
        ] = 0,
    ) -> BlockHistory:
        rows = await call(memory_tools.store.blocks.history(label, limit + 1, offset))
        budget = Budget.of(memory_tools.settings)
        return BlockHistory.page(
            label, rows, offset=offset, limit=limit, more=len(rows) > limit, budget=budget
        )

    @server.tool(
        description=(
            "Undo the most recent change to a memory block (call again to go further back). "
            "The undo is itself recorded as a new version."
        ),
        annotations=edit,
    )
    async def memory_undo(label: Label, ctx: Context, expected_version: ExpectedVersion = None) -> UndoResult:
        row, entry = await call(memory_tools.store.blocks.undo(label, expected_version))
        await memory_tools.notify(ctx, label, listing=row is None or entry.op in ("create", "delete"))
        what = f"Undid {entry.op} (version {entry.version}) of {label!r}."
        message = what if row is not None else what + " The block no longer exists."
        return UndoResult.of(row, entry, message, Budget.of(memory_tools.settings))


def register_memory_tool(memory_tools: Host, server: MCPServer) -> None:
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
        path: Annotated[
            str | None, Field(description="A path under /memories.", max_length=limits.MEMORY_PATH_CHARS)
        ] = None,
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
        old_path: Annotated[
            str | None, Field(description="rename: the current path.", max_length=limits.MEMORY_PATH_CHARS)
        ] = None,
        new_path: Annotated[
            str | None, Field(description="rename: the new path.", max_length=limits.MEMORY_PATH_CHARS)
        ] = None,
        expected_version: ExpectedVersion = None,
    ) -> str:
        given = {
            "path": path, "file_text": file_text, "old_str": old_str, "new_str": new_str,
            "insert_line": insert_line, "insert_text": insert_text, "old_path": old_path, "new_path": new_path,
        }  # fmt: skip
        missing = [name for name in commands[command] if given[name] is None]
        if missing:
            raise ArgumentRefusal(
                f"{command} needs {', '.join(commands[command])}; missing: {', '.join(missing)}."
            )
        files = MemoryDirectory(memory_tools.store.blocks, memory_tools.settings.max_output_chars)
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
            await memory_tools.notify(ctx, label, listing=command in ("create", "delete", "rename"))
        return out
