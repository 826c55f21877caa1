"""Several ``kernmind serve --transport http`` replicas on one kernel gateway and one PostgreSQL.

Real processes throughout: the replicas, a real ``jupyter-kernel-gateway`` and a real
PostgreSQL, started by the tests. A session is a row in the database, so:

- a session created through one replica continues through another, variables and files;
- calls to one session through two replicas run one at a time (a short time limit on the
  second call cannot interrupt the first call's code while it waits);
- a replica killed with SIGKILL in the middle of a call leaves the session usable through
  the other (its lock dies with its connection);
- idle sessions are reaped once, by one replica, and the next call says so.
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.conftest import structured
from tests.execution.gateway_server import KernelGatewayServer
from tests.memory.postgres_server import PostgresServer
from tests.transport.procs import HttpServer, start_http, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("gateway-replicas"), pytest.mark.slow]


@contextlib.contextmanager
def replicas_on(
    root: Path, gateway: KernelGatewayServer, postgres: PostgresServer, count: int = 2, *extra: str
) -> Iterator[list[HttpServer]]:
    db = postgres.new_database()
    shared = root / "shared"
    shared.mkdir()
    servers: list[HttpServer] = []
    try:
        for i in range(count):
            home = root / f"replica{i}"
            home.mkdir()
            servers.append(
                start_http(
                    home,
                    "--db",
                    db,
                    "--kernel-gateway",
                    gateway.url,
                    "--kernel-gateway-workspaces",
                    str(shared),
                    "--sandbox",
                    "none",
                    "--embedding-model",
                    "none",
                    *extra,
                    env={"KERNMIND_KERNEL_GATEWAY_TOKEN": gateway.token},
                )
            )
        yield servers
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.stop()


@pytest.fixture(scope="module")
def two_replicas(
    tmp_path_factory: pytest.TempPathFactory,
    kernel_gateway: KernelGatewayServer,
    postgres_server: PostgresServer,
) -> Iterator[list[HttpServer]]:
    with replicas_on(tmp_path_factory.mktemp("replicas"), kernel_gateway, postgres_server) as servers:
        yield servers


async def run(server: HttpServer, code: str, **args: object) -> dict:
    async with server.client() as client:
        return structured(await client.call_tool("run_code", {"code": code, **args}))


async def appeared(path: Path) -> None:
    """Wait (60 s at most, a hang bound) for a file a kernel's code writes when it starts: the
    kernels run unsandboxed on this machine, so the test sees the call is running, not a time."""
    with anyio.fail_after(60):
        while not path.exists():  # noqa: ASYNC110 - a file in another process: nothing to await
            await anyio.sleep(0.02)


async def test_a_session_continues_through_another_replica(two_replicas: list[HttpServer]) -> None:
    a, b = two_replicas
    first = await run(a, "x = 41\nopen('note.txt', 'w').write('from A')", session_id="handover")
    assert first["status"] == "ok"
    second = await run(b, "x + 1, open('note.txt').read()", session_id="handover")
    assert second["results"][0]["text"] == "(42, 'from A')"
    assert second["execution_count"] == first["execution_count"] + 1
    async with b.client() as client:
        listed = structured(await client.call_tool("list_files", {"session_id": "handover"}))
        assert [f["path"] for f in listed["files"]] == ["note.txt"]
        structured(
            await client.call_tool(
                "upload_file", {"path": "in.csv", "content": "a\n1\n", "session_id": "handover"}
            )
        )
    third = await run(a, "open('in.csv').read()", session_id="handover")
    assert third["results"][0]["text"] == "'a\\n1\\n'"


async def test_calls_to_one_session_run_one_at_a_time_across_replicas(
    two_replicas: list[HttpServer], tmp_path: Path
) -> None:
    """B's call waits for A's: its 1 s limit starts when its code starts, so it cannot interrupt A's."""
    a, b = two_replicas
    await run(a, "import time\nspans = {}", session_id="serial")
    results: dict[str, dict] = {}
    started = tmp_path / "a-started"

    async def slow() -> None:
        code = f"t0 = time.time()\nopen({str(started)!r}, 'w').close()\ntime.sleep(2)\nspans['a'] = (t0, time.time())"
        results["a"] = await run(a, code, session_id="serial", timeout=30)

    async def quick() -> None:
        await appeared(started)  # A's code is running: B's call comes while it runs
        results["b"] = await run(b, "spans['b'] = (time.time(), time.time())", session_id="serial", timeout=1)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            tg.start_soon(quick)
    assert results["a"]["status"] == "ok", results["a"]
    assert results["b"]["status"] == "ok", results["b"]
    spans = await run(a, "spans['b'][0] >= spans['a'][1]", session_id="serial")
    assert spans["results"][0]["text"] == "True"


async def test_a_replica_killed_mid_call_leaves_the_session_usable(
    tmp_path: Path, kernel_gateway: KernelGatewayServer, postgres_server: PostgresServer
) -> None:
    with replicas_on(tmp_path, kernel_gateway, postgres_server) as (a, b):
        await run(a, "k = 7", session_id="survivor")
        started = tmp_path / "doomed-started"

        async def doomed() -> None:
            with contextlib.suppress(Exception):
                code = f"import time\nopen({str(started)!r}, 'w').close()\ntime.sleep(3)\nk = 8"
                await run(a, code, session_id="survivor")

        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            await appeared(started)  # killed mid-call: its code is running
            a.stop(signal.SIGKILL)
        with anyio.fail_after(60):
            after = await run(b, "k", session_id="survivor")
        # The kernel finished the dead replica's call; the session's lock died with its connection.
        assert after["results"][0]["text"] == "8"


async def test_idle_sessions_are_reaped_once_for_all_replicas(
    tmp_path: Path, kernel_gateway: KernelGatewayServer, postgres_server: PostgresServer
) -> None:
    with replicas_on(tmp_path, kernel_gateway, postgres_server, 2, "--idle-timeout", "1") as (a, b):
        await run(a, "z = 1\nopen('gone.txt', 'w').write('x')", session_id="sleepy")
        closing = re.compile(r"closing session 'sleepy' after")
        reaped = lambda: any(closing.search(s.log_text()) for s in (a, b))  # noqa: E731
        assert await anyio.to_thread.run_sync(wait_until, reaped, 30.0)
        # A session that goes idle later is reaped later: by then each replica's reaper has had
        # its turns since the first reap, and a second reaper would have closed 'sleepy' again.
        await run(a, "1", session_id="later")
        later = re.compile(r"closing session 'later' after")
        reaped_later = lambda: any(later.search(s.log_text()) for s in (a, b))  # noqa: E731
        assert await anyio.to_thread.run_sync(wait_until, reaped_later, 30.0)
        assert sum(len(closing.findall(s.log_text())) for s in (a, b)) == 1
        assert sum(len(later.findall(s.log_text())) for s in (a, b)) == 1
        out = await run(b, "'z' in globals(), __import__('os').listdir('.')", session_id="sleepy")
        assert out["results"][0]["text"] == "(False, [])"
        assert any("idle" in note for note in out["notes"])
