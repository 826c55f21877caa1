"""A cut call's whole output, kept in a file in the session's working directory (what a caller
sees: docs/tools.md, "Every result respects a budget").

Design
- A Python kernel writes its own file (``kernels/setup.py``) and names it by a marker at the
  cell's end, which the collector takes out of the output (``KEPT_RE``); process runners (bash,
  R, Deno, Java) write through ``OutputFile``, fed by the collector.
- ``OutputFile`` stops at what was left of the workspace quota when the call started.
- The server runs as root and sandboxed code writes the working directory: the folder and the
  file are opened relative to its descriptor with ``O_NOFOLLOW`` (the file with ``O_EXCL``), so
  a planted symlink refuses the write instead of redirecting it.

Error policy: nothing here fails a call: a file that cannot be written ends keeping, and the
note says why.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

FOLDER = "kernmind-output"
MAX_KEPT = 1 << 30  # bytes per call without a workspace quota

# Written by the kernel (kernels/setup.py) at the end of a cell whose output it kept.
KEPT_RE = re.compile(
    r"\n… \[kernmind kept (\d+) characters of this (stdout|stderr) in ([^\]\n]{1,300}?)"
    r"(?:; the workspace refused the rest: ([^\]\n]{0,300}))?\] …\n"
)


@dataclass(slots=True)
class Kept:
    path: str  # relative to the working directory
    chars: int
    why: str | None = None  # set when the file holds only the start


def note(kept: dict[str, Kept]) -> str | None:
    """The result's note naming the kept files, or None."""
    if not kept:
        return None
    parts = []
    for stream, k in sorted(kept.items()):
        whole = f" (only the first part: {k.why})" if k.why else ""
        parts.append(f"{stream} ({k.chars:,} characters) in {k.path}{whole}")
    first = min(kept.values(), key=lambda k: k.path).path
    return (
        "the output was longer than this answer keeps; all of it is in the session's working "
        f"directory: {'; '.join(parts)}. Read it a page at a time with "
        f"download_file(path='{first}', offset=0, length=50000) (offset and length in bytes), or "
        "search it with code; delete the folder when done (it counts against the workspace quota)."
    )


class OutputFile:
    """Keeps a process's streams whole once they pass ``keep_after`` characters (see above)."""

    def __init__(self, root: Path, *, keep_after: int, limit: int, owner_uid: int | None = None) -> None:
        self.root, self.keep_after, self.limit, self.owner_uid = root, keep_after, limit, owner_uid
        self.total = 0
        self.written = 0
        self.early: dict[str, list[str]] = {}
        self.fds: dict[str, int] = {}
        self.kept: dict[str, Kept] = {}
        self.why: str | None = None
        self.stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())

    def add(self, stream: str, text: str) -> None:
        if self.why is not None or not text:
            return
        self.total += len(text)
        if not self.fds and self.total <= self.keep_after:
            self.early.setdefault(stream, []).append(text)
            return
        try:
            if stream not in self.fds:
                self._open(stream)
                self._put(stream, "".join(self.early.pop(stream, [])))
            self._put(stream, text)
        except OSError as exc:
            self.why = exc.strerror or str(exc)
            for k in self.kept.values():
                k.why = self.why

    def close(self) -> dict[str, Kept]:
        """Close the files; what was kept, by stream."""
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        return self.kept

    def _open(self, stream: str) -> None:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        root = os.open(self.root, flags)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(FOLDER, 0o755, dir_fd=root)
            folder = os.open(FOLDER, flags, dir_fd=root)
        finally:
            os.close(root)
        try:
            if self.owner_uid is not None:
                os.fchown(folder, self.owner_uid, self.owner_uid)
            create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            for n in range(100):
                name = f"{self.stamp}{f'-{n}' if n else ''}-{stream}.txt"
                try:
                    fd = os.open(name, create, 0o644, dir_fd=folder)
                    break
                except FileExistsError:
                    continue
            else:
                raise FileExistsError(f"no free name for an output file in {FOLDER}")
            if self.owner_uid is not None:
                os.fchown(fd, self.owner_uid, self.owner_uid)
        finally:
            os.close(folder)
        self.fds[stream] = fd
        self.kept[stream] = Kept(f"{FOLDER}/{name}", 0)

    def _put(self, stream: str, text: str) -> None:
        data = text.encode("utf-8", "backslashreplace")
        if self.written + len(data) > self.limit:
            raise OSError(0, "the workspace quota left no room for more")
        fd = self.fds[stream]
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        self.written += len(data)
        self.kept[stream].chars += len(text)
