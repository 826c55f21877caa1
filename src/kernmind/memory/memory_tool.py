"""The ``memory`` tool: Anthropic's memory-tool dialect over the same blocks as the block tools
(what it answers: docs/tools.md, "The memory tool").

Design: ``/memories/<label>`` is the block ``<label>`` (a label with ``/`` is a file in a folder, which
exists while a block is in it); every edit is a block operation (block_store.py); a folder's
``delete`` and ``rename`` apply to each file (a transaction each) after checking none is read-only.
Error policy: bad paths, missing files and block refusals are :class:`MemoryRefusal` in this
dialect's words (``view``, ``str_replace`` …).
"""

from __future__ import annotations

from collections.abc import Sequence

from kernmind.budget import Budget, left_out, shown_lines
from kernmind.memory import blocks as rules
from kernmind.memory.block_store import Blocks
from kernmind.memory.errors import BLOCK_TOOL_WORDS, MemoryRefusal, Verb, Words
from kernmind.memory.records import BlockRow

ROOT = "/memories"
SNIPPET_CONTEXT = 4

DIALECT_WORDS: Words = {
    **BLOCK_TOOL_WORDS,
    Verb.READ: "view",
    Verb.LIST: "view /memories",
    Verb.CREATE: "create",
    Verb.APPEND: "insert",
    Verb.REPLACE: "str_replace",
    Verb.INSERT: "insert",
    Verb.RETHINK: "create (it overwrites)",
    Verb.DELETE: "delete",
    Verb.RENAME: "rename",
}


def label_of(path: str) -> str:
    """``/memories/a/b`` -> ``a/b``; ``/memories`` -> ``""``; anything else is refused."""
    raw = path.strip()
    if raw.rstrip("/") == ROOT:
        return ""
    if not raw.startswith(ROOT + "/"):
        raise MemoryRefusal(
            "The path {path!r} is outside /memories. Every memory path starts with /memories, e.g. "
            "/memories/notes or /memories/projects/kernmind.",
            path=path,
        )
    label = raw[len(ROOT) + 1 :].rstrip("/")
    if any(part in ("", ".", "..") for part in label.split("/")) or not rules.LABEL_RE.match(label):
        raise MemoryRefusal(
            "The path {path!r} is not a valid memory path: after /memories/ use names of letters, digits, "
            "'_', '.' or '-' (not starting with '.'), separated by single '/' (no '..', no empty parts).",
            path=path,
        )
    return label


def path_of(label: str) -> str:
    return f"{ROOT}/{label}" if label else ROOT


def human_size(chars: int) -> str:
    return f"{chars / 1024:.1f}K" if chars >= 1024 else str(chars)


def numbered_lines(lines: Sequence[str], first: int) -> str:
    return "\n".join(f"{first + i:6d}\t{line}" for i, line in enumerate(lines))


class MemoryDirectory:
    """The ``memory`` tool's commands over one namespace's blocks (see the module docstring)."""

    def __init__(self, blocks: Blocks, budget: int) -> None:
        self.blocks = blocks
        self.budget = budget

    async def _file_or_folder(self, label: str) -> tuple[BlockRow | None, list[BlockRow]]:
        rows = await self.blocks.list()
        exact = next((r for r in rows if r.label == label), None)
        inside = [r for r in rows if not label or r.label.startswith(label + "/")]
        return exact, inside

    @staticmethod
    def _missing(path: str) -> MemoryRefusal:
        return MemoryRefusal(
            "The path {path} does not exist. Please provide a valid path ({list} shows what exists).",
            path=path,
        )

    # ------------------------------------------------------------ commands

    async def view(self, path: str, view_range: list[int] | None = None) -> str:
        label = label_of(path)
        exact, inside = await self._file_or_folder(label)
        if exact is not None:
            return self._view_file(exact, view_range)
        if not inside and label:
            raise self._missing(path_of(label))
        if view_range is not None:
            raise MemoryRefusal(
                "view_range applies to files, and {path} is a directory.", path=path_of(label)
            )
        return self._view_folder(label, inside)

    def _view_folder(self, label: str, rows: list[BlockRow]) -> str:
        depth = label.count("/") + 1 if label else 0
        sizes: dict[str, int] = {}
        notes: dict[str, str] = {}
        for r in rows:
            parts = r.label.split("/")
            for level in range(depth + 1, min(len(parts), depth + 2) + 1):
                key = "/".join(parts[:level])
                sizes[key] = sizes.get(key, 0) + r.chars
            if len(parts) <= depth + 2:
                flags = " (read-only)" if r.read_only else ""
                notes[r.label] = f"{r.description}{flags}".strip()
        lines = [
            f"Here're the files and directories up to 2 levels deep in {path_of(label)}, "
            "excluding hidden items and node_modules:",
            f"{human_size(sum(r.chars for r in rows))}\t{path_of(label)}",
        ]
        for key in sorted(sizes):
            is_dir = key not in notes
            entry = f"{human_size(sizes[key])}\t{path_of(key)}{'/' if is_dir else ''}"
            lines.append(entry + (f"\t# {notes[key]}" if notes.get(key) else ""))
        return self._within_budget(
            lines, f"view a folder, e.g. {path_of(label) if label else ROOT + '/<folder>'}"
        )

    def _view_file(self, row: BlockRow, view_range: list[int] | None) -> str:
        path = path_of(row.label)
        total = rules.line_count(row.value)
        first, last = rules.resolve_range(view_range, total, row.label)
        lines = row.value.split("\n")[first - 1 : last] if total else []
        head = (
            f"Here's the content of {path} with line numbers (version {row.version}, "
            f"{row.chars}/{row.limit} characters{', read-only' if row.read_only else ''}):"
        )
        budget = Budget(self.budget)
        budget.spend(len(head) + 300)  # the head, and the line on what was left out
        numbered = [f"{first + i:6d}\t{line}" for i, line in enumerate(lines)]
        shown = budget.lines(numbered)
        body = [head, *numbered[:shown]]
        if shown < len(numbered):
            more = f"view with view_range=[{first + max(shown, 1)}, -1] for the rest"
            if not shown:  # one line longer than the budget: cut inside it
                body.append(budget.take(numbered[0], more="")[0])
                whole = f"line {first} alone is longer than the budget and was cut (memory://blocks/{row.label} holds it whole)"
                more = f"{whole}; {more}" if first < total else whole
            body.append(f"[{shown_lines(first, first + max(shown, 1) - 1, total, budget, more)}]")
        return "\n".join(body)

    def _within_budget(self, lines: list[str], hint: str) -> str:
        budget = Budget(self.budget)
        budget.spend(300)  # the line on what was left out
        shown = max(budget.lines(lines), 1)
        if shown == len(lines):
            return "\n".join(lines)
        return "\n".join([*lines[:shown], f"[{left_out(len(lines) - shown, 'entries', budget, hint)}]"])

    async def create(self, path: str, file_text: str, expected_version: int | None = None) -> str:
        label = label_of(path)
        if not label:
            raise MemoryRefusal("{path} is the memory directory itself; create a file inside it.", path=path)
        exact, inside = await self._file_or_folder(label)
        if exact is None and inside:
            raise MemoryRefusal("{path} is a directory; choose a file name inside it.", path=path_of(label))
        await self._refuse_file_as_folder(label)
        if exact is not None:
            await self.blocks.rethink(label, file_text, expected_version)
            return f"File {path_of(label)} has been overwritten (the previous text is kept: memory_undo restores it)."
        limit = min(max(self.blocks.default_limit, len(file_text)), self.blocks.max_limit)
        await self.blocks.create(label, file_text, "", limit)
        return f"File created successfully at: {path_of(label)}"

    async def _refuse_file_as_folder(self, label: str) -> None:
        """A label under a folder whose name is a file (``notes/x`` while ``notes`` is a file)."""
        parts = label.split("/")
        rows = {r.label for r in await self.blocks.list()}
        for level in range(1, len(parts)):
            parent = "/".join(parts[:level])
            if parent in rows:
                raise MemoryRefusal(
                    "{parent} is a file, so it cannot hold {path}; choose another folder name.",
                    parent=path_of(parent),
                    path=path_of(label),
                )

    async def str_replace(
        self, path: str, old_str: str, new_str: str, expected_version: int | None = None
    ) -> str:
        label = await self._existing_file(path)
        row = await self.blocks.replace(label, old_str, new_str, expected_version)
        at = row.value.find(new_str) if new_str else (row.previous or "").find(old_str)
        line = row.value.count("\n", 0, max(at, 0)) + 1
        return "The memory file has been edited.\n" + self._snippet(row, line, line + new_str.count("\n"))

    async def insert(
        self, path: str, insert_line: int, insert_text: str, expected_version: int | None = None
    ) -> str:
        label = await self._existing_file(path)
        row = await self.blocks.insert(label, insert_text, insert_line, expected_version)
        first = (rules.line_count(row.previous or "") if insert_line == -1 else insert_line) + 1
        return f"The file {path_of(label)} has been edited.\n" + self._snippet(
            row, first, first + insert_text.count("\n")
        )

    def _snippet(self, row: BlockRow, first: int, last: int) -> str:
        lines = row.value.split("\n")
        lo = max(first - SNIPPET_CONTEXT, 1)
        hi = min(last + SNIPPET_CONTEXT, len(lines))
        shown = [line[:500] for line in lines[lo - 1 : hi]]
        text, cut = Budget(self.budget - 200).take(numbered_lines(shown, lo), more="")
        if cut is not None:
            text += f" … [view with view_range=[{lo}, {hi}] for these lines]"
        return (
            f"Here's the result of running `cat -n` on a snippet of {path_of(row.label)} (version {row.version}):\n"
            f"{text}"
        )

    async def _existing_file(self, path: str) -> str:
        label = label_of(path)
        exact, inside = await self._file_or_folder(label)
        if exact is not None:
            return label
        if inside or not label:
            raise MemoryRefusal("{path} is a directory; edit a file inside it.", path=path_of(label))
        raise self._missing(path_of(label))

    async def delete(self, path: str, expected_version: int | None = None) -> str:
        label = label_of(path)
        if not label:
            raise MemoryRefusal("The memory directory itself cannot be deleted; delete files inside it.")
        exact, inside = await self._file_or_folder(label)
        if exact is not None:
            await self.blocks.delete(label, expected_version)
        elif inside:
            self._refuse_read_only(inside, Verb.DELETE)
            for r in inside:
                await self.blocks.delete(r.label)
        else:
            raise self._missing(path_of(label))
        return f"Successfully deleted {path_of(label)}"

    @staticmethod
    def _refuse_read_only(rows: list[BlockRow], op: Verb) -> None:
        """A folder operation touches every file in it: refuse up front if one of them is read-only."""
        locked = [path_of(r.label) for r in rows if r.read_only]
        if locked:
            raise MemoryRefusal(
                "{op} refused: {locked} in that folder are read-only, so the folder cannot be changed as a whole; "
                "work on the other files one by one.",
                op=op,
                locked=", ".join(locked),
            )

    async def rename(self, old_path: str, new_path: str, expected_version: int | None = None) -> str:
        old, new = label_of(old_path), label_of(new_path)
        if not old or not new:
            raise MemoryRefusal(
                "The memory directory itself cannot be renamed; rename files or folders inside it."
            )
        exact, inside = await self._file_or_folder(old)
        target, target_inside = await self._file_or_folder(new)
        if target is not None or target_inside:
            raise MemoryRefusal("The destination {path} already exists.", path=path_of(new))
        await self._refuse_file_as_folder(new)
        if exact is not None:
            await self.blocks.rename(old, new, expected_version)
        elif inside:
            self._refuse_read_only(inside, Verb.RENAME)
            for r in inside:
                await self.blocks.rename(r.label, new + r.label[len(old) :])
        else:
            raise self._missing(path_of(old))
        return f"Successfully renamed {path_of(old)} to {path_of(new)}"
