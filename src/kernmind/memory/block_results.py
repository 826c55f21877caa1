"""Memory blocks as the model sees them: the block tools' result models and the ``<memory_blocks>``
prompt layout (what each answer holds, within the budget: docs/tools.md, "Memory blocks").

Design: pydantic models; a write echoes a block up to ``WRITE_ECHO_CHARS``, else an excerpt of the
changed lines; every answer goes through budget.py (whole lines or entries, with the ``view_range``
or ``offset`` that goes on). Error policy: only the block rules refuse (a ``view_range`` that does
not fit the block: blocks.py).
"""

from __future__ import annotations

import sys

from pydantic import BaseModel, Field

from kernmind.budget import Budget, left_out, listed_size, shown_lines
from kernmind.memory.blocks import line_count, resolve_range
from kernmind.memory.records import BlockRow, HistoryRow, iso

WRITE_ECHO_CHARS = 5000  # a write echoes the whole value up to this size (Letta's default block limit)
EXCERPT_CHARS = 2000  # otherwise it shows at most this much around the change
EXCERPT_CONTEXT_LINES = 2
HISTORY_CLIP_CHARS = 2000  # old/new values in memory_history are clipped to this
PAGE_ENVELOPE_CHARS = 400  # an answer's fields besides its value or entries (metadata, total, note)


def numbered(lines: list[str], first: int) -> str:
    """Lines as a numbered view (``12→ text``); the line-number prefix edits refuse to accept."""
    return "\n".join(f"{first + i}→ {line}" for i, line in enumerate(lines))


def changed_excerpt(before: str, after: str, chars: int = EXCERPT_CHARS) -> tuple[str, int, int]:
    """The lines of ``after`` that differ from ``before``, with context, in at most ``chars``
    characters: (view, first line, last line)."""
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
    budget = Budget(chars)
    candidates = numbered(lines[first : last + 1], first + 1).split("\n")
    count = budget.lines(candidates)
    shown = candidates[:count] or [budget.take(candidates[0], more="")[0]]
    return "\n".join(shown), first + 1, first + len(shown)


def clip(text: str | None, limit: int = HISTORY_CLIP_CHARS) -> str | None:
    if text is None:
        return None
    kept, cut = Budget(limit).take(text, more="")
    return kept if cut is None else kept + f"… [{len(text) - len(kept)} more characters not shown]"


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
    def view(cls, row: BlockRow, view_range: list[int] | None, budget: Budget) -> Block:
        """The block with the requested lines (all by default), cut at a line boundary to ``budget``."""
        lines = row.value.split("\n")
        total = line_count(row.value)
        first, last = resolve_range(view_range, total, row.label)
        chosen = lines[first - 1 : last] if total else []
        budget.spend(PAGE_ENVELOPE_CHARS + len(row.description))
        kept = chosen[: budget.lines(chosen)]
        truncated = len(kept) < len(chosen)
        cut_line = truncated and not kept  # one line longer than the budget: cut inside it
        if cut_line:
            kept = [budget.take(chosen[0], more="")[0]]
        shown_last = first + len(kept) - 1
        note = None
        if truncated:
            more = f"read on with memory_read(label={row.label!r}, view_range=[{shown_last + 1}, -1])."
            if cut_line:
                more = (
                    f"line {first} alone is longer than the budget and was cut: the resource "
                    f"memory://blocks/{row.label} holds the whole value"
                    + (f"; {more}" if shown_last < total else ".")
                )
            note = shown_lines(first, shown_last, total, budget, more)
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
    def page(cls, rows: list[BlockRow], *, offset: int, total: int, budget: Budget) -> BlockList:
        """``rows`` from ``offset`` on, as many as fit in ``budget`` (at least one)."""
        shown: list[BlockInfo] = []
        budget.spend(PAGE_ENVELOPE_CHARS)
        for row in rows:
            info = BlockInfo.of(row)
            if not budget.admit(listed_size(info), first=not shown):
                break
            shown.append(info)
        end = offset + len(shown)
        if end >= total:
            return cls(blocks=shown, total=total, offset=offset)
        how = f"memory_list(offset={end}) lists the next ones; memory_read(label=...) reads one."
        note = f"Blocks {offset + 1}-{end} of {total}. " + (
            left_out(len(rows) - len(shown), "blocks of this page", budget, how)
            if len(shown) < len(rows)
            else how
        )
        return cls(blocks=shown, total=total, offset=offset, next_offset=end, note=note)


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
    def after(
        cls, row: BlockRow, message: str, before: str | None = None, budget: Budget | None = None
    ) -> BlockWrite:
        """The answer to a write: the whole value when it is small, else the changed lines
        (both at most ``WRITE_ECHO_CHARS``/``EXCERPT_CHARS``, and within ``budget``)."""
        info = BlockInfo.of(row).model_dump()
        room = max(row.limit - row.chars, 0)
        left = WRITE_ECHO_CHARS
        if budget is not None:
            budget.spend(PAGE_ENVELOPE_CHARS + len(row.description) + len(message))
            left = min(left, budget.left)
        if row.chars <= left:
            return cls(**info, value=row.value, room_left=room, message=message)
        view, first, last = changed_excerpt(before or "", row.value, min(EXCERPT_CHARS, max(left, 1)))
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
    def of(cls, h: HistoryRow, budget: Budget | None = None) -> HistoryEntry:
        """The entry, its values clipped to ``HISTORY_CLIP_CHARS`` (to a quarter of ``budget``
        when that is less: an entry always fits an answer)."""
        limit = min(HISTORY_CLIP_CHARS, budget.chars // 4) if budget is not None else HISTORY_CLIP_CHARS
        return cls(
            version=h.version,
            op=h.op,
            at=iso(h.at),
            old=clip(h.old_value, limit),
            new=clip(h.new_value, limit),
            undone=h.undone,
        )


class BlockHistory(BaseModel):
    label: str
    entries: list[HistoryEntry] = Field(description="newest first")
    next_offset: int | None = Field(
        default=None, description="pass as offset for older entries; null when there are none"
    )
    note: str | None = None

    @classmethod
    def page(
        cls, label: str, rows: list[HistoryRow], *, offset: int, limit: int, more: bool, budget: Budget
    ) -> BlockHistory:
        """The entries of ``rows`` (newest first, from ``offset``) that fit ``budget`` (at least one);
        ``more``: older entries exist past ``limit``."""
        budget.spend(PAGE_ENVELOPE_CHARS)
        entries: list[HistoryEntry] = []
        for h in rows[:limit]:
            entry = HistoryEntry.of(h, budget)
            if not budget.admit(listed_size(entry), first=not entries):
                break
            entries.append(entry)
        end = offset + len(entries)
        if len(entries) < min(len(rows), limit):
            how = f"memory_history(label={label!r}, offset={end}) shows older ones."
            note = left_out(min(len(rows), limit) - len(entries), "entries", budget, how)
        elif more:
            note = f"There are older entries: memory_history(label={label!r}, offset={end}) shows them."
        else:
            return cls(label=label, entries=entries)
        return cls(label=label, entries=entries, next_offset=end, note=note)


class UndoResult(BaseModel):
    label: str
    reverted: HistoryEntry = Field(description="the change that was undone")
    block: Block | None = Field(description="the block after the undo (null if the undo removed it)")
    message: str

    @classmethod
    def of(cls, row: BlockRow | None, entry: HistoryRow, message: str, budget: Budget) -> UndoResult:
        """The undo's answer: the change, then as much of the block as ``budget`` still holds."""
        reverted = HistoryEntry.of(entry, budget)
        budget.spend(listed_size(reverted) + len(message))
        block = Block.view(row, None, budget) if row is not None else None
        return cls(label=entry.label, reverted=reverted, block=block, message=message)


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


def render_blocks(rows: list[BlockRow], budget: Budget | None = None, total: int | None = None) -> str:
    """Every block in the ``<memory_blocks>`` layout; with ``budget``, as many as fit (a block that
    does not fit whole is cut, when enough room is left to be useful), and a closing line that
    says what was left out and how to read it (``total``: how many blocks there are, when
    ``rows`` are only the first of them)."""
    total = max(total or 0, len(rows))
    budget = budget or Budget(sys.maxsize)
    budget.spend(len(PROMPT_HEAD) + len(PROMPT_TAIL))
    reserve = 500  # room for the line about what was left out
    parts: list[str] = []
    for i, row in enumerate(rows):
        text = render_block(row)
        last = i == total - 1
        if budget.admit(len(text) + 2 + (0 if last else reserve)):
            budget.spend(0 if last else -reserve)  # the reserve is only held, not spent
            parts.append(text)
            continue
        budget.spend(reserve + len(render_block(row, "")) + 200)
        if budget.left >= MIN_CUT_VALUE or not parts:
            how = f"memory_read(label={row.label!r}, view_range=[start, end]) reads the rest"
            cut, note = budget.take(row.value, more=how)
            parts.append(render_block(row, f"{cut}\n[value cut at {len(cut)} characters: {note}]"))
        break
    if len(parts) < total:
        parts.append(_left_out(rows[len(parts) :], len(parts), total))
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
