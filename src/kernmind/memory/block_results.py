"""Memory blocks as the model sees them: result models of the block tools and the prompt layout.

Design
------
* Result models are pydantic, so every tool publishes an ``outputSchema`` and returns
  ``structuredContent``. A write answers with the block after the edit (new version, room
  left, and the value itself when it is at most ``WRITE_ECHO_CHARS``) so the agent does not
  need a second ``memory_read`` before its next edit. A larger block is not echoed whole on
  every edit: the answer carries an excerpt (the changed lines with a little context, with
  line numbers) and says how to read the rest.
* Reads respect a budget too: ``memory_read`` returns whole lines up to the server's output
  budget and says which ``view_range`` shows the rest.
* :func:`render_blocks` produces the ``<memory_blocks>`` layout agents know from Letta's
  system prompt: one element per label with ``<description>``, ``<metadata>``
  (``chars_current``/``chars_limit``, plus ``read_only`` when set) and ``<value>``.

Error policy
------------
Nothing here refuses anything except through the block rules (blocks.py): a
``view_range`` that does not fit the block.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, Field

from kernmind.memory.blocks import line_count, resolve_range
from kernmind.memory.records import BlockRow, HistoryRow, iso

WRITE_ECHO_CHARS = 5000  # a write echoes the whole value up to this size (Letta's default block limit)
EXCERPT_CHARS = 2000  # otherwise it shows at most this much around the change
EXCERPT_CONTEXT_LINES = 2
HISTORY_CLIP_CHARS = 2000  # old/new values in memory_history are clipped to this
PAGE_ENVELOPE_CHARS = 400  # a memory_list page's fields besides its blocks (total, next_offset, note)


def numbered(lines: list[str], first: int) -> str:
    """Lines as a numbered view (``12→ text``); the line-number prefix edits refuse to accept."""
    return "\n".join(f"{first + i}→ {line}" for i, line in enumerate(lines))


def changed_excerpt(before: str, after: str) -> tuple[str, int, int]:
    """The lines of ``after`` that differ from ``before``, with context: (view, first line, last line)."""
    head = 0
    limit = min(len(before), len(after))
    while head < limit and before[head] == after[head]:
        head += 1
    tail = 0
    while tail < limit - head and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    lines = after.split("\n")
    first = after.count("\n", 0, head)  # 0-based
    last = after.count("\n", 0, max(head, len(after) - tail))
    first, last = max(first - EXCERPT_CONTEXT_LINES, 0), min(last + EXCERPT_CONTEXT_LINES, len(lines) - 1)
    shown: list[str] = []
    size = 0
    for i in range(first, last + 1):
        size += len(lines[i]) + 8
        if shown and size > EXCERPT_CHARS:
            break
        shown.append(lines[i][:EXCERPT_CHARS])
    return numbered(shown, first + 1), first + 1, first + len(shown)


def clip(text: str | None, limit: int = HISTORY_CLIP_CHARS) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + f"… [{len(text) - limit} more characters not shown]"


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
    value: str = Field(description="the value, or the lines of it that were asked for (see view_range)")
    lines: int = Field(description="lines in the whole value")
    view_range: list[int] | None = Field(
        default=None, description="[first, last] line (1-based) that value holds, when not the whole value"
    )
    truncated: bool = Field(default=False, description="true when value stops early to respect the budget")
    note: str | None = None

    @classmethod
    def of(cls, row: BlockRow) -> Block:
        return cls(**BlockInfo.of(row).model_dump(), value=row.value, lines=line_count(row.value))

    @classmethod
    def view(cls, row: BlockRow, view_range: list[int] | None, budget: int) -> Block:
        """The block with the requested lines (all by default), cut at a line boundary to ``budget``."""
        lines = row.value.split("\n")
        total = line_count(row.value)
        first, last = resolve_range(view_range, total, row.label)
        chosen = lines[first - 1 : last] if total else []
        kept: list[str] = []
        size = 0
        for line in chosen:
            if size + len(line) + 1 > budget:
                break
            kept.append(line)
            size += len(line) + 1
        truncated = len(kept) < len(chosen)
        if truncated and not kept:  # one line longer than the budget: cut inside it
            kept = [chosen[0][:budget]]
        shown_last = first + len(kept) - 1
        note = None
        if truncated:
            note = (
                f"Showing lines {first}-{shown_last} of {total} ({len(row.value)} characters) to stay within "
                f"the output budget. Read on with memory_read(label={row.label!r}, view_range=[{shown_last + 1}, -1])."
            )
        whole = first == 1 and shown_last >= total and not truncated
        return cls(
            **BlockInfo.of(row).model_dump(),
            value="\n".join(kept) if not whole else row.value,
            lines=total,
            view_range=None if whole else [first, shown_last],
            truncated=truncated,
            note=note,
        )


class BlockList(BaseModel):
    blocks: list[BlockInfo] = Field(description="this page of blocks, in creation order")
    total: int = Field(description="blocks in this memory")
    offset: int = Field(description="position of the first block of this page (0-based)")
    next_offset: int | None = Field(
        default=None, description="pass as offset to list the next page; null on the last page"
    )
    note: str | None = None

    @classmethod
    def page(cls, rows: list[BlockRow], *, offset: int, total: int, budget: int) -> BlockList:
        """``rows`` from ``offset`` on, as many as fit in ``budget`` characters of JSON (at least one)."""
        shown: list[BlockInfo] = []
        size = PAGE_ENVELOPE_CHARS
        for row in rows:
            info = BlockInfo.of(row)
            size += len(json.dumps(info.model_dump())) + 2
            if shown and size > budget:
                break
            shown.append(info)
        end = offset + len(shown)
        if end >= total:
            return cls(blocks=shown, total=total, offset=offset)
        return cls(
            blocks=shown,
            total=total,
            offset=offset,
            next_offset=end,
            note=f"Blocks {offset + 1}-{end} of {total}. memory_list(offset={end}) lists the next ones; "
            "memory_read(label=...) reads one.",
        )


class BlockWrite(BlockInfo):
    value: str | None = Field(
        description=f"the whole value after the edit when it is at most {WRITE_ECHO_CHARS} characters, else null"
    )
    excerpt: str | None = Field(
        default=None,
        description="for a larger block: the changed lines with some context, numbered (N→ text)",
    )
    room_left: int = Field(description="characters that can still be added before the limit")
    message: str

    @classmethod
    def after(cls, row: BlockRow, message: str, before: str | None = None) -> BlockWrite:
        info = BlockInfo.of(row).model_dump()
        room = max(row.limit - row.chars, 0)
        if row.chars <= WRITE_ECHO_CHARS:
            return cls(**info, value=row.value, room_left=room, message=message)
        view, first, last = changed_excerpt(before or "", row.value)
        message += (
            f" The block has {row.chars} characters, so only lines {first}-{last} around the change are shown; "
            f"memory_read(label={row.label!r}) shows the value (view_range=[start, end] for some lines)."
        )
        return cls(**info, value=None, excerpt=view, room_left=room, message=message)


class BlockDeleted(BaseModel):
    label: str
    deleted: bool
    last_version: int
    message: str


class HistoryEntry(BaseModel):
    version: int = Field(description="the block's version after this change")
    op: str
    at: str
    old: str | None = Field(
        description=f"value before the change (null when the block was created), clipped to {HISTORY_CLIP_CHARS} chars"
    )
    new: str | None = Field(
        description=f"value after the change (null when the block was deleted), clipped to {HISTORY_CLIP_CHARS} chars"
    )
    undone: bool

    @classmethod
    def of(cls, h: HistoryRow) -> HistoryEntry:
        return cls(
            version=h.version,
            op=h.op,
            at=iso(h.at),
            old=clip(h.old_value),
            new=clip(h.new_value),
            undone=h.undone,
        )


class BlockHistory(BaseModel):
    label: str
    entries: list[HistoryEntry] = Field(description="newest first")


class UndoResult(BaseModel):
    label: str
    reverted: HistoryEntry = Field(description="the change that was undone")
    block: Block | None = Field(description="the block after the undo (null if the undo removed it)")
    message: str


def render_block(row: BlockRow, value: str | None = None) -> str:
    """One block in the prompt layout (``value``: what to show instead of the whole value)."""
    meta = [f"- chars_current={row.chars}", f"- chars_limit={row.limit}"]
    if row.read_only:
        meta.append("- read_only=true")
    return (
        f"<{row.label}>\n<description>\n{row.description}\n</description>\n"
        f"<metadata>\n" + "\n".join(meta) + "\n</metadata>\n"
        f"<value>\n{row.value if value is None else value}\n</value>\n</{row.label}>"
    )


PROMPT_HEAD = (
    "<memory_blocks>\nThe following memory blocks are currently engaged in your core memory unit:\n\n"
)
PROMPT_TAIL = "</memory_blocks>"
MIN_CUT_VALUE = 1000  # a block cut to fit the budget shows at least this much of its value


def render_blocks(rows: list[BlockRow], budget: int | None = None, total: int | None = None) -> str:
    """Every block in the ``<memory_blocks>`` layout; with ``budget``, as many as fit in that many
    characters (a block that does not fit whole is cut, when enough room is left to be useful),
    and a closing line that says what was left out and how to read it (``total``: how many blocks
    there are, when ``rows`` are only the first of them)."""
    total = max(total or 0, len(rows))
    parts: list[str] = []
    size = len(PROMPT_HEAD) + len(PROMPT_TAIL)
    reserve = 500  # room for the line about what was left out
    shown = 0
    for i, row in enumerate(rows):
        text = render_block(row)
        if budget is None or size + len(text) + 2 <= budget - (reserve if i < total - 1 else 0):
            parts.append(text)
            size += len(text) + 2
            shown += 1
            continue
        room = budget - size - reserve - len(render_block(row, "")) - 200
        if room >= MIN_CUT_VALUE or not parts:
            cut = row.value[: max(room, 0)]
            parts.append(
                render_block(
                    row,
                    f"{cut}\n[value cut at {len(cut)} of {len(row.value)} characters to stay within the output "
                    f"budget; memory_read(label={row.label!r}, view_range=[start, end]) reads the rest]",
                )
            )
            shown += 1
        break
    if shown < total:
        parts.append(_left_out(rows[shown:], shown, total))
    body = "\n\n".join(parts)
    return PROMPT_HEAD + body + ("\n\n" if body else "") + PROMPT_TAIL


def _left_out(rest: list[BlockRow], shown: int, total: int) -> str:
    names: list[str] = []
    for r in rest:
        if sum(len(n) + 2 for n in names) + len(repr(r.label)) > 200:
            names.append("…")
            break
        names.append(repr(r.label))
    if names and names[-1] != "…" and len(names) < total - shown:
        names.append("…")
    named = f" ({', '.join(names)})" if names else ""
    return (
        f"[{total - shown} more of the {total} blocks are not shown here, to stay within the output budget"
        f"{named}: memory_read(label=...) reads one, memory_list(offset={shown}) lists them]"
    )
