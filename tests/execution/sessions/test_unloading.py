"""One way out of the live sessions: every unload is registered, a call arriving meanwhile waits.

Real ``SessionRegistry``, idle reaper (``reap``) and on-disk ``SessionStore`` with hooks that record
instead of kernels (``test_registry_logic.py``'s), so each case takes milliseconds. A hook
that waits on an event holds an unload half-way, which makes each race happen every time
instead of now and then. The same race over real HTTP, with a real save of a large namespace,
is in ``tests/transport/test_revocation.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest

from kernmind.execution.errors import SessionError
from kernmind.execution.sessions.session import Session
from tests.execution.sessions.test_registry_logic import Recorded, _registry, _use

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


class Held:
    """A suspend hook that stops half-way until told to go on (an unload caught in its save)."""

    def __init__(self, recorded: Recorded) -> None:
        self.recorded = recorded
        self.started = anyio.Event()
        self.go_on = anyio.Event()

    async def suspend(self, session: Session) -> None:
        self.recorded.suspended.append(session.key)
        self.started.set()
        await self.go_on.wait()


async def test_a_call_during_an_idle_unload_waits_for_it_and_resumes_the_session(tmp_path: Path) -> None:
    """The reaper's unload is registered before the save: the call waits, then loads the session
    again (before, it found the home still locked by this very server: "in use by another
    kernmind server (pid <its own pid>)")."""
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=4)
    held = Held(recorded)
    registry.hooks.suspend = held.suspend
    await _use(registry, "big")
    registry.idle_timeout = 0.0  # every session is idle past it
    resumed: list[bool] = []

    async def call() -> None:
        async with registry.hold("big") as session:
            resumed.append(session.resumed)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            try:
                tg.start_soon(registry.reap)
                await held.started.wait()  # the save is under way; the home's lock is still held
                tg.start_soon(call)
                await anyio.wait_all_tasks_blocked()
                assert resumed == []  # waiting for the unload, not refused
            finally:
                held.go_on.set()  # (also when an assertion failed: the unload is shielded)
    assert resumed == [True]
    assert recorded.suspended == [("local", "big")]


async def test_close_during_an_unload_waits_for_it_then_deletes(tmp_path: Path) -> None:
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=4)
    held = Held(recorded)
    registry.hooks.suspend = held.suspend
    await _use(registry, "gone")
    home = registry.live("gone").home  # type: ignore[union-attr]
    assert home is not None
    closed: list[bool] = []

    async def close() -> None:
        closed.append(await registry.close("gone"))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            try:
                tg.start_soon(registry.unload, registry.live("gone"))
                await held.started.wait()
                tg.start_soon(close)
                await anyio.wait_all_tasks_blocked()
                assert closed == []
            finally:
                held.go_on.set()  # (also when an assertion failed: the unload is shielded)
    assert closed == [True] and not home.root.exists()


async def test_shutdown_waits_for_the_unloads_under_way(tmp_path: Path) -> None:
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=4)
    held = Held(recorded)
    registry.hooks.suspend = held.suspend
    await _use(registry, "a")
    done = anyio.Event()

    async def unload_all() -> None:
        await registry.unload_all()
        done.set()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            try:
                tg.start_soon(registry.unload, registry.live("a"))
                await held.started.wait()
                tg.start_soon(unload_all)
                await anyio.wait_all_tasks_blocked()
                assert not done.is_set()  # the unload of a still holds its home
            finally:
                held.go_on.set()  # (also when an assertion failed: the unload is shielded)
    assert done.is_set() and not registry._unloading


async def test_ending_an_owner_stops_its_sessions_without_saving_and_refuses_its_calls(
    tmp_path: Path,
) -> None:
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=4)
    await _use(registry, "s", owner="alice")
    await _use(registry, "t", owner="alice")
    await _use(registry, "s", owner="bob")
    alice_s = registry.live("s", owner="alice")
    assert alice_s is not None and alice_s.meta is not None and alice_s.home is not None
    alice_s.dirty = True  # code ran since its last save
    why = "stopped: the principal 'alice' was revoked"
    registry.refusal = lambda owner: why if owner == "alice" else None

    assert await registry.end_owner("alice", why, "PrincipalRevoked") == 2
    assert sorted(recorded.released) == [("alice", "s"), ("alice", "t")] and recorded.suspended == []
    assert list(registry.sessions) == [("bob", "s")]
    assert alice_s.stopped_because == why and alice_s.stopped_as == "PrincipalRevoked"
    meta = alice_s.home.load_meta()  # kept for whoever adopts the data: it says what was not saved
    assert meta.save_failed == why and meta.unsaved_since is not None
    assert alice_s.home.root.exists()  # files stay
    with pytest.raises(SessionError, match="was revoked"):
        await _use(registry, "s", owner="alice")
    with pytest.raises(SessionError, match="was revoked"):
        registry.take_slot("alice")
    await _use(registry, "s", owner="bob")


async def test_a_call_queued_behind_a_revoked_one_is_refused(tmp_path: Path) -> None:
    """Revoked while it waited for the session's lock: it must not run on a fresh session."""
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=4)
    why = "stopped: the principal 'alice' was revoked"
    revoked = False
    registry.refusal = lambda owner: why if revoked and owner == "alice" else None
    outcome: list[str] = []

    async def queued() -> None:
        try:
            await _use(registry, "s", owner="alice")
            outcome.append("ran")
        except SessionError as exc:
            outcome.append(str(exc))

    async with anyio.create_task_group() as tg:
        async with registry.hold("s", owner="alice"):
            tg.start_soon(queued)
            await anyio.wait_all_tasks_blocked()  # it waits for the lock
            revoked = True
            await registry.end_owner("alice", why, "PrincipalRevoked")
    assert outcome == [why]


async def test_list_sessions_reads_a_copy_taken_on_the_event_loop(tmp_path: Path) -> None:
    """The live rows are made on the loop; only the store is read on a thread. (Before, the
    thread iterated the registry's dict while the loop added sessions: "dictionary changed
    size during iteration" now and then; here the loop adds one while the thread would iterate.)"""
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=8)
    for sid in ("a", "b", "c"):
        await _use(registry, sid)
    loop_thread = threading.get_ident()
    counted_on: set[int] = set()
    added = threading.Event()

    def execution_count(session: Session) -> int | None:
        counted_on.add(threading.get_ident())
        if threading.get_ident() != loop_thread:  # (the old way: on the thread, mid-iteration)
            added.wait(10)
        return None

    async def add_one() -> None:  # (runs once ``summaries`` awaits its thread)
        await _use(registry, "d")
        added.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(add_one)
        rows = await registry.summaries("local", execution_count)
    assert counted_on == {loop_thread}
    assert {r["session_id"] for r in rows} >= {"a", "b", "c"}
    assert all(r["state"] in ("live", "stored") for r in rows)


async def test_a_session_being_unloaded_is_listed_as_stored_not_as_another_servers(tmp_path: Path) -> None:
    recorded = Recorded()
    registry = _registry(tmp_path, recorded, total=4)
    held = Held(recorded)
    registry.hooks.suspend = held.suspend
    await _use(registry, "s")
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            try:
                tg.start_soon(registry.unload, registry.live("s"))
                await held.started.wait()
                rows = await registry.summaries("local", lambda s: None)
            finally:
                held.go_on.set()  # (also when an assertion failed: the unload is shielded)
    assert [(r["session_id"], r["state"], r["held_by_pid"]) for r in rows] == [("s", "stored", None)]
