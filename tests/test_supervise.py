"""Supervision (``kernmind.supervise``): one task's failure ends or restarts that task only, is
logged with a ref, and never cancels its neighbours or the group's owner. Fast: plain coroutines."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from kernmind import supervise

# Fast (plain coroutines), but for the last test, which starts a real server and kernel.
pytestmark = pytest.mark.anyio

REF = re.compile(r"task failed \(ref ([0-9a-f]{8})\) in (.+): \w+: ")


def refs(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    found = [REF.match(r.getMessage()) for r in caplog.records if r.name == "kernmind.supervise"]
    return [(m.group(1), m.group(2)) for m in found if m]


@pytest.mark.fast
async def test_a_failing_task_ends_alone_and_is_logged_with_a_ref(caplog: pytest.LogCaptureFixture) -> None:
    survivor_done = anyio.Event()

    async def fails() -> None:
        raise KeyError("boom")

    async def survivor() -> None:
        await anyio.sleep(0.01)
        survivor_done.set()

    with caplog.at_level(logging.ERROR, logger="kernmind.supervise"):
        async with supervise.task_group("a test") as tg:
            tg.start_soon(fails)
            tg.start_soon(survivor)
    assert survivor_done.is_set()
    ((ref, what),) = refs(caplog)
    assert what.startswith("a test: ") and "fails" in what
    (record,) = [r for r in caplog.records if ref in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is KeyError


@pytest.mark.fast
async def test_an_exception_group_is_caught_but_cancellation_passes() -> None:
    async def grouped() -> None:
        raise ExceptionGroup("two", [ValueError("a"), KeyError("b")])

    assert await supervise.guarded("grouped", grouped)() is None
    with anyio.CancelScope() as scope:
        scope.cancel()
        await supervise.guarded("cancelled", anyio.sleep)(10)
        pytest.fail("cancellation was swallowed")  # pragma: no cover


@pytest.mark.fast
async def test_a_service_is_restarted_after_each_failure_until_it_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise OSError("the socket went away")

    with caplog.at_level(logging.ERROR, logger="kernmind.supervise"):
        await supervise.service("a listener", flaky, pause=0.001)
    assert runs == [0, 1, 2]
    assert len(refs(caplog)) == 2


@pytest.mark.fast
async def test_start_soon_restarts_what_is_marked_keeps_running() -> None:
    runs: list[int] = []

    @supervise.keeps_running
    async def loop() -> None:
        runs.append(1)
        if len(runs) < 2:
            raise RuntimeError("one bad turn")

    async with supervise.task_group("a test") as tg:
        tg.start_soon(loop)  # marked: a service (the first restart waits RESTART_PAUSE)
    assert runs == [1, 1]


@pytest.mark.fast
async def test_start_raises_a_failure_before_started_and_logs_one_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def early(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        raise ValueError("could not bind")

    async def late(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        task_status.started("listening")
        await anyio.lowlevel.checkpoint()
        raise ValueError("died later")

    with caplog.at_level(logging.ERROR, logger="kernmind.supervise"):
        async with supervise.task_group("a test") as tg:
            with pytest.raises(ValueError, match="could not bind"):
                await tg.start(early)
            assert await tg.start(late) == "listening"
    ((_, what),) = refs(caplog)
    assert "late" in what


@pytest.mark.slow
async def test_a_background_task_of_the_server_that_fails_does_not_stop_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A real server whose executor starts a background task that fails at once (planted in
    ``Executor._settle_heap``): logged with a ref, and the server goes on answering calls (before,
    the failure cancelled the lifespan's task group and every later call failed)."""
    from mcp import Client

    from kernmind.execution.executor import Executor
    from kernmind.server import create_server
    from tests.conftest import make_settings, structured

    async def fails(self: Executor) -> None:
        raise RuntimeError("a planted failure")

    monkeypatch.setattr(Executor, "_settle_heap", fails)
    settings = make_settings(tmp_path, embedding_model="none", preload=[], sandbox="none", pool_size=0)
    with caplog.at_level(logging.ERROR, logger="kernmind.supervise"):
        async with Client(create_server(settings)) as client:
            for _ in range(2):
                assert structured(await client.call_tool("memory_list", {}))["total"] == len(
                    settings.memory_default_blocks
                )  # the seeded blocks
            out = structured(await client.call_tool("run_code", {"code": "1 + 1"}))
            assert out["results"][0]["text"] == "2"
    ((_, what),) = refs(caplog)
    assert what.startswith("executor: ")
    assert any("a planted failure" in r.getMessage() for r in caplog.records)
