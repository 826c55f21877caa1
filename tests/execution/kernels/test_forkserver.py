"""The fork server on its own: a warm template, kernels forked into normal kernel sandboxes.

Driven directly (no MCP): one template per module, kernels forked from it and compared
with kernels started the normal way. What each test proves is in its name and docstring.
The isolation contract seen through the MCP server is ``tests/security/test_interpreter_isolation.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

import kernmind
from kernmind.execution.executor import Executor
from kernmind.execution.kernels.forkserver import kernels as forkserver_kernels
from kernmind.execution.kernels.forkserver.kernels import ForkKernelFactory, describe, fork_server_report
from kernmind.execution.kernels.local import KernelFactory
from kernmind.execution.kernels.local_kernel import Kernel
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.rlimits import Limits
from kernmind.server import create_server
from tests.conftest import make_settings, structured
from tests.execution.kernels.calls import run, run_json
from tests.transport.procs import all_processes, wait_until

pytestmark = [
    pytest.mark.slow,  # real kernels, sandboxes or servers
    pytest.mark.anyio,
    pytest.mark.xdist_group("forkserver"),
    pytest.mark.skipif(Sandbox.detect("auto").backend != "bwrap", reason="bubblewrap is not usable here"),
]

AS_ROOT = os.geteuid() == 0

# What a kernel sees of its sandbox, with the per-kernel socket directory's name blurred.
PROBE = r"""
import json, os, resource, socket, sys
status = dict(l.split(":", 1) for l in open("/proc/self/status"))
mounts = sorted(l.split()[1] for l in open("/proc/self/mounts"))
print(json.dumps({
    "uid": os.getuid(),
    "caps": [status[k].strip() for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "no_new_privs": status["NoNewPrivs"].strip(),
    "mounts": ["/tmp/km-*" if m.startswith("/tmp/km-") else m for m in mounts],
    "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")},
    "env": sorted(os.environ),
    "cwd": os.getcwd(),
    "path": sys.path,
    "hostname": socket.gethostname(),
    "interfaces": sorted(n for _, n in socket.if_nameindex()),
    "processes": sorted(open(f"/proc/{p}/comm").read().strip() for p in os.listdir("/proc") if p.isdigit()),
    "history": str(get_ipython().history_manager.hist_file),
    "log_level": __import__("ipykernel.kernelapp").kernelapp.IPKernelApp.instance().log_level,
    "connection_file": __import__("ipykernel.kernelapp").kernelapp.IPKernelApp.instance().connection_file,
}))
"""


def fds_of(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture(scope="module")
async def base(tmp_path_factory: pytest.TempPathFactory) -> KernelFactory:
    return KernelFactory.standalone(
        Sandbox.detect("required"), PythonRuntime.probe(None), tmp_path_factory.mktemp("fs")
    )


@pytest.fixture(scope="module")
async def factory(base: KernelFactory) -> AsyncIterator[ForkKernelFactory]:
    forks = ForkKernelFactory(base)
    async with forks.running():
        assert await forks.server.settled(wait=120) is not None, forks.status()
        yield forks


async def forked(factory: ForkKernelFactory) -> Kernel:
    template = await factory.server.template(wait=120)
    assert template is not None, factory.status()
    return await factory.fork(template)


# --- the template ------------------------------------------------------------------------------


async def test_template_holds_one_thread_no_zmq_and_only_its_control_socket(
    factory: ForkKernelFactory,
) -> None:
    """At fork time the template has one thread, no zmq context (no eventfd/epoll) and one socket."""
    template = await factory.server.template()
    assert template is not None
    kernel = await forked(factory)  # forks happened: still true afterwards
    try:
        pid = template.proc.pid
        assert threads_of(pid) == 1
        fds = fds_of(pid)
        assert not [f for f in fds if "eventfd" in f or "eventpoll" in f]
        assert len([f for f in fds if f.startswith("socket:")]) == 1
    finally:
        await kernel.shutdown()


async def test_template_preloads_the_heavy_modules(factory: ForkKernelFactory) -> None:
    status = factory.status()
    assert status["active"] is True
    assert {"numpy", "pandas", "matplotlib.pyplot"} <= set(status["preloaded"])


# --- a forked kernel ---------------------------------------------------------------------------------


async def test_a_forked_kernel_sees_exactly_what_a_normal_kernel_sees(
    factory: ForkKernelFactory, base: KernelFactory
) -> None:
    """Mounts, rlimits, environment, capabilities, cwd, hostname, network: the same sandbox;
    and the same kernel configuration (history in memory, log level, its connection file)."""
    normal, fork = await base.start(), await forked(factory)
    try:
        seen_normal, seen_fork = await run_json(normal, PROBE), await run_json(fork, PROBE)
    finally:
        await normal.shutdown()
        await fork.shutdown()
    same = ("caps", "no_new_privs", "mounts", "rlimits", "env", "cwd", "path", "hostname", "interfaces")
    for key in (*same, "history", "log_level"):
        assert seen_fork[key] == seen_normal[key], key
    assert seen_fork["connection_file"] == seen_normal["connection_file"] == "/run/kernmind/kernel.json"
    if AS_ROOT:
        assert seen_fork["uid"] == fork.uid and fork.uid not in (0, None)
    # The same processes, plus the placeholder shell the kernel was forked next to.
    assert seen_fork["processes"] == sorted([*seen_normal["processes"], "sh"])


async def test_zmq_sockets_and_threads_are_made_in_the_kernel_only(factory: ForkKernelFactory) -> None:
    template = await factory.server.template()
    assert template is not None
    kernel = await forked(factory)
    try:
        facts = await run_json(
            kernel,
            "import json, os, threading\n"
            "fds = [os.readlink(f'/proc/self/fd/{f}') for f in os.listdir('/proc/self/fd') if os.path.exists(f'/proc/self/fd/{f}')]\n"
            "print(json.dumps({'threads': threading.active_count(), 'eventfds': sum('eventfd' in f for f in fds)}))",
        )
        assert facts["threads"] > 1 and facts["eventfds"] > 0
        assert not [f for f in fds_of(template.proc.pid) if "eventfd" in f]
    finally:
        await kernel.shutdown()


async def test_openblas_threads_work_after_the_fork(factory: ForkKernelFactory) -> None:
    """numpy's BLAS starts its threads afresh in the kernel; a matrix product is right and the
    template stays single-threaded."""
    template = await factory.server.template()
    assert template is not None
    kernel = await forked(factory)
    try:
        facts = await run_json(
            kernel,
            "import json, os, numpy as np\n"
            "a = np.arange(250_000, dtype=float).reshape(500, 500) / 1e5\n"
            "ok = bool(np.allclose(a @ np.eye(500), a))\n"
            "print(json.dumps({'ok': ok, 'threads': len(os.listdir('/proc/self/task'))}))",
        )
        assert facts["ok"] is True
        assert threads_of(template.proc.pid) == 1
    finally:
        await kernel.shutdown()


async def test_plots_come_back_from_a_forked_kernel(factory: ForkKernelFactory) -> None:
    """matplotlib, preloaded before IPython existed, is hooked into the kernel's shell."""
    kernel = await forked(factory)
    try:
        collector = await run(kernel, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])")
        assert any(r.png for r in collector.results)
    finally:
        await kernel.shutdown()


async def test_forked_kernels_are_independent_processes_with_their_own_uid(
    factory: ForkKernelFactory,
) -> None:
    first, second = await forked(factory), await forked(factory)
    try:
        a = await run_json(
            first, "import json, os, random; print(json.dumps([os.getuid(), random.random()]))"
        )
        b = await run_json(
            second, "import json, os, random; print(json.dumps([os.getuid(), random.random()]))"
        )
    finally:
        await first.shutdown()
        await second.shutdown()
    assert a[1] != b[1]
    if AS_ROOT:
        assert a[0] != b[0]


async def test_an_interrupted_forked_kernel_keeps_its_state_and_answers_the_next_cell(
    factory: ForkKernelFactory,
) -> None:
    """The interrupt is matched to the request it stops (message ids are not reused), every time."""
    kernel = await forked(factory)
    try:
        for round_ in range(2):
            busy = OutputCollector(1000)
            code = f"n = {round_}\nwhile True:\n    n += 1"
            outcome = await kernel.execute(code, busy, deadline=time.monotonic() + 1)
            assert outcome.kind == "deadline"
            assert await kernel.interrupt(busy, 5) is True
            after = await run(kernel, "n > 10")
            assert [r.text for r in after.results] == ["True"]
    finally:
        await kernel.shutdown()


async def test_a_kernel_exit_status_reaches_the_manager(factory: ForkKernelFactory) -> None:
    """os._exit(7) → the kernel is dead with status 7; SIGKILL → 137, as bubblewrap reports it."""
    for code, expected in (("import os; os._exit(7)", 7), ("import os; os.kill(os.getpid(), 9)", 137)):
        kernel = await forked(factory)
        try:
            outcome = await kernel.execute(code, OutputCollector(100), deadline=time.monotonic() + 30)
            assert outcome.kind == "died"
            assert outcome.exit_code == expected
        finally:
            await kernel.shutdown()


async def test_shutting_a_kernel_down_ends_everything_it_started(factory: ForkKernelFactory) -> None:
    """Background processes go with the sandbox, and the template's waiter process exits."""
    template = await factory.server.template()
    assert template is not None
    marker = f"fs-bg-{os.getpid()}-{time.monotonic_ns()}"
    kernel = await forked(factory)
    # A Python that ignores SIGTERM and SIGHUP and keeps the marker in its command line all its life
    # (a shell may exec its last command, and the marker would go with it).
    ignoring = "import signal, time; [signal.signal(s, signal.SIG_IGN) for s in (15, 1)]; time.sleep(300)"
    started = await run(
        kernel,
        f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {ignoring!r}, '{marker}'], start_new_session=True)",
    )
    assert started.error is None, started.error
    assert wait_until(lambda: processes_matching(marker), 10), "the background process never showed"
    await kernel.shutdown()
    assert await gone(marker)
    for _ in range(100):  # the waiter exits once the kernel is gone
        if not children_of(template.proc.pid):
            break
        await anyio.sleep(0.1)
    assert children_of(template.proc.pid) == []


async def test_without_a_sandbox_the_waiter_ends_what_the_kernel_left(tmp_path: Path) -> None:
    """``--sandbox none``: no pid namespace ends a forked kernel's background processes, so its
    waiter (their subreaper) kills them when the kernel ends (lifeline.py's walk, loaded by path)."""
    base = KernelFactory.standalone(Sandbox.detect("none"), PythonRuntime.probe(None), tmp_path / "fs")
    marker = f"fs-none-bg-{os.getpid()}-{time.monotonic_ns()}"
    forks = ForkKernelFactory(base, preload=[])
    async with forks.running():
        kernel = await forked(forks)
        started = await run(
            kernel,
            f"import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 300', '{marker}'], start_new_session=True)",
        )
        assert started.error is None, started.error
        assert processes_matching(marker)
        await kernel.shutdown()
        assert await gone(marker)


# --- the template's life -------------------------------------------------------------------------


async def test_kernels_survive_the_template_and_a_dead_template_is_replaced(base: KernelFactory) -> None:
    forks = ForkKernelFactory(base)
    async with forks.running():
        template = await forks.server.template(wait=120)
        assert template is not None
        kernel = await forked(forks)
        try:
            await run(kernel, "survivor = 41")
            os.kill(template.proc.pid, signal.SIGKILL)
            template.proc.wait(timeout=10)
            # The kernel does not depend on the template once ready.
            assert "".join((await run(kernel, "print(survivor + 1)")).logs().stdout) == "42\n"
            # Meanwhile kernels still come (the normal way, or from a new template)...
            other = await forks.start()
            assert "".join((await run(other, "print('fresh')")).logs().stdout) == "fresh\n"
            await other.shutdown()
            # ...and a new template takes over.
            for _ in range(60):
                current = await forks.server.template(wait=5)
                if current is not None and current is not template:
                    break
                await anyio.sleep(1)
            assert forks.status()["starts"] == 2
        finally:
            await kernel.shutdown()


async def test_a_stopped_template_costs_a_call_its_time_limit_and_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP the template: a call that needs a new kernel waits for the fork at most its own
    time limit (not the whole spawn wait), gets a kernel started the normal way, and
    the stopped template is killed and replaced, so later calls fork again."""
    # The fork's own waits made 900 s: a call that waited them, not its 5 s limit, fails the 300 s
    # hang bound below; a slow machine's normal start never does.
    monkeypatch.setattr(forkserver_kernels, "SPAWN_TIMEOUT", 900.0)
    monkeypatch.setattr(forkserver_kernels, "START_TIMEOUT", 900.0)
    settings = make_settings(tmp_path, pool_size=0)
    executor = Executor.from_settings(settings)
    async with Client(create_server(settings, executor)) as client:
        forks = executor.factory
        assert isinstance(forks, ForkKernelFactory)
        template = await forks.server.settled(wait=120)
        assert template is not None, forks.status()
        os.kill(template.proc.pid, signal.SIGSTOP)
        try:
            with anyio.fail_after(300):
                out = structured(
                    await client.call_tool("run_code", {"code": "2 + 2", "session_id": "b", "timeout": 5})
                )
        finally:
            if template.proc.poll() is None:
                os.kill(template.proc.pid, signal.SIGCONT)
        assert out["status"] == "ok" and out["results"][0]["text"] == "4", out
        assert template.proc.wait(timeout=30) is not None  # the stopped template was killed
        for _ in range(120):
            current = forks.server.current
            if current is not None and current is not template and current.gone is None:
                break
            await anyio.sleep(0.5)
        assert forks.status()["active"] and forks.status()["starts"] >= 2, forks.status()
        kernel = await forked(forks)  # the new template forks
        try:
            assert "".join((await run(kernel, "print('forked')")).logs().stdout) == "forked\n"
        finally:
            await kernel.shutdown()
        out = structured(
            await client.call_tool("run_code", {"code": "3 + 3", "session_id": "c", "timeout": 5})
        )
        assert out["results"][0]["text"] == "6"


async def test_kernels_are_forked_while_the_template_still_preloads(tmp_path: Path) -> None:
    """The template can fork as soon as ipykernel is in: while it imports the heavy modules, a
    snapshot of it taken before them forks kernels, so a kernel asked for meanwhile waits for
    none of them (the first ``run_code`` after a launch does not wait for pandas)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("slow_one", "slow_two"):
        (lib / f"{name}.py").write_text("import time\ntime.sleep(3)\n")
    base = KernelFactory.standalone(
        Sandbox.detect("required"),
        PythonRuntime.probe(None),
        tmp_path / "ws",
        extra_env={"PYTHONPATH": str(lib)},
    )
    forks = ForkKernelFactory(base, preload=["slow_one", "slow_two"])
    async with forks.running():
        template = await forks.server.template(wait=120)
        assert template is not None and forks.status()["preloading"] == ["slow_one", "slow_two"]
        early = await forks.fork(template)  # asked for while slow_one imports (3 s)
        try:
            code = "import sys\nprint('slow_one' in sys.modules, 'slow_two' in sys.modules)"
            assert "".join((await run(early, code)).logs().stdout) == "False False\n"
            assert forks.status()["preloading"], "the kernel came from the snapshot, before any preload"
            assert await forks.server.settled(wait=120) is template

            # The snapshot exits once the preloads are in; the early kernel lives on, its waiter
            # adopted by the template (a subreaper), so it stays below the server.
            def adopted_waiter() -> bool:
                """The template's only child is the kernel's waiter (the kernel below it, nothing
                below that), not the snapshot (which would have the waiter and the kernel below it)."""
                kids = children_of(template.proc.pid)
                below = children_of(kids[0]) if len(kids) == 1 else []
                return len(below) == 1 and children_of(below[0]) == []

            for _ in range(100):
                if adopted_waiter():
                    break
                await anyio.sleep(0.1)
            assert adopted_waiter(), [(k, children_of(k)) for k in children_of(template.proc.pid)]
            assert "".join((await run(early, "print(6 * 7)")).logs().stdout) == "42\n"
        finally:
            await early.shutdown()
        for _ in range(100):  # its waiter exits with it
            if not children_of(template.proc.pid):
                break
            await anyio.sleep(0.1)
        assert children_of(template.proc.pid) == []
        status = forks.status()
        assert status["preloaded"] == ["slow_one", "slow_two"] and status["preloading"] == []
        kernel = await forks.fork(template)
        try:
            assert "".join((await run(kernel, code)).logs().stdout) == "True True\n"
        finally:
            await kernel.shutdown()


async def test_a_preload_that_starts_a_thread_is_dropped(tmp_path: Path) -> None:
    """A preload that starts a thread makes forking unsafe: no kernel is forked from that
    template, it is replaced by one without the preloads, kernels still start, and the
    reason is reported."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    base = KernelFactory.standalone(
        Sandbox.detect("required"),
        PythonRuntime.probe(None),
        tmp_path / "ws",
        extra_env={"PYTHONPATH": str(lib)},
    )
    forks = ForkKernelFactory(base, preload=["starts_a_thread"])
    async with forks.running():
        kernel = await forks.start()
        try:
            assert "".join((await run(kernel, "print(6 * 7)")).logs().stdout) == "42\n"
        finally:
            await kernel.shutdown()
        template = await forks.server.settled(wait=120)
        assert template is not None and threads_of(template.proc.pid) == 1
        status = forks.status()
        assert status["active"] is True and status["preloaded"] == []
        assert "threads" in status["preloads_dropped"] and "starts_a_thread" in status["preloads_dropped"]
        kernel = await forks.fork(template)
        try:
            code = "import sys\nprint('starts_a_thread' in sys.modules)"
            assert "".join((await run(kernel, code)).logs().stdout) == "False\n"
        finally:
            await kernel.shutdown()


async def test_preloads_too_big_for_the_memory_limit_are_dropped(tmp_path: Path) -> None:
    """Every fork starts with the template's data counted against its RLIMIT_DATA: under a small
    limit the template comes up without the heavy modules, and kernels can still import them."""
    base = KernelFactory.standalone(
        Sandbox.detect("required"), PythonRuntime.probe(None), tmp_path, limits=Limits(memory_mb=256)
    )
    forks = ForkKernelFactory(base)
    async with forks.running():
        template = await forks.server.settled(wait=120)
        assert template is not None
        assert forks.status()["preloaded"] == []
        assert "256 MiB memory limit" in forks.status()["preloads_dropped"]
        kernel = await forks.fork(template)
        try:
            assert "".join((await run(kernel, "import pandas\nprint('ok')")).logs().stdout) == "ok\n"
        finally:
            await kernel.shutdown()


async def test_doctor_report_says_active_and_how_fast_it_forks(base: KernelFactory) -> None:
    report = await fork_server_report(base)
    assert report["active"] is True and report["ok"] is True
    assert report["fork_ms"] > 0 and "pandas" in report["preloaded"]
    assert describe(report).startswith("active — a fresh kernel in ")


async def test_doctor_report_says_why_it_is_not_used(tmp_path: Path) -> None:
    """A template that cannot start: not active, with the reason (kernels start the normal way)."""
    broken = KernelFactory.standalone(
        Sandbox.detect("required"),
        dataclasses.replace(PythonRuntime.probe(None), executable="/bin/false"),
        tmp_path,
    )
    report = await fork_server_report(broken)
    assert report["active"] is False and "template" in report["reason"]
    assert describe(report).startswith("not used — ")


# --- helpers ---------------------------------------------------------------------------------


def processes_matching(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                continue
    return found


async def gone(marker: str) -> bool:
    for _ in range(100):
        if not processes_matching(marker):
            return True
        await anyio.sleep(0.1)
    return False


def children_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


# --- as a normal user ----------------------------------------------------------------------------

USER = "kernmind-ci"

AS_USER_DRIVER = r"""
import anyio, json, os, sys, tempfile, time
from pathlib import Path
from kernmind.execution.kernels.forkserver.kernels import ForkKernelFactory
from kernmind.execution.kernels.local import KernelFactory
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.rlimits import Limits

CODE = '''
import json, os, socket, subprocess
status = dict(l.split(":", 1) for l in open("/proc/self/status"))
subprocess.Popen(["sh", "-c", "sleep 300", "as-user-bg-marker"], start_new_session=True)
print(json.dumps({
    "uid": os.getuid(), "cwd": os.getcwd(),
    "caps": [status[k].strip() for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "no_new_privs": status["NoNewPrivs"].strip(),
    "interfaces": sorted(n for _, n in socket.if_nameindex()),
    "host_dir_visible": os.path.exists(HOST_DIR),
}))
'''

async def main():
    sandbox = Sandbox.detect("required")
    base = KernelFactory.standalone(sandbox, PythonRuntime.probe(None), Path(sys.argv[1]))
    forks = ForkKernelFactory(base)
    async with forks.running():
        template = await forks.server.template(wait=120)
        if template is None:
            print(json.dumps({"error": forks.status()}))
            return
        kernel = await forks.fork(template)
        collector = OutputCollector(10_000)
        code = CODE.replace("HOST_DIR", repr(os.environ["HOME"]))  # the driver's home on the host
        await kernel.execute(code, collector, deadline=time.monotonic() + 60)
        report = json.loads("".join(collector.logs().stdout))
        report["as_root"] = sandbox.as_root
        report["kernel_uid"] = kernel.uid
        await kernel.shutdown()
    print(json.dumps(report))

anyio.run(main)
"""


def readable_prefix_mounts(paths: list[str]) -> str:
    """Shell that, in a private mount namespace, makes ``paths`` reachable for another user:
    each 0700 ancestor (such as /root, where pyenv lives) is covered by a 0755 tmpfs holding
    binds of just the children on the way to the paths."""
    script = ["set -e", "stash=$(mktemp -d)"]
    done: set[str] = set()
    for path in paths:
        parts = Path(path).parts
        for depth in range(1, len(parts)):
            ancestor = str(Path(*parts[:depth]))
            if os.stat(ancestor).st_mode & 0o005 == 0o005 or ancestor in done:
                continue
            done.add(ancestor)
            children = sorted({Path(p).parts[depth] for p in paths if Path(p).parts[:depth] == parts[:depth]})
            script.append(f"mkdir -p $stash{ancestor} && mount --bind {ancestor} $stash{ancestor}")
            script.append(f"mount -t tmpfs -o mode=755 tmpfs {ancestor}")
            for child in children:
                script.append(
                    f"mkdir -p {ancestor}/{child} && mount --bind $stash{ancestor}/{child} {ancestor}/{child}"
                )
    return "; ".join(script)


@pytest.mark.skipif(not AS_ROOT, reason="needs root to create and switch to a test user")
def test_fork_server_as_a_normal_user() -> None:
    """Unprivileged: the template forks into a user-namespace sandbox; the kernel has no
    capabilities, no network, the user's own uid (one uid: no per-kernel uid without root)."""
    try:
        user = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True
        )
        user = pwd.getpwnam(USER)
    shared = Path(tempfile.mkdtemp(prefix="kernmind-fork-user-"))
    try:
        shared.chmod(0o755)
        (shared / "driver.py").write_text(AS_USER_DRIVER)
        (shared / "driver.py").chmod(0o644)
        workspaces = shared / "ws"
        workspaces.mkdir()
        os.chown(workspaces, user.pw_uid, user.pw_gid)
        runtime = PythonRuntime.probe(None)
        # kernmind itself too: an editable install reads the checkout (its src/ and kernels/), which may be
        # a 0700 directory
        package = Path(kernmind.__file__).resolve()
        source = [str(package.parents[1]), *[str(p) for p in [package.parents[2] / "kernels"] if p.is_dir()]]
        prepare = readable_prefix_mounts([*runtime.paths, sys.executable, *source])
        inner = (
            f"setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups "
            f"env -i PATH=/usr/bin:/bin HOME={shared} {sys.executable} {shared}/driver.py {workspaces}"
        )
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{prepare}; {inner}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert "error" not in report, report
        if report["as_root"]:
            pytest.skip("the driver did not run unprivileged")
        assert report["uid"] == user.pw_uid and report["kernel_uid"] is None
        assert report["caps"] == ["0000000000000000"] * 4 and report["no_new_privs"] == "1"
        assert report["cwd"] == "/workspace" and report["host_dir_visible"] is False
        assert report["interfaces"] == ["lo"]
        assert not processes_matching("as-user-bg-marker")  # it ended with its sandbox
    finally:
        shutil.rmtree(shared, ignore_errors=True)


async def test_a_missing_python_is_runtime_unavailable_forked_or_not(tmp_path: Path) -> None:
    """Every factory says "runtime unavailable" the same way (the tools map it to one sentence)."""
    from kernmind.execution.errors import RuntimeUnavailable

    runtime = PythonRuntime.probe(str(tmp_path / "no-such-python"))
    assert runtime.error
    base = KernelFactory.standalone(Sandbox.detect("auto"), runtime, tmp_path / "fs")
    for factory in (base, ForkKernelFactory(base)):
        with pytest.raises(RuntimeUnavailable, match="no-such-python"):
            await factory.start()


def my_templates() -> set[int]:
    """This process's children that are fork-server templates."""
    me = os.getpid()
    return {p.pid for p in all_processes() if p.ppid == me and "forkserver/template.py" in p.cmdline}


async def test_a_server_stopped_while_its_template_starts_leaves_no_template(tmp_path: Path) -> None:
    """The template starts with the server and says hello about half a second later: a server
    stopped before that (a client that only lists tools) once left it running, a process and
    ≈ 50 MiB each, until the garbage collector got to it."""
    before = my_templates()
    for i in range(3):
        async with Client(create_server(make_settings(tmp_path / str(i)))) as client:
            await client.list_tools()
    assert wait_until(lambda: not my_templates() - before, 5), my_templates() - before
