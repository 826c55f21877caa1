"""The warm pool's logic on in-process fake kernels (``tests/execution/fakes.py``): milliseconds each.

The real kernels' pool is covered end to end by the run_code tests; these pin down what the
pool itself promises: a ready kernel when one is warm, dead warm kernels never handed out
and never leaked, a refill after each acquire, a session's home bound to its kernel, and no
kernel lost when the caller is cancelled at any of the pool's waits.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels import pool as pool_mod
from kernmind.execution.kernels.pool import KernelPool
from kernmind.execution.sandbox.workspace import Workspace
from tests.execution.fakes import FakeKernelFactory

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


@pytest.fixture(autouse=True)
def no_background_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_mod, "BACKGROUND_DELAY", 0.0)


@pytest.fixture
async def running_pool(tmp_path: Path) -> AsyncIterator[tuple[KernelPool, FakeKernelFactory]]:
    factory = FakeKernelFactory(tmp_path)
    pool = KernelPool(factory, size=2)
    async with anyio.create_task_group() as tg:
        await pool.run(tg, delay=0)
        await _until(lambda: pool.ready_count == 2)
        yield pool, factory
        await pool.close()
        tg.cancel_scope.cancel()


async def _until(condition: Callable[[], bool], seconds: float = 2.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 (the pool's background tasks give no event to wait on)
            await anyio.sleep(0.001)


async def _settled(factory: FakeKernelFactory) -> None:
    """Let the background shutdowns the pool started finish."""
    for _ in range(20):
        await anyio.lowlevel.checkpoint()


async def test_acquire_hands_out_a_warm_kernel_and_refills(
    running_pool: tuple[KernelPool, FakeKernelFactory],
) -> None:
    pool, factory = running_pool
    warm = list(pool._ready)
    kernel = await pool.acquire()
    assert kernel is warm[0]
    assert len(factory.started) == 2  # no start for the caller
    await _until(lambda: pool.ready_count == 2)
    assert len(factory.started) == 3


async def test_a_dead_warm_kernel_is_stopped_and_never_handed_out(
    running_pool: tuple[KernelPool, FakeKernelFactory],
) -> None:
    pool, factory = running_pool
    first, second = list(pool._ready)
    first.dead = True
    kernel = await pool.acquire()
    assert kernel is second
    await _until(lambda: first in factory.stopped and not first.workspace.root.exists())


async def test_a_warm_kernel_has_answered_a_silent_first_request_that_counts_nothing(
    running_pool: tuple[KernelPool, FakeKernelFactory],
) -> None:
    """The pool pays a fresh interpreter's first-request costs before handing it out; the request
    is silent, so the caller's first call is still execution 1."""
    pool, _ = running_pool
    kernel = await pool.acquire()
    assert kernel.requests == [("0", True)]
    assert kernel.execution_count == 0


@contextlib.asynccontextmanager
async def _warm_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, *, delay: float, quiet_for: float
) -> AsyncIterator[tuple[KernelPool, FakeKernelFactory]]:
    """A running pool of ``size`` warm kernels whose refill waits ``delay`` at most, and
    ``quiet_for`` without a call while a warm kernel is left."""
    monkeypatch.setattr(pool_mod, "BACKGROUND_DELAY", delay)
    monkeypatch.setattr(pool_mod, "QUIET_FOR", quiet_for)
    factory = FakeKernelFactory(tmp_path)
    pool = KernelPool(factory, size=size)
    async with anyio.create_task_group() as tg:
        await pool.run(tg, delay=0)
        await _until(lambda: pool.ready_count == size)
        yield pool, factory
        await pool.close()
        tg.cancel_scope.cancel()


async def test_the_refill_waits_until_the_call_that_took_a_kernel_is_over_and_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a warm kernel is left for the next call: no start while a call runs, nor in the
    moments after it ends (its answer is still going out); then one."""
    async with _warm_pool(tmp_path, monkeypatch, 2, delay=5.0, quiet_for=0.3) as (pool, factory):
        with pool.running_a_call():
            await pool.acquire()
            await anyio.sleep(0.2)
            assert len(factory.started) == 2  # none while the call runs
        await anyio.sleep(0.05)
        assert len(factory.started) == 2  # nor right after it
        await _until(lambda: pool.ready_count == 2)
        assert len(factory.started) == 3


async def test_with_no_warm_kernel_left_the_refill_starts_as_soon_as_the_calls_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-to-back calls: the next one would start a kernel of its own, so the refill does not
    wait for a quiet spell."""
    async with _warm_pool(tmp_path, monkeypatch, 1, delay=5.0, quiet_for=60.0) as (pool, factory):
        with pool.running_a_call():
            await pool.acquire()
            await anyio.sleep(0.2)
            assert len(factory.started) == 1  # not while the call runs
        await _until(lambda: pool.ready_count == 1)
        assert len(factory.started) == 2


async def test_calls_that_keep_coming_hold_the_refill_back_no_longer_than_its_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _warm_pool(tmp_path, monkeypatch, 1, delay=0.3, quiet_for=60.0) as (pool, factory):
        with pool.running_a_call():
            await pool.acquire()
            await _until(lambda: pool.ready_count == 1)  # the call still runs: started anyway
        assert len(factory.started) == 2


async def test_a_kernel_that_does_not_answer_its_first_request_is_never_handed_out(tmp_path: Path) -> None:
    factory = FakeKernelFactory(tmp_path)
    factory.die_on_start = 1
    pool = KernelPool(factory, size=1)
    async with anyio.create_task_group() as tg:
        await pool.run(tg, delay=0)
        await _until(lambda: pool.ready_count == 1)
        kernel = await pool.acquire()
        assert not kernel.dead
        dead = factory.started[0]
        assert dead.dead and dead is not kernel
        await _until(lambda: dead in factory.stopped)
        assert pool.last_error is None  # the next start worked
        await pool.close()
        tg.cancel_scope.cancel()


async def test_a_kernel_cancelled_during_its_first_request_is_stopped(tmp_path: Path) -> None:
    """The server stops while a new kernel answers its warm-up: that kernel is stopped, not left running."""
    factory = FakeKernelFactory(tmp_path)
    factory.hold_silent = True
    pool = KernelPool(factory, size=1)
    async with anyio.create_task_group() as tg:
        await pool.run(tg, delay=0)
        await _until(lambda: bool(factory.started) and bool(factory.started[0].requests))
        tg.cancel_scope.cancel()
    assert factory.started[0] in factory.stopped
    assert factory.running() == []


async def test_an_empty_pool_starts_a_kernel_for_the_caller(tmp_path: Path) -> None:
    factory = FakeKernelFactory(tmp_path)
    pool = KernelPool(factory, size=0)
    kernel = await pool.acquire()
    assert factory.started == [kernel]
    assert await kernel.is_alive()


async def test_a_failed_start_reaches_the_caller(tmp_path: Path) -> None:
    factory = FakeKernelFactory(tmp_path)
    factory.fail_starts = 1
    pool = KernelPool(factory, size=0)
    with pytest.raises(RuntimeUnavailable, match="told not to start"):
        await pool.acquire()
    assert factory.started == []


async def test_acquire_with_a_home_binds_the_kernel_to_it(
    running_pool: tuple[KernelPool, FakeKernelFactory], tmp_path: Path
) -> None:
    pool, factory = running_pool
    home = Workspace(tmp_path / "home")
    home.create()
    kernel = await pool.acquire(home)
    assert kernel.workspace is home and kernel.home_bound
    # A factory that cannot move a warm kernel's directory starts one in the home: the warm ones stay.
    assert pool.ready_count == 2
    assert kernel not in factory.started[:2]


async def test_release_stops_the_kernel_and_removes_only_a_throwaway_workspace(
    running_pool: tuple[KernelPool, FakeKernelFactory], tmp_path: Path
) -> None:
    pool, factory = running_pool
    home = Workspace(tmp_path / "home")
    home.create()
    (home.root / "keep.txt").write_text("mine")
    bound = await pool.acquire(home)
    spare = await pool.acquire()
    pool.release(bound)
    pool.release(spare)
    await _until(lambda: bound in factory.stopped and not spare.workspace.root.exists())
    assert (home.root / "keep.txt").read_text() == "mine"


async def test_close_stops_every_warm_kernel(tmp_path: Path) -> None:
    factory = FakeKernelFactory(tmp_path)
    pool = KernelPool(factory, size=3)
    async with anyio.create_task_group() as tg:
        await pool.run(tg, delay=0)
        await _until(lambda: pool.ready_count == 3)
        await pool.close()
        tg.cancel_scope.cancel()
    assert factory.running() == []


async def test_cancelled_while_a_kernel_starts_for_the_caller_leaks_nothing(tmp_path: Path) -> None:
    factory = FakeKernelFactory(tmp_path)
    factory.start_delay = 0.05
    pool = KernelPool(factory, size=0)
    with anyio.move_on_after(0.01) as scope:
        await pool.acquire()
    assert scope.cancelled_caught
    assert factory.running() == []


async def test_cancelled_while_a_warm_kernel_is_checked_leaks_nothing(
    running_pool: tuple[KernelPool, FakeKernelFactory],
) -> None:
    pool, factory = running_pool
    factory.alive_delay = 0.05
    with anyio.move_on_after(0.01) as scope:
        await pool.acquire()
    assert scope.cancelled_caught
    factory.alive_delay = 0.0
    await _settled(factory)
    handed_out_or_pooled = set(map(id, pool._ready))
    lost = [k for k in factory.running() if id(k) not in handed_out_or_pooled]
    assert lost == []
