"""Caps on live sessions: each principal's share, and the server-wide bound an admin sets
(what counts, and making room instead of refusing: docs/tools.md, "Caps on live sessions").

Design: ``Caps`` decides (and owns the ``--stateless`` slots); the registry acts on what it says,
unloading a session to make room through its one way out. Never unloaded to make room: a session
running a call, one a job holds, one without a stored home. A refusal names only the caller's
sessions; one by the server-wide bound names no one else's.

Error policy: refusals are ``SessionError`` (a ``ValueError``) with a sentence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from kernmind.execution.errors import SessionError

Key = tuple[str, str]  # (owner, session id)


class LiveSession(Protocol):
    id: str
    owner: str
    busy: bool
    last_used: float

    @property
    def key(self) -> Key: ...

    def idle(self) -> bool: ...


S = TypeVar("S", bound=LiveSession)


@dataclass
class Caps:
    """The two bounds and what is counted against them (the registry keeps the books)."""

    per_owner: int
    total: int
    slots: dict[str, int] = field(default_factory=dict)  # owner -> stateless calls/jobs in flight

    def counted(
        self, live: Iterable[Key], reserved: Iterable[Key], owner: str | None, but: Key | None
    ) -> int:
        """Sessions (live or reserved) and slots of ``owner`` (all owners: None), leaving ``but`` out."""
        keys = {k for k in (*live, *reserved) if (owner is None or k[0] == owner) and k != but}
        slots = sum(self.slots.values()) if owner is None else self.slots.get(owner, 0)
        return len(keys) + slots

    def room(
        self, sessions: Mapping[Key, S], reserved: Iterable[Key], owner: str, key: Key | None
    ) -> S | None:
        """None when one more session (``key``) or slot of ``owner`` fits; else the idle session to
        unload first. Raises ``SessionError`` when neither is possible."""
        reserved = set(reserved)
        idle = sorted((s for s in sessions.values() if s.idle() and s.key not in reserved), key=_lru)
        own_idle = [s for s in idle if s.owner == owner]
        if self.counted(sessions, reserved, owner, key) >= self.per_owner:
            if own_idle:
                return own_idle[0]
            raise self.owner_refusal(sessions, reserved, owner, stateless=key is None)
        if self.counted(sessions, reserved, None, key) >= self.total:
            if idle:  # the owner holding the most sessions gives one up: the least recently used
                held = {s.owner: self.counted(sessions, reserved, s.owner, None) for s in idle}
                return min(idle, key=lambda s: (-held[s.owner], s.last_used))
            raise self.total_refusal(sessions, reserved, owner)
        return None

    def take_slot(self, sessions: Mapping[Key, S], reserved: Iterable[Key], owner: str) -> None:
        """Count a ``--stateless`` call or job against ``owner`` (``SessionError`` at a cap: a
        stateless server has no live sessions to unload)."""
        self.room(sessions, reserved, owner, None)
        self.slots[owner] = self.slots.get(owner, 0) + 1

    def give_slot(self, owner: str) -> None:
        left = self.slots.get(owner, 0) - 1
        if left > 0:
            self.slots[owner] = left
        else:
            self.slots.pop(owner, None)

    def owner_refusal(
        self, sessions: Mapping[Key, LiveSession], reserved: set[Key], owner: str, *, stateless: bool
    ) -> SessionError:
        mine = _names(sessions, reserved, owner)
        slots = self.slots.get(owner, 0)
        # With one principal's share equal to the whole, the flag that sets it is the server's.
        flag, who = (
            ("--max-sessions-per-principal", "one principal")
            if self.per_owner < self.total
            else ("--max-sessions", "this server")
        )
        if stateless or not mine:
            return SessionError(
                f"you have {slots} calls running at once, the most {who} may run ({flag} {self.per_owner}; "
                "each has a sandbox of its own). Wait for one to finish, or stop a background job you no "
                "longer need with job_cancel."
            )
        also = f" and {slots} --stateless calls" if slots else ""
        return SessionError(
            f"you have {len(mine)} live sessions{also}, the most {who} may have "
            f"({flag} {self.per_owner}): {', '.join(mine)}. None is idle (each is "
            "running a call or held by a background job), so none could be unloaded to make room. Wait "
            "for a call to finish, stop a background job with job_cancel, close a session you no longer "
            "need with close_session, or reuse one of these session_ids."
        )

    def total_refusal(
        self, sessions: Mapping[Key, LiveSession], reserved: set[Key], owner: str
    ) -> SessionError:
        mine = _names(sessions, reserved, owner)
        yours = f" Yours: {', '.join(mine)}." if mine else ""
        return SessionError(
            f"this server is at its limit of {self.total} live sessions for all principals together "
            "(--max-sessions), and every one of them is running a call or held by a background job, so "
            f"none could be unloaded to make room.{yours} Try again in a little while, or close a session "
            "of yours you no longer need with close_session."
        )


def _lru(session: LiveSession) -> float:
    return session.last_used


def _names(sessions: Mapping[Key, LiveSession], reserved: set[Key], owner: str) -> list[str]:
    return sorted({sid for who, sid in (*sessions, *reserved) if who == owner})
