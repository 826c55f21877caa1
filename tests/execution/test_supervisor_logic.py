"""The supervisor and the Python runner on in-process fake kernels: milliseconds each.

Real code: ``supervise``, ``PythonRunner``, ``KernelPool``, ``Session``; the kernel is
``tests/execution/fakes.py``'s. The end-to-end run_code tests (``test_python_run_code.py``)
check the same rules on real sandboxed kernels; these pin down the logic: results, errors,
time limits with an interrupt that works or does not, a kernel that dies, a session closed
mid-call, and a client that goes away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from kernmind.execution import supervisor
from kernmind.execution.kernels import pool as pool_mod
from kernmind.execution.kernels.pool import KernelPool
from kernmind.execution.results import OutputCollector, RunResult
from kernmind.execution.runners.base import Call
from kernmind.execution.runners.python import PythonRunner, SnapshotBudget
from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions.session import Session
from kernmind.execution.supervisor import supervise
from tests.execution.fakes import FakeKernel, FakeKernelFactory

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


@dataclass
class Harness:
    factory: FakeKernelFactory
    runner: PythonRunner
    session: Session

    async def run(self, code: str, timeout: float = 5.0) -> RunResult:
        call = Call(
            code=code,
            session=self.session,
            collector=OutputCollector(10_000),
            timeout=timeout,
            notes=self.session.take_notes(),
        )
        return await supervise(self.runner, call, quota_bytes=0)

    @property
    def kernel(self) -> FakeKernel:
        kernel = PythonRunner.kernel_of(self.session)
        assert isinstance(kernel, FakeKernel)
        return kernel


@pytest.fixture
async def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    monkeypatch.setattr(pool_mod, "BACKGROUND_DELAY", 0.0)
    factory = FakeKernelFactory(tmp_path)
    pool = KernelPool(factory, size=0)
    runner = PythonRunner(pool, "fake", inner_root=str, budget=SnapshotBudget(0, 1.0))

    def new_workspace() -> Workspace:
        ws = Workspace(tmp_path / "session")
        ws.create()
        return ws

    async with anyio.create_task_group() as tg:
        await pool.run(tg, delay=0)
        yield Harness(factory, runner, Session("s", new_workspace))
        await pool.close()
        tg.cancel_scope.cancel()


async def test_a_value_its_output_and_its_count_come_back(harness: Harness) -> None:
    out = await harness.run("print('hi')\nx = 20\nx + 22")
    assert out.status == "ok" and out.error is None
    assert [r.text for r in out.results] == ["42"]
    assert out.logs.stdout == ["hi\n"]
    assert out.execution_count == 1
    again = await harness.run("x * 2")
    assert [r.text for r in again.results] == ["40"] and again.execution_count == 2


async def test_an_exception_is_an_error_result_and_the_session_goes_on(harness: Harness) -> None:
    out = await harness.run("y = 1\n1 / 0")
    assert out.status == "error"
    assert out.error is not None and out.error.name == "ZeroDivisionError"
    assert out.state_preserved is None
    assert [r.text for r in (await harness.run("y")).results] == ["1"]


async def test_a_time_limit_interrupts_the_code_and_keeps_the_state(harness: Harness) -> None:
    await harness.run("kept = 'yes'")
    out = await harness.run("#hang", timeout=0.05)
    assert out.status == "timeout" and out.state_preserved is True
    assert out.error is not None and out.error.name == "TimeoutError"
    assert any("interrupted and the session kept its state" in n for n in out.notes), out.notes
    assert harness.kernel.interrupts == 1
    assert [r.text for r in (await harness.run("kept")).results] == ["'yes'"]


async def test_a_kernel_deaf_to_interrupts_is_replaced_and_the_next_call_says_so(harness: Harness) -> None:
    await harness.run("lost = 1")
    stuck = harness.kernel
    stuck.ignores_interrupts = True
    out = await harness.run("#hang", timeout=0.05)
    assert out.status == "timeout" and out.state_preserved is False
    assert any("did not stop when interrupted" in n for n in out.notes), out.notes
    assert stuck in harness.factory.stopped and harness.kernel is not stuck
    after = await harness.run("lost")
    assert any("interpreter was restarted after the previous call" in n for n in after.notes), after.notes
    assert after.error is not None and after.error.name == "NameError"
    assert harness.kernel.workspace.root == stuck.workspace.root  # the files stay with the session


async def test_a_kernel_that_dies_gives_a_sentence_and_the_next_call_a_fresh_one(harness: Harness) -> None:
    await harness.run("v = 1")
    dead = harness.kernel
    out = await harness.run("#die")
    assert out.status == "error" and out.state_preserved is False
    assert out.error is not None and out.error.name == "KernelDied"
    assert "died while running this code (exit code -9)" in out.error.value
    assert "likely out of memory" in out.error.value
    assert "the next call starts a fresh interpreter with the same files" in out.error.value
    assert dead in harness.factory.stopped  # replaced right after the call
    after = await harness.run("1 + 1")
    assert after.status == "ok" and [r.text for r in after.results] == ["2"]
    assert any("restarted" in n for n in after.notes), after.notes


async def test_a_kernel_found_dead_between_calls_is_replaced_with_a_note(harness: Harness) -> None:
    await harness.run("1")
    harness.kernel.dead = True
    out = await harness.run("2")
    assert [r.text for r in out.results] == ["2"]
    assert any("previous interpreter had stopped" in n for n in out.notes), out.notes


async def test_closing_the_session_mid_call_ends_the_call_as_session_closed(harness: Harness) -> None:
    results: list[RunResult] = []

    async def call() -> None:
        results.append(await harness.run("#hang", timeout=30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        with anyio.fail_after(60):
            while harness.session.running is None:  # noqa: ASYNC110 (the supervisor sets it; no event)
                await anyio.sleep(0.001)
        harness.session.closed = True
        harness.session.running.cancel()
    (out,) = results
    assert out.status == "error" and out.state_preserved is False
    assert out.error is not None and out.error.name == "SessionClosed"


async def test_a_client_that_goes_away_interrupts_the_code(harness: Harness) -> None:
    await harness.run("1")
    with anyio.move_on_after(0.05) as scope:
        await harness.run("#hang", timeout=30)
    assert scope.cancelled_caught
    assert harness.kernel.interrupts == 1
    assert harness.session.running is None
    assert [r.text for r in (await harness.run("3")).results] == ["3"]


class _KillCount:
    """A session's out-of-memory count that shows a kill only from its ``shows_at``-th look on
    (Linux counts the kill just after sending the SIGKILL, so the death can be seen first)."""

    group = object()

    def __init__(self, shows_at: int | None) -> None:
        self.shows_at, self.looks = shows_at, 0

    def memory_exceeded(self) -> bool:
        self.looks += 1
        return self.shows_at is not None and self.looks >= self.shows_at


def _ended_with(name: str, value: str) -> Call:
    call = Call(
        code="",
        session=Session("s", lambda: Workspace(Path("/nonexistent"))),
        collector=OutputCollector(100),
        timeout=1.0,
    )
    call.collector.set_error(name, value, "")
    return call


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KernelDied", "the Python interpreter died"),
        ("NonZeroExit", "process was killed by SIGKILL (exit code 137)"),
    ],
)
async def test_a_death_is_put_down_to_memory_when_the_kill_count_comes_just_after(
    name: str, value: str
) -> None:
    count = _KillCount(shows_at=4)
    assert await supervisor._killed_for_memory(count, _ended_with(name, value))  # type: ignore[arg-type]
    assert count.looks == 4


async def test_a_death_without_a_kill_stays_a_crash_and_other_errors_wait_for_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(supervisor, "OOM_COUNT_GRACE", 0.1)
    crash = _KillCount(shows_at=None)
    assert not await supervisor._killed_for_memory(crash, _ended_with("KernelDied", "died"))  # type: ignore[arg-type]
    assert crash.looks > 2  # it looked again before deciding
    plain = _KillCount(shows_at=None)
    assert not await supervisor._killed_for_memory(
        plain, _ended_with("ZeroDivisionError", "division by zero")
    )  # type: ignore[arg-type]
    assert plain.looks == 1
