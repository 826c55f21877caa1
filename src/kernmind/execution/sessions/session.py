"""A session as the registry keeps it: ``Session`` (its lock, working directory, package layer,
runner state and bookkeeping flags), the ``Hooks`` the executor gives the registry, and the
rule for session ids.

Design: ``Session`` is plain state; deciding when a session is loaded, held, unloaded or
closed is the registry's (``registry.py``). Runners keep what they need per language in
``session.state``. The working directory and the package layer are made on first use
(``files()``, ``layer()``): a session that never touches them costs nothing. ``idle()``
says whether it could be unloaded now without losing anything but its interpreter (only a
session with a stored home can: an unstored one's files would go).

Error policy: a session id that is empty or malformed is refused by ``check_session_id``
with a ``SessionError`` sentence saying what an id may be; a package layer asked of a server
that cannot install raises ``SessionError`` too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from kernmind.execution.errors import SessionError
from kernmind.execution.packages.layer import Layer
from kernmind.execution.results import ago
from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions.disk_store import LOCAL_OWNER, Meta, SessionHome

if TYPE_CHECKING:
    from kernmind.execution.sandbox.limits import SessionLimits

DEFAULT_SESSION = "default"
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_session_id(session_id: str | None) -> str:
    if session_id is None:
        return DEFAULT_SESSION
    if not isinstance(session_id, str) or not SESSION_ID_RE.match(session_id):
        shown = repr(session_id)[:80]
        raise SessionError(
            f"invalid session_id {shown}: use 1-64 letters, digits, '_', '-' or '.', starting with a "
            "letter or digit, or leave it out for the default session."
        )
    return session_id


@dataclass(eq=False)
class Session:
    id: str
    new_workspace: Callable[[], Workspace] = field(repr=False)
    owner: str = LOCAL_OWNER
    home: SessionHome | None = field(default=None, repr=False)  # None: ephemeral
    meta: Meta | None = field(default=None, repr=False)
    ephemeral: bool = False
    lock: anyio.Lock = field(default_factory=anyio.Lock, repr=False)
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    closed: bool = False
    resumed: bool = False  # loaded from the store: its variables may come back
    dirty: bool = False  # code ran since the last checkpoint
    meta_unsaved: bool = False  # its meta could not be written (a full disk): written at the next chance
    meta_due: bool = False  # its meta is written a moment after its last call (``_meta_soon``)
    pending_notes: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # per-runner state, keyed by language
    workspace: Workspace | None = None
    packages: Layer | None = None  # what install_packages put here (see packages/layer.py)
    new_layer: Callable[[], Layer] | None = field(default=None, repr=False)
    running: anyio.CancelScope | None = None  # the call in progress
    stopped_because: str | None = None  # why the server interrupted the call (``Executor.stop_calls``)
    stopped_as: str = "ServerShuttingDown"  # the error name of that result (``PrincipalRevoked``: revoked)
    limits: SessionLimits | None = field(default=None, repr=False)  # its control group, its write block

    def __post_init__(self) -> None:
        if self.workspace is not None and not self.ephemeral:
            self.workspace.mount_owner = self.owner  # its sandboxes bind its owner's --mount folders

    @property
    def key(self) -> tuple[str, str]:
        return self.owner, self.id

    def files(self) -> Workspace:
        """The session's working directory, made on first use; its sandboxes bind the ``--mount``
        folders of the session's owner (``sandbox/host_mounts.py``; a ``--stateless`` call's: none)."""
        if self.workspace is None:
            self.workspace = self.new_workspace()
            if not self.ephemeral:
                self.workspace.mount_owner = self.owner
        return self.workspace

    def layer(self) -> Layer:
        """The session's package layer, made on first use."""
        if self.packages is None:
            if self.new_layer is None:
                raise SessionError("this server cannot install packages into sessions.")
            self.packages = self.new_layer()
        return self.packages

    def mark_resumed(self) -> None:
        """Loaded from the store: its variables may come back, and its next call says it resumed."""
        assert self.meta is not None
        self.resumed, meta = True, self.meta
        files = f"{meta.files} file{'s' if meta.files != 1 else ''}" if meta.files else "no files"
        self.pending_notes.append(
            f"resumed stored session {meta.session_id!r} (last used {ago(time.time() - meta.last_used)}, "
            f"{files} in its working directory)."
        )

    async def drop_packages(self) -> None:
        if self.packages is not None:
            await anyio.to_thread.run_sync(self.packages.remove)

    def take_notes(self) -> list[str]:
        notes, self.pending_notes = self.pending_notes, []
        return notes

    def idle(self) -> bool:
        """Could be unloaded now without losing anything but its interpreter (variables are saved)."""
        return not (self.busy or self.closed or self.lock.locked() or self.home is None)


Hook = Callable[[Session], Awaitable[None]]


@dataclass
class Hooks:
    """What the executor does to a session's runners (the registry only decides when)."""

    open_home: Callable[[SessionHome], Workspace]  # the Workspace of a home, files handed to its uid
    release: Hook  # stop what runners keep for it (closing)
    suspend: Hook  # save what can be saved, then stop (unloading)
    autosave: Hook  # checkpoint a live, idle session
