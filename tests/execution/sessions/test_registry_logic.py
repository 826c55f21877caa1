"""The session registry's caps and unloading, with hooks that record instead of kernels: milliseconds.

Real code: ``SessionRegistry``, ``Caps`` and the on-disk ``SessionStore`` (in a temporary
directory); the hooks stand where the executor's runners would. The end-to-end tests of the
same rules on real kernels are in ``tests/security`` and ``test_lasting_sessions.py``.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from kernmind.execution.errors import SessionError
from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions import books as books_mod
from kernmind.execution.sessions.disk_store import SessionHome, SessionStore
from kernmind.execution.sessions.registry import SessionRegistry
from kernmind.execution.sessions.session import Hooks, Session

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


class Recorded:
    def __init__(self) -> None:
        self.suspended: list[tuple[str, str]] = []
        self.released: list[tuple[str, str]] = []

    async def suspend(self, session: Session) -> None:
        self.suspended.append(session.key)

    async def release(self, session: Session) -> None:
        self.released.append(session.key)

    async def autosave(self, session: Session) -> None:
        pass


def _registry(
    tmp_path: Path, recorded: Recorded, *, total: int, per_owner: int | None = None
) -> SessionRegistry:
    store = SessionStore(tmp_path / "sessions", max_sessions=100, max_bytes=1 << 30)

    def open_home(home: SessionHome) -> Workspace:
        ws = Workspace(home.files)
        ws.create()
        return ws

    def new_workspace() -> Workspace:
        ws = Workspace(tmp_path / "throwaway")
        ws.create()
        return ws

    hooks = Hooks(
        open_home=open_home, release=recorded.release, suspend=recorded.suspend, autosave=recorded.autosave
    )
    return SessionRegistry(
        max_sessions=total,
        max_per_owner=per_owner,
        idle_timeout=3600,
        autosave_after=3600,
        store=store,
        new_workspace=new_workspace,
        hooks=hooks,
    )


async def _use(registry: SessionRegistry, sid: str, owner: str = "local") -> None:
    async with registry.hold(sid, owner=owner):
        pass


async def test_past_the_cap_the_least_recently_used_idle_session_is_unloaded(tmp_path: Path) -> None:
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=2)
    await _use(registry, "a")
    await _use(registry, "b")
    await _use(registry, "a")  # b is now the least recently used
    await _use(registry, "c")
    assert recorded.suspended == [("local", "b")]
    assert sorted(sid for _, sid in registry.sessions) == ["a", "c"]
    # Unloading is not closing: b's home stays and it comes back when used.
    await _use(registry, "b")
    assert recorded.suspended == [("local", "b"), ("local", "a")]
    assert registry.live("b") is not None and registry.live("b").resumed  # type: ignore[union-attr]


async def test_a_busy_session_is_never_unloaded_and_a_full_server_says_why(tmp_path: Path) -> None:
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=1)
    async with registry.hold("busy"):
        with pytest.raises(SessionError, match=r"live sessions.*None is idle.*close_session"):
            await registry.load("other")
    assert recorded.suspended == []


async def test_one_owner_at_its_share_gives_up_its_own_session_not_anothers(tmp_path: Path) -> None:
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=4, per_owner=2)
    await _use(registry, "x", owner="alice")
    await _use(registry, "a1", owner="bob")
    await _use(registry, "a2", owner="bob")
    await _use(registry, "a3", owner="bob")
    assert recorded.suspended == [("bob", "a1")]
    assert ("alice", "x") in registry.sessions


async def test_a_session_being_unloaded_is_loaded_again_only_after(tmp_path: Path) -> None:
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=2)
    unloading = anyio.Event()
    let_go = anyio.Event()

    async def slow_suspend(session: Session) -> None:
        recorded.suspended.append(session.key)
        unloading.set()
        await let_go.wait()

    registry.hooks.suspend = slow_suspend
    await _use(registry, "a")
    await _use(registry, "c")
    async with anyio.create_task_group() as tg:
        tg.start_soon(_use, registry, "b")  # unloads a to make room
        await unloading.wait()
        tg.start_soon(_use, registry, "a")  # must wait until a's unloading is done
        await anyio.wait_all_tasks_blocked()  # (every task waits: b for a's unloading, and a's load too)
        assert ("local", "a") not in registry.sessions
        let_go.set()
    assert recorded.suspended[0] == ("local", "a") and len(recorded.suspended) == 2
    assert ("local", "a") in registry.sessions and registry.live("a").resumed  # type: ignore[union-attr]


async def test_close_releases_the_runners_and_deletes_the_home(tmp_path: Path) -> None:
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=2)
    await _use(registry, "gone")
    files = registry.live("gone").files().root  # type: ignore[union-attr]
    assert files.exists()
    assert await registry.close("gone")
    assert recorded.released == [("local", "gone")] and recorded.suspended == []
    assert not files.exists()
    assert not await registry.close("gone")


async def test_the_meta_is_written_with_a_call_that_leaves_variables_unsaved_else_just_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(books_mod, "META_DELAY", 0.05)
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=2)
    async with anyio.create_task_group() as tg:
        await registry.run_reaper(tg)
        async with registry.hold("s") as session:
            session.dirty = True  # code ran: a killed server must know its variables were unsaved
        assert session.home is not None
        on_disk = session.home.load_meta()
        assert on_disk.unsaved_since is not None and on_disk.last_used == session.meta.last_used  # type: ignore[union-attr]
        async with registry.hold("s"):
            pass
        assert session.home.load_meta().last_used < session.meta.last_used  # type: ignore[union-attr]
        assert session.meta_due
        latest = session.meta.last_used  # type: ignore[union-attr]
        with anyio.fail_after(60):
            while session.home.load_meta().last_used != latest:  # noqa: ASYNC110 (a background write)
                await anyio.sleep(0.01)
        assert not session.meta_due
        tg.cancel_scope.cancel()
