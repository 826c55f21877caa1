"""The rules of memory blocks: valid labels, limits, read-only blocks, versions, and the edits.

Design: pure functions over :class:`BlockRow` (each edit returns the new value or refuses; the checks
every write shares are here, with their sentences); block_store.py runs them inside its write
transaction, and each surface renders their refusals in its own words (errors.py).
Error policy: a failing rule raises :class:`MemoryRefusal` naming what was wrong, by how much, and
what to do instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kernmind.memory.errors import MemoryRefusal, Verb
from kernmind.memory.records import BlockRow

# A label is 1-8 '/'-separated names (a label with '/' is a file in a folder, for the memory tool).
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"
LABEL_RE = re.compile(rf"^{_NAME}(?:/{_NAME}){{0,7}}$")
MAX_LABEL_CHARS = 200
LABELS_NAMED = 50  # a refusal names at most this many existing labels
# A line-number prefix as a rendered view shows it ("12→ value") or Letta's "Line 12: ".
LINE_PREFIX_RE = re.compile(r"(?m)^\s*\d+→ ?|^Line \d+: ")


def check_label(label: str) -> None:
    if not LABEL_RE.match(label) or len(label) > MAX_LABEL_CHARS:
        raise MemoryRefusal(
            "{label!r} is not a valid label: use 1-64 letters, digits, '_', '.' or '-' (starting with a "
            "letter, digit or '_'), e.g. 'project_notes'; '/' separates up to 8 such names into folders "
            "('projects/kernmind'), at most {max} characters in all.",
            label=label,
            max=MAX_LABEL_CHARS,
        )


def check_limit_value(limit: int, ceiling: int) -> None:
    if limit < 1:
        raise MemoryRefusal("limit must be at least 1 character, got {limit}.", limit=limit)
    if limit > ceiling:
        raise MemoryRefusal(
            "limit {limit} is above this server's ceiling of {ceiling} characters per block. "
            "Pass a limit of at most {ceiling}, or keep long material "
            "in archival memory ({remember}) and a short summary in the block.",
            limit=limit,
            ceiling=ceiling,
        )


def check_initial_value(value: str, limit: int) -> None:
    if len(value) > limit:
        raise MemoryRefusal(
            "The initial value is {chars} characters, {over} over the limit of {limit}. "
            "Pass a larger limit or a shorter value.",
            chars=len(value),
            over=len(value) - limit,
            limit=limit,
        )


def already_exists(row: BlockRow) -> MemoryRefusal:
    return MemoryRefusal(
        "A block labelled {label!r} already exists (version {version}, {chars}/{limit} chars). "
        "Edit it with {append}/{replace}/{rethink}, or choose another label.",
        label=row.label,
        version=row.version,
        chars=row.chars,
        limit=row.limit,
    )


def unknown_label(label: str, existing: Sequence[str]) -> MemoryRefusal:
    more = len(existing) - LABELS_NAMED
    refusal = MemoryRefusal(
        "There is no memory block labelled {label!r}. Existing blocks: {known}"
        + (" and {more} more ({list} pages through them)" if more > 0 else "")
        + ". Use one of those labels, or create the block with {create}.",
        label=label,
        known=", ".join(repr(x) for x in existing[:LABELS_NAMED]) or "none",
        more=more,
    )
    refusal.missing = True  # a resource read answers "not found"
    return refusal


def too_many_blocks(count: int, cap: int) -> MemoryRefusal:
    return MemoryRefusal(
        "This memory already holds {count} blocks, the most one memory may hold ({cap}; the server's "
        "--memory-max-blocks). Nothing was created. Delete a block you no longer need with {delete}, "
        "keep this text in an existing block ({append}), or store it as an archival passage with {remember}.",
        count=count,
        cap=cap,
    )


def check_writable(row: BlockRow, op: Verb, expected_version: int | None) -> None:
    if row.read_only:
        raise MemoryRefusal(
            "{op} refused: block {label!r} is read-only and cannot be changed by the agent. "
            "Keep the information elsewhere (another block or archival memory), or ask the user to change it.",
            op=op,
            label=row.label,
        )
    if expected_version is not None and expected_version != row.version:
        raise MemoryRefusal(
            "{op} refused: block {label!r} is at version {version}, not expected_version {expected}; it was "
            "changed in the meantime. Read it again with {read}, then retry with expected_version={version}.",
            op=op,
            label=row.label,
            version=row.version,
            expected=expected_version,
        )


def check_fits(row: BlockRow, new_value: str, op: Verb) -> None:
    if len(new_value) > row.limit:
        over = len(new_value) - row.limit
        raise MemoryRefusal(
            "{op} refused: block {label!r} would hold {chars} characters, {over} over its limit of {limit} "
            "(room left now: {room} characters). Shorten the text by at least {over} characters, or first "
            "make room with {replace} / {rethink}.",
            op=op,
            label=row.label,
            chars=len(new_value),
            over=over,
            limit=row.limit,
            room=max(row.limit - row.chars, 0),
        )


def refuse_line_prefixes(op: Verb, **texts: str) -> None:
    """Refuse text that carries line-number prefixes copied from a numbered view of a block."""
    for name, text in texts.items():
        m = LINE_PREFIX_RE.search(text)
        if m:
            raise MemoryRefusal(
                "{op} refused: {name} contains a line-number prefix ({prefix!r}), which looks copied from a "
                "numbered view of the block. Line numbers are not part of the value: send the text without them.",
                op=op,
                name=name,
                prefix=m.group(0).strip(),
            )


def line_numbers_of(value: str, needle: str) -> list[int]:
    """1-based line numbers where each occurrence of ``needle`` starts."""
    lines: list[int] = []
    start = 0
    while (idx := value.find(needle, start)) != -1:
        lines.append(value.count("\n", 0, idx) + 1)
        start = idx + 1
    return lines


# ---------------------------------------------------------------- the edits


def appended(row: BlockRow, content: str) -> str:
    return content if row.value == "" else row.value + "\n" + content


def check_replace_args(old_str: str, new_str: str, op: Verb = Verb.REPLACE) -> None:
    if old_str == "":
        raise MemoryRefusal(
            "{op} refused: old_str is empty. Give the exact text to replace; to add text use {append} or "
            "{insert}, to rewrite everything use {rethink}.",
            op=op,
        )
    refuse_line_prefixes(op, old_str=old_str, new_str=new_str)


def replaced(row: BlockRow, old_str: str, new_str: str, op: Verb = Verb.REPLACE) -> str:
    lines = line_numbers_of(row.value, old_str)
    if not lines:
        raise MemoryRefusal(
            "{op} refused: old_str was not found in block {label!r} (version {version}). It must match the "
            "current value exactly, including whitespace; read the block with {read} and copy the text from there.",
            op=op,
            label=row.label,
            version=row.version,
        )
    if len(lines) > 1:
        raise MemoryRefusal(
            "{op} refused: old_str occurs {count} times in block {label!r} (starting on lines {where}). "
            "Include more surrounding text so it occurs exactly once.",
            op=op,
            count=len(lines),
            label=row.label,
            where=", ".join(str(n) for n in lines),
        )
    return row.value.replace(old_str, new_str, 1)


def inserted(row: BlockRow, new_str: str, insert_line: int, op: Verb = Verb.INSERT) -> str:
    """``new_str`` after line ``insert_line`` (0 = the top, -1 = the end)."""
    lines = row.value.split("\n") if row.value else []
    n = len(lines)
    if insert_line == -1:
        at = n
    elif 0 <= insert_line <= n:
        at = insert_line
    else:
        raise MemoryRefusal(
            "{op} refused: insert_line {insert_line} is out of range; block {label!r} has {n} lines. "
            "Use 0 for the top, 1..{n} to insert after that line, or -1 for the end.",
            op=op,
            insert_line=insert_line,
            label=row.label,
            n=n,
        )
    return "\n".join([*lines[:at], *new_str.split("\n"), *lines[at:]])


def renamed_away(label: str, to: str) -> MemoryRefusal:
    return MemoryRefusal(
        "{undo} refused: block {label!r} was renamed to {to!r}; undo the rename there ({undo} on {to!r}).",
        label=label,
        to=to,
    )


def nothing_to_undo(label: str) -> MemoryRefusal:
    return MemoryRefusal(
        "{undo} refused: block {label!r} has no change left to undo (see {history}).", label=label
    )


def recreated_since_delete(label: str) -> MemoryRefusal:
    return MemoryRefusal(
        "{undo} refused: block {label!r} was deleted and then created again; edit the new block instead.",
        label=label,
    )


def line_count(value: str) -> int:
    return value.count("\n") + 1 if value else 0


def resolve_range(view_range: Sequence[int] | None, total: int, label: str) -> tuple[int, int]:
    """``[start, end]`` (1-based, inclusive, end -1 = last line) -> (first, last); refuses nonsense."""
    if view_range is None:
        return 1, total
    if len(view_range) != 2:
        raise MemoryRefusal(
            "view_range must be two line numbers [start, end] (end -1 = to the last line), got {got}.",
            got=list(view_range),
        )
    start, end = view_range
    end = total if end == -1 else end
    if not 1 <= start <= max(total, 1) or end < start:
        raise MemoryRefusal(
            "view_range {got} does not fit block {label!r}, which has {total} lines: use [start, end] with "
            "1 <= start <= {top} and end >= start, or end -1 for the last line.",
            got=list(view_range),
            label=label,
            total=total,
            top=max(total, 1),
        )
    return start, min(end, total)
