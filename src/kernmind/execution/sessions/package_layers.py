"""Packages that last with their session: the glue between installs, the store and its caps
(what a caller sees: docs/tools.md, "Sessions that last").

Design: ``keep`` (after an install that added something, under the session's lock) keeps the
layer in the stored home (``packages/stored.py``) while the owner's stored sessions, files and
packages together, stay within the stored-size caps (its size is ``packages_bytes``); past a cap
the kept copy is dropped and the note says why. ``restore`` (at load) brings them back as the
session's layer, with a note. Sessions without a home (``--stateless``, a gateway's) keep nothing.

Error policy: neither raises for what the disk does: an install that worked stays a success
(its note says the packages could not be stored), and a session whose packages cannot be
restored resumes without them, saying so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from kernmind.diskio import disk_sentence
from kernmind.execution.packages import stored
from kernmind.execution.packages.layer import Layer
from kernmind.execution.sandbox.workspace import off_loop

if TYPE_CHECKING:
    from kernmind.execution.sessions.disk_store import SessionStore
    from kernmind.execution.sessions.session import Session

log = logging.getLogger(__name__)

MIB = 2**20


def over_cap(store: SessionStore, session: Session, size: int) -> str | None:
    """Why keeping ``size`` bytes of packages would take the owner past a stored-size cap."""
    assert session.meta is not None
    others = [s for s in store.list() if (s.meta.owner, s.meta.session_id) != session.key]
    this = session.meta.bytes + size
    mine = this + sum(s.meta.bytes + s.meta.packages_bytes for s in others if s.meta.owner == session.owner)
    everyone = this + sum(s.meta.bytes + s.meta.packages_bytes for s in others)
    shared = store.per_owner_bytes < store.max_bytes
    if mine > store.per_owner_bytes:
        flag = "--max-stored-mb-per-principal" if shared else "--max-stored-mb"
        return (
            f"with them ({size / MIB:.1f} MiB) your stored sessions would use {mine / MIB:.0f} MiB, "
            f"over the {store.per_owner_bytes / MIB:.0f} MiB they may use ({flag})"
        )
    if everyone > store.max_bytes:
        return (
            f"with them ({size / MIB:.1f} MiB) this server's stored sessions would pass their limit of "
            f"{store.max_bytes / MIB:.0f} MiB (--max-stored-mb)"
        )
    return None


async def keep(session: Session, store: SessionStore | None) -> str | None:
    """Keep the session's layer in its home; a note when it was not kept."""
    home, meta, layer = session.home, session.meta, session.packages
    if home is None or meta is None or layer is None or store is None:
        return None

    def write() -> str | None:
        size = stored.layer_bytes(layer.root)
        why = over_cap(store, session, size)
        if why is not None:
            stored.forget(home.root)
            meta.packages_bytes = 0
            return stored.not_kept_note(why)
        meta.packages_bytes = stored.keep(layer, home.root)
        return None

    try:
        return await off_loop(write, timeout=None)
    except OSError as exc:
        what = "store the packages with the session (they are installed for as long as it is live)"
        return disk_sentence(exc, what) or f"the packages could not be stored with the session: {exc}."


async def restore(session: Session, new_layer: Callable[[], Layer] | None) -> None:
    """Give a session loaded from the store its kept packages (a note says which came back).
    Never raises: loading the session matters more than its packages."""
    home = session.home
    if home is None or new_layer is None:
        return
    try:
        layer = await off_loop(lambda: stored.restore(home.root, new_layer), timeout=None)
        if layer is not None:
            session.packages = layer
            session.pending_notes.append(await off_loop(lambda: stored.restored_note(layer), timeout=None))
            return
    except Exception:
        log.exception("restoring the packages of session %r failed; it resumes without them", session.id)
    if session.meta is not None and session.meta.packages_bytes:
        session.pending_notes.append(
            "its installed packages could not be restored (their stored copy is missing or damaged): "
            "install them again with install_packages."
        )
