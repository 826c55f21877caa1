"""Memory blocks as the model sees them: result models of the block tools and the prompt layout.

Design
------
* Result models are pydantic, so every tool publishes an ``outputSchema`` and returns
  ``structuredContent``. A write answers with the block after the edit (value, new version,
  room left) so the agent does not need a second ``memory_read`` before its next edit.
* :func:`render_blocks` produces the ``<memory_blocks>`` layout agents know from Letta's
  system prompt: one element per label with ``<description>``, ``<metadata>``
  (``chars_current``/``chars_limit``, plus ``read_only`` when set) and ``<value>``.

Error policy
------------
Nothing here refuses anything; validation lives in store.py (``MemoryRefusal``).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from kernmind.memory.store import BlockRow, HistoryRow, iso


class BlockInfo(BaseModel):
    label: str
    description: str
    chars: int = Field(description="characters in the value now")
    limit: int = Field(description="largest number of characters the value may hold")
    read_only: bool
    version: int = Field(description="incremented on every write; pass it as expected_version to guard edits")
    updated_at: str

    @classmethod
    def of(cls, row: BlockRow) -> BlockInfo:
        return cls(
            label=row.label,
            description=row.description,
            chars=row.chars,
            limit=row.limit,
            read_only=row.read_only,
            version=row.version,
            updated_at=iso(row.updated_at),
        )


class Block(BlockInfo):
    value: str

    @classmethod
    def of(cls, row: BlockRow) -> Block:
        return cls(**BlockInfo.of(row).model_dump(), value=row.value)


class BlockList(BaseModel):
    blocks: list[BlockInfo]


class BlockWrite(Block):
    room_left: int = Field(description="characters that can still be added before the limit")
    message: str

    @classmethod
    def after(cls, row: BlockRow, message: str) -> BlockWrite:
        return cls(**Block.of(row).model_dump(), room_left=max(row.limit - row.chars, 0), message=message)


class BlockDeleted(BaseModel):
    label: str
    deleted: bool
    last_version: int
    message: str


class HistoryEntry(BaseModel):
    version: int = Field(description="the block's version after this change")
    op: str
    at: str
    old: str | None = Field(description="value before the change (null when the block was created)")
    new: str | None = Field(description="value after the change (null when the block was deleted)")
    undone: bool

    @classmethod
    def of(cls, h: HistoryRow) -> HistoryEntry:
        return cls(
            version=h.version, op=h.op, at=iso(h.at), old=h.old_value, new=h.new_value, undone=h.undone
        )


class BlockHistory(BaseModel):
    label: str
    entries: list[HistoryEntry] = Field(description="newest first")


class UndoResult(BaseModel):
    label: str
    reverted: HistoryEntry = Field(description="the change that was undone")
    block: Block | None = Field(description="the block after the undo (null if the undo removed it)")
    message: str


def render_block(row: BlockRow) -> str:
    meta = [f"- chars_current={row.chars}", f"- chars_limit={row.limit}"]
    if row.read_only:
        meta.append("- read_only=true")
    return (
        f"<{row.label}>\n<description>\n{row.description}\n</description>\n"
        f"<metadata>\n" + "\n".join(meta) + "\n</metadata>\n"
        f"<value>\n{row.value}\n</value>\n</{row.label}>"
    )


def render_blocks(rows: list[BlockRow]) -> str:
    body = "\n\n".join(render_block(r) for r in rows)
    return (
        "<memory_blocks>\nThe following memory blocks are currently engaged in your core memory unit:\n\n"
        + body
        + ("\n\n" if body else "")
        + "</memory_blocks>"
    )
