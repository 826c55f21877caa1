"""run_code's refusals, caps, time limits, jobs and session bookkeeping, end to end on fake kernels.

A real server (``create_server``) and MCP client around a real executor whose Python kernels
are ``tests/execution/fakes.py``'s: everything from the tool's arguments to the registry, the
jobs and the supervisor is the real code, and each test takes milliseconds instead of a
sandboxed kernel's start. What only a real kernel shows (variables saved and restored, the
sandbox, real output) stays in ``test_python_run_code.py`` and the security tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.conftest import error_text, structured
from tests.execution.fakes import FakeKernelFactory, fake_client, fake_settings
from tests.execution.test_result_budgets import MARKER_ROOM

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


async def run(client: Client, code: str, **kw: object) -> dict[str, Any]:
    return structured(await client.call_tool("run_code", {"code": code, **kw}))


async def until(condition: Any, what: str) -> None:
    """Wait for ``condition()`` (state this test can see), failing after 10 s."""
    with anyio.fail_after(60):
        while not condition():  # noqa: ASYNC110 (the server's state, which has no event to wait on)
            await anyio.sleep(0.01)


async def test_the_session_cap_unloads_the_least_recently_used_idle_session(tmp_path: Path) -> None:
    async with fake_client(fake_settings(tmp_path, max_sessions=2, pool_size=0)) as (c, factory):
        await run(c, "a = 1", session_id="one")
        await run(c, "b = 2", session_id="two")
        assert len(factory.running()) == 2
        assert (await run(c, "3", session_id="three"))["results"][0]["text"] == "3"
        states = {
            s["session_id"]: s["state"]
            for s in structured(await c.call_tool("list_sessions", {}))["sessions"]
        }
        assert states == {"one": "stored", "two": "live", "three": "live"}
        await until(lambda: len(factory.running()) == 2, "one's interpreter stopped to make room")
        back = await run(c, "1", session_id="one")  # unloads "two" in turn
        assert any("resumed stored session 'one'" in n for n in back["notes"])
        states = {
            s["session_id"]: s["state"]
            for s in structured(await c.call_tool("list_sessions", {}))["sessions"]
        }
        assert states == {"one": "live", "two": "stored", "three": "live"}


async def test_session_cap_refuses_when_no_session_is_idle(tmp_path: Path) -> None:
    async with fake_client(fake_settings(tmp_path, max_sessions=2, pool_size=0)) as (c, _):
        jobs = [
            structured(
                await c.call_tool("run_code", {"code": "#hang", "session_id": sid, "background": True})
            )["job_id"]
            for sid in ("one", "two")
        ]
        msg = error_text(await c.call_tool("run_code", {"code": "1", "session_id": "three"}))
        assert "2 live sessions" in msg and "one, two" in msg, msg
        assert "close_session" in msg and "job_cancel" in msg
        for job in jobs:
            assert structured(await c.call_tool("job_cancel", {"job_id": job}))["state"] == "cancelled"
        assert (await run(c, "1", session_id="three"))["results"][0]["text"] == "1"


async def test_timeout_is_capped_by_the_server_maximum(tmp_path: Path) -> None:
    async with fake_client(fake_settings(tmp_path, max_timeout=0.5, pool_size=0)) as (c, factory):
        with anyio.fail_after(120):  # uncapped, the call would hang for its 600 s
            out = await run(c, "#hang", timeout=600)
        assert out["status"] == "timeout"
        assert any("--max-timeout" in n and "0.5s" in n for n in out["notes"]), out["notes"]
        assert factory.started[0].interrupts == 1  # interrupted, not replaced
        assert (await run(c, "2 + 2"))["results"][0]["text"] == "4"


async def test_stateless_mode_shares_no_variables_and_offers_no_lasting_tools(tmp_path: Path) -> None:
    async with fake_client(fake_settings(tmp_path, stateless=True, pool_size=1)) as (c, factory):
        assert (await run(c, "y = 3\ny"))["results"][0]["text"] == "3"
        assert (await run(c, "'y' in globals()"))["results"][0]["text"] == "False"
        assert len(factory.started) >= 2  # a fresh interpreter for each call
        names = {t.name for t in (await c.list_tools()).tools}
        assert "install_packages" not in names and "export_notebook" not in names
        assert "list_files" not in names and "list_sessions" in names


async def test_background_job_refusals_are_immediate(tmp_path: Path) -> None:
    async with fake_client(fake_settings(tmp_path, pool_size=0)) as (c, factory):
        msg = error_text(
            await c.call_tool("run_code", {"code": "1", "language": "cobol", "background": True})
        )
        assert "cobol" in msg
        assert "no job 'job-123'" in error_text(await c.call_tool("job_status", {"job_id": "job-123"}))
        assert "no job" in error_text(await c.call_tool("job_cancel", {"job_id": "nonsense"}))
        assert factory.started == []  # nothing was started for a refused call


async def test_a_job_holds_its_session_until_it_ends(tmp_path: Path) -> None:
    async with fake_client(fake_settings(tmp_path, pool_size=0)) as (c, _):
        await run(c, "v = 5", session_id="c")
        job = structured(
            await c.call_tool("run_code", {"code": "#hang", "session_id": "c", "background": True})
        )
        running = structured(await c.call_tool("job_status", {"job_id": job["job_id"]}))
        assert running["state"] == "running" and "result" not in running
        refused = error_text(await c.call_tool("run_code", {"code": "v", "session_id": "c"}))
        assert job["job_id"] in refused and "job_cancel" in refused
        cancelled = structured(await c.call_tool("job_cancel", {"job_id": job["job_id"]}))
        assert cancelled["state"] == "cancelled"
        assert (await run(c, "v", session_id="c"))["results"][0]["text"] == "5"  # the interrupt kept it
        done = structured(
            await c.call_tool("run_code", {"code": "v * 2", "session_id": "c", "background": True})
        )
        with anyio.fail_after(60):
            status = structured(await c.call_tool("job_status", {"job_id": done["job_id"]}))
            while status["state"] == "running":
                await anyio.sleep(0.01)
                status = structured(await c.call_tool("job_status", {"job_id": done["job_id"]}))
        assert status["state"] == "done" and status["result"]["results"][0]["text"] == "10"


async def test_closing_a_session_under_a_queued_call_gives_that_call_a_fresh_session(tmp_path: Path) -> None:
    """A call waiting for a session that gets closed runs on a new session instead of a dead one."""
    async with fake_client(fake_settings(tmp_path, pool_size=0)) as (c, factory):
        await run(c, "doomed = True", session_id="closing")
        kernel = factory.started[0]
        results: dict[str, dict[str, Any]] = {}

        async def call(name: str, code: str) -> None:
            results[name] = await run(c, code, session_id="closing")

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "slow", "#hang")
            await until(lambda: kernel.execution_count == 2, "the slow call runs")
            tg.start_soon(call, "queued", "'doomed' in globals()")
            await anyio.wait_all_tasks_blocked()  # (the queued call waits for the session's lock)
            structured(await c.call_tool("close_session", {"session_id": "closing"}))
        assert results["slow"]["status"] == "error"
        assert results["slow"]["error"]["name"] == "SessionClosed"
        assert results["queued"]["status"] == "ok"
        assert results["queued"]["results"][0]["text"] == "False"
        assert kernel.closed


async def test_calls_to_one_session_run_in_order(tmp_path: Path) -> None:
    """A second call queued behind a slow one sees its effect."""
    async with fake_client(fake_settings(tmp_path, pool_size=0)) as (c, factory):
        results: dict[str, dict[str, Any]] = {}

        async def call(name: str, code: str) -> None:
            results[name] = await run(c, code, session_id="ordered")

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "slow", "#wait slow\norder = ['slow']")
            await until(lambda: "slow" in factory.waiting, "the slow call runs")
            tg.start_soon(call, "fast", "order.append('fast'); order")
            await anyio.wait_all_tasks_blocked()  # (the fast call waits for the session's lock)
            assert "fast" not in results
            factory.gate("slow").set()
        assert results["fast"]["results"][0]["text"] == "['slow', 'fast']"


async def test_different_sessions_run_in_parallel(tmp_path: Path) -> None:
    """A quick call in session B finishes while a slow call in session A is still running."""
    async with fake_client(fake_settings(tmp_path, pool_size=0)) as (c, factory):
        finished: list[str] = []

        async def slow() -> None:
            await run(c, "#wait a\n1", session_id="par-a")
            finished.append("a")

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await until(lambda: "a" in factory.waiting, "the slow call runs")
            assert (await run(c, "2 + 2", session_id="par-b"))["results"][0]["text"] == "4"
            finished.append("b")
            factory.gate("a").set()
        assert finished == ["b", "a"]


async def test_bad_arguments_are_refused_before_any_kernel(tmp_path: Path) -> None:
    async with fake_client(fake_settings(tmp_path, pool_size=0)) as (c, factory):
        assert "timeout" in error_text(await c.call_tool("run_code", {"code": "1", "timeout": -3}))
        assert "session_id" in error_text(
            await c.call_tool("run_code", {"code": "1", "session_id": "../etc"})
        )
        assert "code" in error_text(await c.call_tool("run_code", {"language": "python"}))
        assert "no session named 'nope'" in error_text(
            await c.call_tool("close_session", {"session_id": "nope"})
        )
        assert factory.started == []


async def test_list_sessions_shows_the_caps_and_the_warm_pool(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, pool_size=1, max_sessions=8, max_sessions_per_principal=3)
    async with fake_client(settings) as (c, factory):
        await until(lambda: factory.started, "the warm pool starts a kernel")
        listed = structured(await c.call_tool("list_sessions", {}))
        assert listed["max_sessions"] == 8 and listed["max_sessions_per_principal"] == 3
        assert listed["warm_kernels"] == 1 and listed.get("pool_error") is None
        assert listed["sessions"] == [] and listed["total"] == 0


async def test_output_past_the_budget_keeps_its_head_and_tail_within_the_answer(tmp_path: Path) -> None:
    async with fake_client(fake_settings(tmp_path, pool_size=0, max_output_chars=2000)) as (c, _):
        result = await c.call_tool("run_code", {"code": "for i in range(2000):\n    print(f'line {i:05d}')"})
        assert len(result.content[0].text) <= 2000 + MARKER_ROOM, len(result.content[0].text)
        out = structured(result)
        stdout = "".join(out["logs"]["stdout"])
        assert out["truncated"] is True and "output truncated" in result.content[0].text
        assert stdout.startswith("line 00000\n") and stdout.endswith("line 01999\n")
        assert len(stdout) <= 2000 + MARKER_ROOM  # of 22,000 characters printed


def test_the_fake_factory_is_what_the_executor_runs(tmp_path: Path) -> None:
    """(A guard on the fixture: these tests would be slow, not wrong, if it built real kernels.)"""
    from tests.execution.fakes import fake_executor

    executor, factory = fake_executor(fake_settings(tmp_path))
    assert isinstance(factory, FakeKernelFactory) and executor.pool.factory is factory
