"""A session's installed packages, kept with the stored session so they come back on resume.

Design: after an install that added something, the layer is kept in the session's home as
hard links (copies across file systems), replaced whole (``.packages-new`` renamed over), so a
kill leaves the old or the new copy (``recover``). ``restore`` links a fresh layer from it.
Its size counts against the stored-size caps; past them the install is not kept, and says so.

Error policy: ``keep`` raises ``OSError`` (the caller makes it a note); ``restore`` logs and
returns None when the copy cannot be linked (the session resumes without its packages).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from kernmind.execution.packages.layer import Layer
from kernmind.execution.packages.npm import cached_npm_packages

log = logging.getLogger(__name__)

KEPT = "packages"
NEW = ".packages-new"
OLD = ".packages-old"
PARTS = ("python", "deno")


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system (or a link limit): a copy
        shutil.copy2(src, dst)


def _link_tree(source: Path, target: Path) -> None:
    for part in PARTS:
        if _is_dir(source / part):
            shutil.copytree(
                source / part, target / part, symlinks=True, copy_function=_link_or_copy, dirs_exist_ok=True
            )


def layer_bytes(root: Path) -> int:
    """Apparent size of the regular files under ``root``, each file (inode) once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def recover(home: Path) -> None:
    """Finish or undo a ``keep`` that a crash interrupted."""
    if not _is_dir(home / KEPT) and _is_dir(home / OLD):
        os.rename(home / OLD, home / KEPT)
    for leftover in (NEW, OLD):
        if _is_dir(home / leftover):
            shutil.rmtree(home / leftover, ignore_errors=True)


def keep(layer: Layer, home: Path) -> int:
    """Replace the kept copy in ``home`` with ``layer``'s packages; return its size in bytes."""
    recover(home)
    staging = home / NEW
    staging.mkdir(mode=0o755)
    _link_tree(layer.root, staging)
    if _is_dir(home / KEPT):
        os.rename(home / KEPT, home / OLD)
    os.rename(staging, home / KEPT)
    shutil.rmtree(home / OLD, ignore_errors=True)
    return layer_bytes(home / KEPT)


def forget(home: Path) -> None:
    """Drop the kept copy (the session's packages then last only as long as it is live)."""
    recover(home)
    if _is_dir(home / KEPT):
        shutil.rmtree(home / KEPT, ignore_errors=True)


def restore(home: Path, new_layer: Callable[[], Layer]) -> Layer | None:
    """A fresh layer with the kept packages of the session at ``home`` (None when it has none)."""
    try:
        recover(home)
        kept = home / KEPT
        if not _is_dir(kept) or not any(_is_dir(kept / p) and any((kept / p).iterdir()) for p in PARTS):
            return None
        layer = new_layer()
        try:
            _link_tree(kept, layer.root)
        except BaseException:
            layer.remove()
            raise
        return layer
    except OSError as exc:
        log.warning("the kept packages in %s could not be restored: %s", home, exc)
        return None


def names(layer: Layer) -> list[str]:
    """What a layer holds, for a note: Python distributions, then npm packages."""
    python = sorted(d.name for d in layer.python_distributions().values())
    npm: Iterable[str] = sorted({f"npm:{d.name}" for d in cached_npm_packages(layer.deno)})
    return [*python, *npm]


def restored_note(layer: Layer) -> str:
    listed = names(layer)
    shown = ", ".join(listed[:12]) + (f", … ({len(listed)} in all)" if len(listed) > 12 else "")
    return f"its installed packages are back: {shown or 'none'}."


def not_kept_note(why: str) -> str:
    return (
        f"the packages are installed for as long as this session is live, but not stored with it: {why}. "
        "Close stored sessions you no longer need (close_session) and install again to keep them."
    )
