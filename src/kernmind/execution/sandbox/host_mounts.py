"""Host folders in the sandbox: ``kernmind serve --mount HOST_DIR[:NAME][:ro|rw][:for=PRINCIPAL]``.

Design (docs/security.md, "Host folders"): each folder is resolved once and bound at
``/mnt/NAME``, read-only unless ``rw``, for the owner's sessions or ``for=``'s principal only;
warm kernels carry none; without bubblewrap nothing is bound.

Error policy: a bad ``--mount`` stops the start with ``MountError``, a sentence naming the value
and what to write instead.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MOUNT_ROOT = "/mnt"
OWNER_KEY = "local"  # the server owner's data key (principals.LOCAL.owner; no import: the core stays small)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class MountError(ValueError):
    """A ``--mount`` value that cannot be used (the sentence says why and what to write)."""


@dataclass(frozen=True)
class HostMount:
    """One host folder: where it is, where code finds it, whether code may write, and whose it is."""

    host: Path  # resolved at start (realpath)
    name: str
    writable: bool = False
    principal: str | None = None  # None: the server owner's; else that principal's only

    @property
    def inner(self) -> str:
        return f"{MOUNT_ROOT}/{self.name}"

    def allowed(self, owner: str | None) -> bool:
        """Whether sessions kept under the data key ``owner`` get this folder."""
        if owner is None:
            return False
        if self.principal is None:
            return owner == OWNER_KEY
        return owner == self.principal

    def describe(self, isolated: bool) -> str:
        mode = "read-write" if self.writable else "read-only"
        who = (
            f"principal {self.principal!r} only" if self.principal else "the server's owner (stdio, --token)"
        )
        where = self.inner if isolated else f"not bound (no sandbox: code reads {self.host} directly)"
        return f"{self.host} -> {where} ({mode}; {who})"


def parse(spec: str, data_dir: Path | None = None) -> HostMount:
    """``HOST_DIR[:NAME][:ro|rw][:for=PRINCIPAL]`` → a ``HostMount`` (``MountError`` when unusable)."""
    parts = spec.split(":")
    host_text, rest = parts[0], parts[1:]
    name: str | None = None
    writable = False
    principal: str | None = None
    for part in rest:
        if part in ("ro", "rw"):
            writable = part == "rw"
        elif part.startswith("for="):
            principal = part[4:]
            if not NAME_RE.match(principal):
                raise MountError(f"--mount {spec!r}: {principal!r} is not a principal name (for=NAME).")
        elif name is None and part:
            name = part
        else:
            raise MountError(
                f"--mount {spec!r}: write HOST_DIR[:NAME][:ro|rw][:for=PRINCIPAL] "
                "(e.g. ~/data:sales:ro); a host path holding ':' cannot be mounted."
            )
    if not host_text:
        raise MountError(f"--mount {spec!r}: the host folder is missing (HOST_DIR[:NAME][:ro|rw]).")
    host = Path(os.path.realpath(os.path.expanduser(host_text)))
    if not host.is_dir():
        raise MountError(f"--mount {spec!r}: {host} is not a directory on this machine.")
    name = name or re.sub(r"[^A-Za-z0-9_.-]+", "-", host.name).strip("-._")[:64]  # 'My Data' -> My-Data
    if not NAME_RE.match(name):
        raise MountError(
            f"--mount {spec!r}: {name!r} cannot be a name under {MOUNT_ROOT}: give one with "
            "HOST_DIR:NAME (1-64 letters, digits, '_', '-' or '.', starting with a letter or digit)."
        )
    if data_dir is not None:
        data = Path(os.path.realpath(data_dir))
        if data == host or host in data.parents or data in host.parents:
            raise MountError(
                f"--mount {spec!r}: {host} holds (or is inside) kernmind's data dir {data}; sandboxed code "
                "would read the memory database and every session. Mount a folder beside it instead."
            )
    return HostMount(host, name, writable, principal)


def parse_all(specs: Sequence[str], data_dir: Path | None = None) -> tuple[HostMount, ...]:
    mounts = tuple(parse(spec, data_dir) for spec in specs)
    seen: dict[tuple[str | None, str], HostMount] = {}
    for mount in mounts:
        for other in seen.values():
            if other.name == mount.name and other.principal == mount.principal:  # seen by the same sessions
                raise MountError(
                    f"--mount: two folders would appear at {mount.inner} ({other.host} and {mount.host}); "
                    "give one of them another NAME (HOST_DIR:NAME)."
                )
        seen[(mount.principal, mount.name)] = mount
    return mounts


def for_owner(mounts: Sequence[HostMount], owner: str | None) -> list[HostMount]:
    """The folders the sandboxes of sessions kept under ``owner`` get."""
    return [m for m in mounts if m.allowed(owner)]


def start(specs: Sequence[str], data_dir: Path, isolated: bool) -> tuple[HostMount, ...]:
    """The server's ``--mount`` folders, resolved now; without a sandbox, a warning that none is bound."""
    mounts = parse_all(specs, data_dir)
    if mounts and not isolated:
        log.warning(
            "--mount: no sandbox here (bubblewrap is off or missing), so nothing is bound at %s: code runs "
            "as this user and reads %s at their own paths; install bubblewrap to confine it to the mounts",
            MOUNT_ROOT,
            ", ".join(str(m.host) for m in mounts),
        )
    return mounts
