"""Refusals: what the memory domain says when a request cannot be carried out, in domain words.

Design: a refusal is a ``str.format`` template plus the facts it names (substituted once, never
re-parsed: a label with braces shows as it is). An action it suggests is a :class:`Verb` placeholder
(``{read}``, ``{replace}`` …), which each surface renders in its own words (:meth:`MemoryRefusal.render`:
``memory_read``, ``view``, ``--replace``); ``str(refusal)`` uses the block tools' words.

Error policy: raises nothing itself; a ``MemoryRefusal`` is a ``Refusal`` (boundary.py answers it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Iterator, Mapping
from enum import StrEnum
from typing import TypeVar

from kernmind.diskio import StorageError, disk_sentence
from kernmind.refusals import Refusal

T = TypeVar("T")


class Verb(StrEnum):
    """Actions a refusal may point the caller to."""

    READ = "read"
    LIST = "list"
    CREATE = "create"
    APPEND = "append"
    REPLACE = "replace"
    INSERT = "insert"
    RETHINK = "rethink"
    DELETE = "delete"
    RENAME = "rename"
    UNDO = "undo"
    HISTORY = "history"
    REMEMBER = "remember"  # store an archival passage
    SEARCH = "search"  # search archival passages
    FORGET = "forget"  # delete an archival passage
    IMPORT = "import"
    OVERWRITE = "overwrite"  # let an import replace existing blocks


Words = Mapping[Verb, str]

BLOCK_TOOL_WORDS: Words = {
    Verb.READ: "memory_read",
    Verb.LIST: "memory_list",
    Verb.CREATE: "memory_create",
    Verb.APPEND: "memory_append",
    Verb.REPLACE: "memory_replace",
    Verb.INSERT: "memory_insert",
    Verb.RETHINK: "memory_rethink",
    Verb.DELETE: "memory_delete",
    Verb.RENAME: "memory_rename",
    Verb.UNDO: "memory_undo",
    Verb.HISTORY: "memory_history",
    Verb.REMEMBER: "archival_memory_insert",
    Verb.SEARCH: "archival_memory_search",
    Verb.FORGET: "archival_memory_delete",
    Verb.IMPORT: "import",
    Verb.OVERWRITE: "the replace option",
}


class MemoryRefusal(Refusal):
    """A request the caller can fix; the message says how. Nothing was changed."""

    def __init__(self, template: str, /, **facts: object) -> None:
        super().__init__(template)
        self.template = template
        self.facts = facts
        self.words: Words | None = None  # the surface's words (set where it is raised through one)

    def render(self, words: Words = BLOCK_TOOL_WORDS) -> str:
        def word(verb: Verb) -> str:
            return words.get(verb) or BLOCK_TOOL_WORDS[verb]

        values: dict[str, object] = {v.value: word(v) for v in Verb}
        values.update({k: word(v) if isinstance(v, Verb) else v for k, v in self.facts.items()})
        return self.template.format_map(values)

    def __str__(self) -> str:
        return self.render(self.words or BLOCK_TOOL_WORDS)


@contextlib.contextmanager
def refusals(words: Words = BLOCK_TOOL_WORDS) -> Iterator[None]:
    """A refusal raised through a surface speaks its words (the boundary answers it); a full disk
    under the database (the write was rolled back) says so in memory's words."""
    try:
        yield
    except MemoryRefusal as exc:
        exc.words = words
        raise
    except Exception as exc:
        sentence = disk_sentence(exc, "save this change to memory", kept="Memory is unchanged.")
        if sentence is None:
            raise
        raise StorageError(sentence) from exc


async def call(coro: Awaitable[T], words: Words = BLOCK_TOOL_WORDS) -> T:
    """``await coro`` inside :func:`refusals`."""
    with refusals(words):
        return await coro
