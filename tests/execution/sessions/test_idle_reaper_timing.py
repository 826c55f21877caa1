"""When the idle reaper's next turn comes (``SessionRegistry.next_turn_in``): a dirty session is autosaved
``autosave_after`` seconds after its last call, not up to a period later (a new user measured
≈ 2 min 45 s for the documented 120 s). Real ``SessionRegistry`` and store; no kernels, no sleeps."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions.disk_store import SessionHome, SessionStore
from kernmind.execution.sessions.registry import SessionRegistry
from kernmind.execution.sessions.session import Hooks, Session

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


async def _nothing(session: Session) -> None:
    pass


def _registry(tmp_path: Path) -> SessionRegistry:
    def open_home(home: SessionHome) -> Workspace:
        ws = Workspace(home.files)
        ws.create()
        return ws

    return SessionRegistry(
        max_sessions=10,
        idle_timeout=1800,
        autosave_after=120,
        store=SessionStore(tmp_path / "sessions", max_sessions=10, max_bytes=1 << 30),
        new_workspace=lambda: Workspace(tmp_path / "x"),
        hooks=Hooks(open_home=open_home, release=_nothing, suspend=_nothing, autosave=_nothing),
    )


async def test_the_next_turn_comes_when_the_autosave_falls_due(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    now = time.monotonic()
    assert registry.next_turn_in(now) == pytest.approx(
        registry.reaper_period() + 0.05
    )  # nothing due: the period (60 s)
    async with registry.hold("work"):
        pass
    session = registry.sessions[("local", "work")]
    session.dirty, session.last_used = True, now - 100  # the last call ended 100 s ago
    assert registry.next_turn_in(now) == pytest.approx(20.05)  # at 120 s, not at the next 60 s turn
    session.last_used = now - 130  # overdue (a turn was busy): at once
    assert registry.next_turn_in(now) == pytest.approx(0.05)
    session.dirty = False  # saved: only its unloading is due, later than the period
    assert registry.next_turn_in(now) == pytest.approx(registry.reaper_period() + 0.05)
