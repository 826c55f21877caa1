"""A session's package layer: the directory the server installs into for one session.

Design: ``root/python`` is a flat ``--target`` directory put on the path after the
interpreter's packages; ``root/deno`` a ``DENO_DIR``. Only the server writes a layer: its files
may be hard links into the shared cache, so sandboxes get it read-only (``/kernmind/packages``).

Error policy: ``merge_untrusted_tree`` skips what is not a regular file or directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

from kernmind.execution.sandbox.bwrap_args import Mount


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    # Its declared dependencies and extras (what a resolver must know about an installed one).
    requires: tuple[str, ...] = field(default=(), compare=False)
    extras: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)


def distributions_in(directory: Path) -> dict[str, Distribution]:
    """Installed distributions (``*.dist-info``) directly in ``directory``, by normalised name."""
    found: dict[str, Distribution] = {}
    if not directory.is_dir():
        return found
    for dist in metadata.distributions(path=[str(directory)]):
        name, version = dist.metadata["Name"], dist.version
        if name and version:
            extras = tuple(dist.metadata.get_all("Provides-Extra") or ())
            found.setdefault(
                canonicalize_name(name), Distribution(name, version, tuple(dist.requires or ()), extras)
            )
    return found


LAYER_MOUNT = "/kernmind/packages"


@dataclass(frozen=True)
class Layer:
    root: Path

    @property
    def mount(self) -> Mount:
        """Sandboxes see the layer read-only at ``/kernmind/packages`` (``python``, ``deno`` in it)."""
        return Mount(self.root, LAYER_MOUNT)

    @property
    def python(self) -> Path:
        return self.root / "python"

    @property
    def deno(self) -> Path:
        return self.root / "deno"

    def create(self) -> Layer:
        for path in (self.python, self.deno):
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, 0o755)
        os.chmod(self.root, 0o755)
        return self

    def python_distributions(self) -> dict[str, Distribution]:
        return distributions_in(self.python)

    def is_empty(self) -> bool:
        parts = [p for p in (self.python, self.deno) if p.is_dir()]
        return not any(any(p.iterdir()) for p in parts)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def adopt_from(self, other: Layer) -> None:
        """Move ``other``'s contents here (same file system: renames, no copying)."""
        self.create()
        for part in ("python", "deno"):
            src, dst = other.root / part, self.root / part
            if not src.is_dir():
                continue
            for entry in src.iterdir():
                target = dst / entry.name
                if target.exists():
                    continue  # already here (the layers were merged before)
                shutil.move(str(entry), str(target))
        other.remove()


def merge_untrusted_tree(source: Path, target: Path) -> list[str]:
    """Move a tree written by sandboxed code into ``target``; return what was skipped. Only regular files and
    directories, no replacing, modes cut to ``rwxr-xr-x``, owned by the server."""
    skipped: list[str] = []
    uid, gid = os.getuid(), os.getgid()
    for dirpath, dirnames, filenames in os.walk(source):
        rel = Path(dirpath).relative_to(source)
        dest_dir = target / rel
        dest_dir.mkdir(parents=True, exist_ok=True)
        for name in list(dirnames):
            if os.path.islink(os.path.join(dirpath, name)):
                dirnames.remove(name)
                skipped.append(str(rel / name))
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or (dest_dir / name).exists():
                skipped.append(str(rel / name))
                continue
            dest = dest_dir / name
            if st.st_dev == os.stat(dest_dir).st_dev:
                os.rename(path, dest)
            else:
                shutil.copyfile(path, dest)
            with contextlib.suppress(OSError):
                os.lchown(dest, uid, gid)
            os.chmod(dest, st.st_mode & 0o755)
        with contextlib.suppress(OSError):
            os.chmod(dest_dir, 0o755)
    return skipped
