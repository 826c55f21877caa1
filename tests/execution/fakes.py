"""An in-process kernel and kernel factory (``kernels/api.py``'s protocols) for fast tests.

``FakeKernel`` runs Python with ``exec`` in a namespace of its own and reports what it printed,
its last expression and its exceptions as Jupyter iopub messages folded by the real
``kernels/messages.fold_output``, so the collector sees what a real kernel's output makes.
It is a stand-in for the process only: everything above kernels (the warm pool, the Python
runner, the supervisor, the session registry) is the real code.

Scripted behaviour, by the first line of the code:
    ``#hang``  the call runs until its deadline, an interrupt, or cancellation;
    ``#wait NAME``  the call waits until ``factory.gate(NAME)`` is set (``factory.waiting`` names
               the gates waited on now), then runs the rest of its code;
    ``#die``   the kernel dies mid-call (the call's outcome is ``died``).
``kernel.ignores_interrupts = True`` makes an interrupt fail (the kernel is stuck).
``factory.start_delay``, ``factory.fail_starts`` and ``factory.alive_delay`` slow or break it.

``fake_executor(settings)`` is a real ``Executor`` whose Python kernels are these (no sandbox, no
control groups, variables not saved), and ``fake_client(settings)`` an MCP client of a real
server around it: end-to-end tests of refusals, caps, the registry, jobs and budgets in
milliseconds. ``fake_settings`` are test settings that fit it.
"""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import time
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from kernmind.config import Settings
from kernmind.execution import parts
from kernmind.execution.executor import Executor
from kernmind.execution.kernels.exchange import ExecOutcome
from kernmind.execution.kernels.messages import fold_output
from kernmind.execution.packages.layer import Layer
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import Cgroup
from kernmind.execution.sandbox.workspace import Workspace

_ids = itertools.count(1)


class FakeKernel:
    """A kernel that runs code in this process (``api.Kernel``; its ``local`` is None)."""

    layer: Layer | None = None
    local: None = None  # no process of its own

    def __init__(self, factory: FakeKernelFactory, workspace: Workspace) -> None:
        self.factory = factory
        self.id = f"fake-{next(_ids)}"
        self.workspace = workspace
        self.execution_count = 0
        self.needs_replacement = False
        self.closed = False
        self.home_bound = False
        self.dead = False
        self.ignores_interrupts = False
        self.requests: list[tuple[str, bool]] = []  # (code, silent) of every execute, in order
        self.namespace: dict[str, Any] = {}
        self.interrupts = 0

    async def is_alive(self) -> bool:
        if self.factory.alive_delay:
            await anyio.sleep(self.factory.alive_delay)
        return not (self.dead or self.closed)

    async def execute(
        self,
        code: str,
        collector: OutputCollector,
        *,
        deadline: float | None = None,
        silent: bool = False,
        store_history: bool = True,
    ) -> ExecOutcome:
        await anyio.lowlevel.checkpoint()
        self.requests.append((code, silent))
        if silent and self.factory.hold_silent:  # a warm-up that does not end until cancelled
            await anyio.sleep_forever()
        if self.dead or self.closed:
            return ExecOutcome("died" if self.dead else "closed", exit_code=-9 if self.dead else None)
        count = self.execution_count + 1 if store_history and not silent else None
        if count is not None:
            self.execution_count = count
        first = code.lstrip().split("\n", 1)[0].strip()
        if first == "#die":
            self.dead = True
            return ExecOutcome("died", count, exit_code=-9)
        if first.startswith("#wait "):
            name = first.removeprefix("#wait ").strip()
            self.factory.waiting.add(name)
            try:
                await self.factory.gate(name).wait()
            finally:
                self.factory.waiting.discard(name)
        if first == "#hang":
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            with anyio.move_on_after(wait):
                await anyio.sleep_forever()
            return ExecOutcome("deadline", count)
        had_error = self._run(code, collector, count, silent)
        return ExecOutcome("error" if had_error else "ok", count)

    def _run(self, code: str, collector: OutputCollector, count: int | None, silent: bool) -> bool:
        out, err = io.StringIO(), io.StringIO()
        value: Any = None
        error: BaseException | None = None
        try:
            tree = ast.parse(code)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(compile(tree, "<cell>", "exec"), self.namespace)
                if last is not None:
                    value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), self.namespace)
        except Exception as exc:
            error = exc
        for name, text in (("stdout", out.getvalue()), ("stderr", err.getvalue())):
            if text:
                fold_output(_msg("stream", name=name, text=text), collector, count)
        if error is not None:
            tb = traceback.format_exception(error)
            fold_output(
                _msg("error", ename=type(error).__name__, evalue=str(error), traceback=tb), collector, count
            )
            return True
        if value is not None and not silent:
            data = {"text/plain": repr(value)}
            fold_output(_msg("execute_result", data=data, execution_count=count), collector, count)
        return False

    async def interrupt(self, collector: OutputCollector | None = None, grace: float = 3.0) -> bool:
        self.interrupts += 1
        await anyio.lowlevel.checkpoint()
        if self.closed or self.dead:
            return False
        return not self.ignores_interrupts

    async def use_packages(self) -> bool:
        return False

    async def shutdown(self) -> None:
        self.closed = True
        self.factory.stopped.append(self)
        await anyio.lowlevel.checkpoint()


def _msg(kind: str, **content: Any) -> dict[str, Any]:
    return {"msg_type": kind, "parent_header": {"msg_id": "fake"}, "content": content}


class FakeKernelFactory:
    """Starts ``FakeKernel``s in directories under ``root`` (``api.KernelFactory``)."""

    rebinds_warm_kernels = False
    cheap_starts = True  # the pool starts them at once, side by side
    joins_groups = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[FakeKernel] = []
        self.stopped: list[FakeKernel] = []
        self.start_delay = 0.0
        self.alive_delay = 0.0
        self.fail_starts = 0  # the next this many starts raise RuntimeUnavailable
        self.die_on_start = 0  # the next this many kernels start dead (they answer no request)
        self.hold_silent = False  # silent requests (the pool's warm-up) never end
        self._gates: dict[str, anyio.Event] = {}
        self.waiting: set[str] = set()  # the gates a call waits on now (``#wait NAME``)

    def gate(self, name: str) -> anyio.Event:
        """The event a ``#wait NAME`` call waits for (set it to let the call go on)."""
        return self._gates.setdefault(name, anyio.Event())

    async def start(self, workspace: Workspace | None = None, group: Cgroup | None = None) -> FakeKernel:
        from kernmind.execution.errors import RuntimeUnavailable

        assert group is None, "a factory that does not join groups is never given one"
        if self.start_delay:
            await anyio.sleep(self.start_delay)
        else:
            await anyio.lowlevel.checkpoint()
        if self.fail_starts:
            self.fail_starts -= 1
            raise RuntimeUnavailable("the fake kernel was told not to start")
        if workspace is None:
            workspace = Workspace(self.root / f"ws-{next(_ids)}")
            workspace.create()
        kernel = FakeKernel(self, workspace)
        if self.die_on_start:
            self.die_on_start -= 1
            kernel.dead = True
        self.started.append(kernel)
        return kernel

    def running(self) -> list[FakeKernel]:
        """Kernels started and not shut down."""
        return [k for k in self.started if k not in self.stopped]


def fake_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Test settings for a fake-kernel server: no sandbox (nothing runs in a process of its own),
    no saved variables (saving would run the snapshot code in this process)."""
    from tests.conftest import make_settings

    return make_settings(data_dir, **{"sandbox": "none", "snapshot_mb": 0, **overrides})


_sandboxes: dict[tuple[str, bool], Sandbox] = {}


def fake_executor(settings: Settings) -> tuple[Executor, FakeKernelFactory]:
    """A real executor on fake kernels (``settings.snapshot_mb`` must be 0)."""
    assert settings.snapshot_mb == 0, "a fake kernel would run the snapshot code in this process"
    factory = FakeKernelFactory(settings.data_dir / "fake-kernels")
    key = (settings.sandbox, settings.allow_network)
    if key not in _sandboxes:  # (probing compiles a seccomp filter in a subprocess: once per process)
        _sandboxes[key] = Sandbox.detect(settings.sandbox, allow_network=settings.allow_network)
    sandbox = _sandboxes[key]
    executor = Executor(settings, factory=factory, sandbox=sandbox, store=parts.store_for(settings))
    return executor, factory


@contextlib.asynccontextmanager
async def fake_client(settings: Settings) -> AsyncIterator[tuple[Client, FakeKernelFactory]]:
    """An MCP client of a real server (``create_server``) whose executor runs fake kernels."""
    from kernmind.server import create_server

    executor, factory = fake_executor(settings)
    async with Client(create_server(settings, executor)) as client:
        yield client, factory
