"""Every process a session runs lands in the session's control group, on every path that starts one.

In-process servers (the executor at hand to look at its groups): kernels started the normal way
and adopted from the warm pool, kernels forked by the fork server, bash next to Python in one
session, background jobs, and ``--stateless`` calls, whose group goes with the call.
Needs a hierarchy this process may write (root on cgroup v1 in CI); skipped elsewhere.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.execution.executor import Executor
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import CgroupSupport
from kernmind.server import create_server
from tests.conftest import make_settings, structured

SUPPORT = CgroupSupport.detect(cpu_weight=25)
SUPPORT.close()
pytestmark = [
    pytest.mark.slow,  # real kernels, sandboxes or servers
    pytest.mark.anyio,
    pytest.mark.xdist_group("limits"),
    pytest.mark.skipif(not SUPPORT.active, reason=f"no control groups here: {SUPPORT.reason}"),
    pytest.mark.skipif(Sandbox.detect("auto").backend != "bwrap", reason="bubblewrap is not usable here"),
]

LIMITS: dict[str, Any] = {"memory_mb": 300, "max_processes": 64, "preload": [], "embedding_model": "none"}
SHM_HOG = "for i in range(45):\n    open(f'/dev/shm/f{i}', 'wb').write(b'x' * 10 * 2**20)"


async def serve(tmp: Path, **settings: Any) -> AsyncIterator[tuple[Client, Executor]]:
    config = make_settings(tmp, sandbox="required", **{**LIMITS, **settings})
    executor = Executor.from_settings(config)
    async with Client(create_server(config, executor)) as client:
        yield client, executor
    assert not any(d.exists() for d in executor.cgroups.server_dirs), "the server removed its groups"


@pytest.fixture
async def normal(tmp_path: Path) -> AsyncIterator[tuple[Client, Executor]]:
    async for pair in serve(tmp_path, fork_server=False, pool_size=1):
        yield pair


@pytest.fixture
async def forked(tmp_path: Path) -> AsyncIterator[tuple[Client, Executor]]:
    async for pair in serve(tmp_path, pool_size=0):
        yield pair


async def run(client: Client, code: str, session: str | None = "s", **kw: Any) -> dict[str, Any]:
    args = {"code": code, **({"session_id": session} if session else {}), **kw}
    return structured(await client.call_tool("run_code", args))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def session_groups(executor: Executor) -> list[Path]:
    return sorted(p for d in executor.cgroups.server_dirs[:1] for p in d.iterdir() if p.is_dir())


def stopped_for_memory(out: dict[str, Any]) -> bool:
    return out["status"] == "error" and (out["error"] or {}).get("name") == "MemoryLimitExceeded"


async def test_a_warm_kernel_joins_the_sessions_group_and_bash_runs_beside_it(
    normal: tuple[Client, Executor],
) -> None:
    client, executor = normal
    # A session whose first process is Python: the warm kernel's own group becomes the session's.
    await run(client, "1", session="first")
    first = executor.sessions.live("first")
    assert first is not None and first.limits is not None and first.limits.group is not None
    assert any("ipykernel" in cmdline(p) for p in first.limits.group.pids())
    # A session that ran bash first has a group already: a warm kernel's processes move into it.
    await run(client, "true", language="bash")
    session = executor.sessions.live("s")
    assert session is not None and session.limits is not None and session.limits.group is not None
    group = session.limits.group
    with anyio.fail_after(60):
        while not executor.pool.ready_count:  # noqa: ASYNC110 (the pool refills in the background)
            await anyio.sleep(0.1)
    warm = executor.pool._ready[0].group
    assert warm is not None and warm is not group
    assert (await run(client, "import os; os.getpid() > 0"))["results"][0]["text"] == "True"
    assert any("ipykernel" in cmdline(p) for p in group.pids()), [cmdline(p) for p in group.pids()]
    assert session.limits.group is group and not any(d.exists() for d in warm.dirs)  # adopted, removed
    job = structured(
        await client.call_tool(
            "run_code", {"code": "sleep 300", "language": "bash", "session_id": "s", "background": True}
        )
    )
    with anyio.fail_after(60):
        while not any(cmdline(p).startswith("sleep 300") for p in group.pids()):  # noqa: ASYNC110 (polling /proc)
            await anyio.sleep(0.05)
    await client.call_tool("job_cancel", {"job_id": job["job_id"]})
    out = await run(client, SHM_HOG)
    assert stopped_for_memory(out), out
    assert (await run(client, "6 * 7"))["results"][0]["text"] == "42"


async def test_a_forked_kernel_is_born_in_the_sessions_group(forked: tuple[Client, Executor]) -> None:
    client, executor = forked
    await run(client, "x = 1")
    session = executor.sessions.live("s")
    assert session is not None and session.limits is not None and session.limits.group is not None
    uid = session.workspace.owner_uid if session.workspace else None
    members = session.limits.group.pids()
    kernels = [
        p for p in members if "forkserver/template.py" in cmdline(p) and (uid is None or uid_of(p) == uid)
    ]
    assert kernels, [(p, cmdline(p), uid_of(p)) for p in members]
    template = executor.factory.server.current  # type: ignore[union-attr]
    assert template is not None and template.proc.pid not in members  # the template itself stays outside
    # The forked kernel loaded the sandbox's seccomp filter: it cannot change its file-size limit.
    probe = "import resource\ntry:\n    resource.setrlimit(resource.RLIMIT_FSIZE, resource.getrlimit(resource.RLIMIT_FSIZE))\n    r = 'changed'\nexcept (ValueError, OSError):\n    r = 'refused'\nr"
    assert (await run(client, probe))["results"][0]["text"] == "'refused'"
    assert stopped_for_memory(await run(client, SHM_HOG))


async def _warm_group(executor: Executor) -> Any:
    """The own group of the pool's next warm kernel (once there is one)."""
    with anyio.fail_after(60):
        while not executor.pool.ready_count:  # noqa: ASYNC110 (the pool refills in the background)
            await anyio.sleep(0.1)
    group = executor.pool._ready[0].local.group
    assert group is not None
    return group


async def test_a_reset_hands_the_fresh_interpreter_the_sessions_group(tmp_path: Path) -> None:
    """A reset's fresh interpreter takes the session's place in its group without moving a
    process (a move waits for the kernel's RCU grace period): when only the old interpreter
    lived in the session's group, the warm kernel's own group becomes the session's and the old
    one goes with the old interpreter. The session's limits hold in the new group."""
    async for client, executor in serve(tmp_path, pool_size=1):
        await run(client, "x = 1", session="r")
        session = executor.sessions.live("r")
        assert session is not None and session.limits is not None
        before, warm = session.limits.group, await _warm_group(executor)
        assert before is not None and warm is not before
        out = await run(client, "'x' in dir()", session="r", reset=True)
        assert out["results"][0]["text"] == "False"
        assert session.limits.group is warm  # handed over, nothing moved
        assert any("forkserver/template.py" in cmdline(p) for p in warm.pids())
        with anyio.fail_after(30):
            while any(d.exists() for d in before.dirs):  # noqa: ASYNC110 (the old interpreter stops in the background)
                await anyio.sleep(0.05)
        assert stopped_for_memory(await run(client, SHM_HOG, session="r"))  # the limit holds
        assert (await run(client, "6 * 7", session="r"))["results"][0]["text"] == "42"


@pytest.mark.skipif(
    shutil.which("java") is None, reason="no Java here (its warm JShell host stays in the group)"
)
async def test_a_reset_moves_into_the_group_where_another_process_of_the_session_lives(
    tmp_path: Path,
) -> None:
    """The session's Java host lives in the session's group beside the interpreter: a reset
    keeps the group (the host stays in it) and the fresh interpreter's processes move in."""
    async for client, executor in serve(tmp_path, pool_size=1):
        await run(client, "x = 1", session="r")
        out = await run(client, 'System.out.println("up");', language="java", session="r")
        assert "".join(out["logs"]["stdout"]).strip() == "up"
        session = executor.sessions.live("r")
        assert session is not None and session.limits is not None
        kept, warm = session.limits.group, await _warm_group(executor)
        assert kept is not None
        java = [p for p in kept.pids() if "java" in cmdline(p)]
        assert java, [cmdline(p) for p in kept.pids()]
        await run(client, "1", session="r", reset=True)
        assert session.limits.group is kept
        members = kept.pids()
        assert set(java) <= set(members)
        assert any("forkserver/template.py" in cmdline(p) for p in members)
        assert not any(d.exists() for d in warm.dirs)  # its processes moved, it was removed


async def test_stateless_calls_get_a_group_that_goes_with_the_call(tmp_path: Path) -> None:
    async for client, executor in serve(tmp_path, stateless=True, pool_size=0):
        out = await run(client, SHM_HOG, session=None)
        assert stopped_for_memory(out), out
        assert (await run(client, "1 + 1", session=None))["results"][0]["text"] == "2"
        with anyio.fail_after(60):
            while session_groups(executor):  # noqa: ASYNC110 (kernels of finished calls stop in the background)
                await anyio.sleep(0.1)


async def test_a_background_job_past_its_memory_is_stopped_and_says_so(
    forked: tuple[Client, Executor],
) -> None:
    client, _ = forked
    job = structured(
        await client.call_tool("run_code", {"code": SHM_HOG, "session_id": "bg", "background": True})
    )
    with anyio.fail_after(60):
        while True:
            status = structured(await client.call_tool("job_status", {"job_id": job["job_id"]}))
            if status.get("state") not in ("running", "queued", "starting"):
                break
            await anyio.sleep(0.2)
    assert "MemoryLimitExceeded" in str(status), status


@pytest.mark.skipif(SUPPORT.cpu_dir is None, reason=f"no cpu controller to use here: {SUPPORT.cpu_reason}")
async def test_a_spinning_job_runs_in_its_sessions_cpu_group_below_the_sandboxes_weight(
    tmp_path: Path,
) -> None:
    """The fairness a shared server needs: code spinning the CPU (a background job here) runs in its
    session's cpu group, every session with the same weight, all below one group that weighs
    ``DEFAULT_CPU_WEIGHT`` against the server process, which stays outside."""
    async for client, executor in serve(tmp_path, pool_size=0):
        support = executor.cgroups
        assert support.cpu_dir is not None, support.cpu_reason
        weight_file = "cpu.weight" if support.mode == "v2" else "cpu.shares"
        expected = "100" if support.mode == "v2" else "1024"
        assert (support.cpu_dir / weight_file).read_text().strip() == expected
        job = structured(
            await client.call_tool(
                "run_code", {"code": "while True: pass", "session_id": "spin", "background": True}
            )
        )
        await run(client, "1 + 1", session="quiet")
        groups = {}
        for name in ("spin", "quiet"):
            session = executor.sessions.live(name)
            assert session is not None and session.limits is not None and session.limits.group is not None
            groups[name] = session.limits.group
        spin, quiet = groups["spin"], groups["quiet"]
        assert spin.cpu_dir is not None and spin.cpu_dir.parent == support.cpu_dir
        assert spin.cpu_weight() == quiet.cpu_weight() == 100  # sessions share the sandboxes' part equally
        in_cpu_group = {
            int(pid)
            for procs in spin.join
            if procs.is_relative_to(support.cpu_dir)
            for pid in procs.read_text().split()
        }
        kernels = [p for p in in_cpu_group if "forkserver/template.py" in cmdline(p)]
        assert kernels, [cmdline(p) for p in in_cpu_group]
        assert os.getpid() not in in_cpu_group  # the server itself is weighed on its own
        await client.call_tool("job_cancel", {"job_id": job["job_id"]})


def test_the_server_itself_is_never_in_a_session_group() -> None:
    membership = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    assert "/kernmind-" not in membership.replace("/kernmind-server", "")
