"""A stored session's history: every ``run_code`` call and its result, for ``export_notebook``.

One JSON line per call in ``<session home>/history.jsonl`` (outside the working directory:
the server writes it, sandboxed code cannot reach it), appended after each call. Bounded:
at most ``MAX_ENTRIES`` calls and ``MAX_BYTES`` bytes; past either, the oldest calls are
dropped (the file is rewritten with the newest half). A result is stored as the run_code
result was built (its output already under the call's budgets, images included).

Error policy: history is a convenience; a failure to write it is logged, never raised
into the call. Lines that do not parse are skipped when read.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from kernmind.execution.results import RunResult

log = logging.getLogger(__name__)

MAX_ENTRIES = 500
MAX_BYTES = 64 * 1024 * 1024


# (size, lines) of each history file as our last write left it: the next append counts on from
# there instead of reading the whole file again (up to MAX_BYTES) after every call.
_lines_after_write: dict[Path, tuple[int, int]] = {}


def record(path: Path, code: str, result: RunResult) -> None:
    """Append one call (blocking: call it off the event loop)."""
    line = json.dumps({"code": code, "result": result.model_dump(mode="json", by_alias=True)}) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as fh:
            before = fh.tell()
            fh.write(line)
            size = fh.tell()
        known = _lines_after_write.pop(path, None)
        lines = known[1] + 1 if known is not None and known[0] == before else _count_lines(path)
        if size > MAX_BYTES or lines > MAX_ENTRIES:
            _trim(path)
        else:
            _lines_after_write[path] = (size, lines)
            while len(_lines_after_write) > 1024:
                _lines_after_write.pop(next(iter(_lines_after_write)))
    except OSError as exc:
        log.warning("could not record the call in %s: %s", path, exc)


def read(path: Path) -> list[dict[str, Any]]:
    """The recorded calls, oldest first (``code`` and ``result``)."""
    entries: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("result"), dict):
                    entries.append(entry)
    except FileNotFoundError:
        return []
    return entries


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def _trim(path: Path) -> None:
    """Keep the newest half of the budget (by count and bytes)."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if len(kept) >= MAX_ENTRIES // 2 or size + len(line) > MAX_BYTES // 2:
            break
        kept.append(line)
        size += len(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(reversed(kept)), encoding="utf-8")
    os.replace(tmp, path)
