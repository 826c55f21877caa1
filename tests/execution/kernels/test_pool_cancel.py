"""The warm pool never leaks a kernel when ``acquire`` is cancelled.

Between taking a kernel and handing it over, ``KernelPool.acquire`` awaits several things
(the warm kernel's liveness, moving the session's files in, handing them to the kernel's uid,
adopting a package layer, joining the session's control group). A client that cancels its
call at any of them must not leave a kernel running that nobody owns. Each case blocks the
pool at one of those awaits, cancels the call there, and checks that every kernel the
factory made is stopped or back in the pool. A fake kernel factory (the logic above kernels
is what is tested; the real pool with real kernels is covered by the run_code tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from kernmind.execution.kernels import pool as pool_module
from kernmind.execution.kernels.pool import KernelPool
from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions import disk_store

pytestmark = [pytest.mark.anyio, pytest.mark.fast]  # fake kernels: a fraction of a second each


@dataclass
class FakeKernel:
    workspace: Workspace
    block_alive: anyio.Event | None = None
    layer: Any = None
    runtime_dir: Path | None = None
    uid: int | None = None
    group: Any = None
    home_bound: bool = False
    stopped: bool = False

    @property
    def local(self) -> FakeKernel:
        """A kernel of this machine: its run directory, uid and group (kernels/api.py)."""
        return self

    async def is_alive(self) -> bool:
        if self.block_alive is not None:
            self.block_alive.set()
            await anyio.sleep_forever()
        return True

    async def shutdown(self) -> None:
        self.stopped = True


@dataclass
class FakeFactory:
    root: Path
    made: list[FakeKernel] = field(default_factory=list)
    cheap_starts: bool = True
    rebinds_warm_kernels: bool = True
    joins_groups: bool = False

    async def start(self, home: Workspace | None = None, group: Any = None) -> FakeKernel:
        await anyio.lowlevel.checkpoint()
        ws = home or Workspace(self.root / f"k{len(self.made)}")
        ws.create()
        kernel = FakeKernel(ws)
        self.made.append(kernel)
        return kernel


class Layerish:
    removed = False

    def adopt_from(self, other: Any) -> None:
        pass

    def remove(self) -> None:
        self.removed = True


AWAITS = ["is_alive", "rebind", "own_tree", "start", "adopt_layer", "join"]


@pytest.mark.parametrize("where", AWAITS)
async def test_a_cancelled_acquire_leaves_no_kernel_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    factory = FakeFactory(tmp_path)
    pool = KernelPool(factory, size=0, rebind=disk_store.rebind)  # type: ignore[arg-type]
    reached = anyio.Event()

    async def block(*_: Any, **__: Any) -> None:
        reached.set()
        await anyio.sleep_forever()

    home: Workspace | None = Workspace(tmp_path / "session")
    assert home is not None
    home.create()
    (home.root / "data.csv").write_text("a,b\n")
    layer = None
    if where in ("is_alive", "rebind", "own_tree"):
        warm = await factory.start()
        pool._ready.append(warm)  # type: ignore[arg-type]
        if where == "is_alive":
            warm.block_alive = reached
        else:
            real = pool_module.off_loop
            calls = {"n": 0}

            async def off_loop(fn: Any, **kw: Any) -> Any:
                calls["n"] += 1
                if calls["n"] == (1 if where == "rebind" else 2):
                    fn()  # the work itself happens (a thread keeps going when its waiter is cancelled)
                    await block()
                return await real(fn, **kw)

            monkeypatch.setattr(pool_module, "off_loop", off_loop)
            factory.made[0].uid = 12345 if where == "own_tree" else None
            monkeypatch.setattr(Workspace, "hand_to", lambda self, uid: None)  # (no uid 12345 to chown to)
    elif where == "start":
        home = None  # a fresh kernel for a stateless call: cancelled while adopting its layer
        layer = Layerish()
        original = factory.start

        async def start_then_block(home: Workspace | None = None, group: Any = None) -> FakeKernel:
            kernel = await original(home, group)
            kernel.layer = Layerish()
            return kernel

        monkeypatch.setattr(factory, "start", start_then_block)
        monkeypatch.setattr(KernelPool, "_adopt_layer", staticmethod(block))
    elif where == "adopt_layer":
        layer = Layerish()

        async def layered(home: Workspace | None = None, group: Any = None) -> FakeKernel:
            kernel = await FakeFactory.start(factory, home, group)
            kernel.layer = Layerish()
            return kernel

        monkeypatch.setattr(factory, "start", layered)
        monkeypatch.setattr(KernelPool, "_adopt_layer", staticmethod(block))
    elif where == "join":
        monkeypatch.setattr(pool_module, "_join", block)

    got: list[Any] = []
    async with anyio.create_task_group() as tg:
        await pool.run(tg, delay=3600)

        async def call() -> None:
            got.append(await pool.acquire(home, layer=layer))  # type: ignore[arg-type]

        tg.start_soon(call)
        with anyio.fail_after(60):
            await reached.wait()
        tg.cancel_scope.cancel()  # the call is cancelled where it waits (the client went away)
    assert got == []
    assert factory.made, "the case never took a kernel"

    def leaked() -> list[FakeKernel]:
        return [k for k in factory.made if not k.stopped and k not in pool._ready]

    with anyio.move_on_after(10):  # a released kernel is stopped in the background: wait for that, not a time
        while leaked():  # noqa: ASYNC110 - the pool's stop sets a flag, no event to wait on
            await anyio.sleep(0.01)
    assert leaked() == [], f"cancelled at {where}: {len(leaked())} kernel(s) left running"
    assert (tmp_path / "session" / "data.csv").read_text() == "a,b\n"  # the session's files stay
