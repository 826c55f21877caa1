"""The creation guard: a kernel already running when its session goes over the quota creates nothing.

Real kernels in real bubblewrap sandboxes, started the normal way (the lifeline in front of
bubblewrap answers the guard) and forked from the fork server's template (the template's
waiter answers it). A kernel starts under the quota and creates files; the session's write
block is put on its processes exactly as the quota does (``SessionLimits.block_writes``:
soft RLIMIT_FSIZE 0); from then on that *same running kernel*, and what it starts, gets
"Disk quota exceeded" for ``mkdir``, ``open(…, "w")``, links and FIFOs, while reading,
writing into existing files' space it frees, deleting and truncating work; once the block
is lifted, creating works again. A helper that dies ends its sandbox instead of leaving
calls waiting. The session-level view (a real server, its quota notes) is
tests/security/test_session_limits.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from kernmind.execution.kernels.forkserver.kernels import ForkKernelFactory
from kernmind.execution.kernels.local import KernelFactory
from kernmind.execution.kernels.local_kernel import Kernel
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.sandbox import creation_guard, seccomp
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import CgroupSupport
from kernmind.execution.sandbox.limits import SessionLimits
from tests.execution.kernels.calls import run, run_json
from tests.execution.sandbox import name_makers

SANDBOX = Sandbox.detect("auto")

pytestmark = [
    pytest.mark.slow,  # real kernels, sandboxes or servers
    pytest.mark.anyio,
    pytest.mark.xdist_group("forkserver"),
    pytest.mark.skipif(not SANDBOX.isolated, reason=f"bubblewrap is not usable here: {SANDBOX.reason}"),
    pytest.mark.skipif(SANDBOX.guard is None, reason=f"no creation guard here: {SANDBOX.guard_problem}"),
]

# Runs in the kernel: each attempt's errno name (or "ok").
ATTEMPTS = r"""
import errno, json, os, subprocess
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
attempt("mkdir", lambda: os.mkdir("refused_dir"))
attempt("open_new", lambda: open("refused.txt", "w").close())
attempt("os_open_creat", lambda: os.close(os.open("refused2", os.O_WRONLY | os.O_CREAT)))
attempt("symlink", lambda: os.symlink("keep.txt", "refused_link"))
attempt("hardlink", lambda: os.link("keep.txt", "refused_hard"))
attempt("fifo", lambda: os.mkfifo("refused_fifo"))
attempt("tmp_file", lambda: open("/tmp/refused", "w").close())
attempt("append_existing", lambda: open("keep.txt", "a").write("more"))  # O_CREAT: refused too
attempt("read", lambda: open("keep.txt").read())
attempt("truncate", lambda: os.truncate("big.bin", 0))
attempt("remove", lambda: os.remove("gone.txt"))
attempt("rmdir", lambda: os.rmdir("before"))
child = subprocess.run(["mkdir", "from_child"], capture_output=True, text=True)
out["child_mkdir"] = child.stderr.strip()
out["listing"] = sorted(os.listdir("."))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
async def base(tmp_path_factory: pytest.TempPathFactory) -> KernelFactory:
    return KernelFactory.standalone(SANDBOX, PythonRuntime.probe(None), tmp_path_factory.mktemp("guard"))


@pytest.fixture(scope="module")
async def forks(base: KernelFactory) -> AsyncIterator[ForkKernelFactory]:
    factory = ForkKernelFactory(base, preload=())
    async with factory.running():
        assert await factory.server.settled(wait=120) is not None, factory.status()
        yield factory


async def started(how: str, base: KernelFactory, forks: ForkKernelFactory) -> Kernel:
    if how == "normal":
        return await base.start()
    template = await forks.server.template(wait=120)
    assert template is not None, forks.status()
    kernel = await forks.fork(template)
    assert kernel.forked_pid is not None  # a real fork, not the fallback
    return kernel


def session_of(kernel: Kernel) -> SessionLimits:
    """The kernel's processes as a session without control groups sees them."""
    limits = SessionLimits(CgroupSupport.disabled("not needed here"), SANDBOX.limits)
    limits.track("kernel", kernel.root_pids())
    return limits


def helper_of(kernel: Kernel) -> int:
    """The process that answers the kernel's guard: the lifeline (normal start) or the waiter (fork)."""
    if kernel.forked_pid is not None:
        stat = Path(f"/proc/{kernel.forked_pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    pid = kernel.root_pids()[0]
    assert b"lifeline.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return pid


@pytest.mark.parametrize("how", ["normal", "forked"])
async def test_a_running_kernel_creates_nothing_while_its_session_is_over_and_cleans_up(
    how: str, base: KernelFactory, forks: ForkKernelFactory
) -> None:
    kernel = await started(how, base, forks)
    try:
        # Under the quota: the kernel creates as usual (every O_CREAT goes through the guard).
        setup = (
            "import os\nos.mkdir('before')\nopen('keep.txt', 'w').write('kept')\n"
            "open('gone.txt', 'w').write('x')\nopen('big.bin', 'wb').write(b'b' * 2**20)\n"
            "print(sorted(os.listdir('.')))"
        )
        assert (await run(kernel, setup)).error is None
        limits = session_of(kernel)
        await anyio.to_thread.run_sync(limits.block_writes)  # what the quota does when it finds it over
        out = await run_json(kernel, ATTEMPTS)
        for name in ("mkdir", "open_new", "os_open_creat", "symlink", "hardlink", "fifo", "tmp_file"):
            assert out[name] == "EDQUOT", (name, out)
        assert out["append_existing"] == "EDQUOT", out  # opening with O_CREAT is creating, to the filter
        for name in ("read", "truncate", "remove", "rmdir"):
            assert out[name] == "ok", (name, out)
        assert "Disk quota exceeded" in out["child_mkdir"], out  # what it starts is held too
        assert out["listing"] == ["big.bin", "keep.txt"], out  # nothing new; what was deleted is gone
        # Back under the quota: the same kernel creates again.
        await anyio.to_thread.run_sync(limits.allow_writes)
        again = await run(
            kernel, "import os\nos.mkdir('after')\nopen('after/x', 'w').close()\nos.listdir('after')"
        )
        assert again.error is None and again.results[0].text == "['x']", again.error
    finally:
        await kernel.shutdown()
        kernel.workspace.remove()


@pytest.mark.parametrize("how", ["normal", "forked"])
async def test_every_call_that_makes_a_name_is_held_in_a_running_kernel_and_io_uring_is_off(
    how: str, base: KernelFactory, forks: ForkKernelFactory
) -> None:
    """Each family by ``syscall(2)`` from the kernel's own process (``name_makers``): made under
    the quota, refused once the session is over, while io_uring fails with ENOSYS throughout."""
    kernel = await started(how, base, forks)
    try:
        for tag in ("u", "o"):
            assert (
                await run(kernel, f"import os\nos.environ['KM_PROBE_TAG'] = '{tag}'\n" + name_makers.SETUP)
            ).error is None
        under = await run_json(kernel, "import os\nos.environ['KM_PROBE_TAG'] = 'u'\n" + name_makers.PROBE)
        for family in name_makers.FAMILIES:
            assert under[family] == "ok", (family, under)
        limits = session_of(kernel)
        await anyio.to_thread.run_sync(limits.block_writes)
        over = await run_json(kernel, "import os\nos.environ['KM_PROBE_TAG'] = 'o'\n" + name_makers.PROBE)
        for family in name_makers.FAMILIES:
            expected = "ENOSYS" if family.startswith("openat2") else "EDQUOT"
            assert over[family] == expected, (family, over)
        made = sorted(n for n in os.listdir(kernel.workspace.root) if n.startswith("o_"))
        assert made == ["o_existing", "o_moved_from", "o_xattr_target"], made  # SETUP's, nothing more
        for out in (under, over):
            for call in name_makers.IO_URING:
                assert out[call] == "ENOSYS", (call, out)
    finally:
        await kernel.shutdown()
        kernel.workspace.remove()


@pytest.mark.parametrize("how", ["normal", "forked"])
async def test_a_helper_that_dies_ends_its_sandbox_instead_of_leaving_calls_waiting(
    how: str, base: KernelFactory, forks: ForkKernelFactory
) -> None:
    kernel = await started(how, base, forks)
    try:
        helper = helper_of(kernel)
        assert (await run(kernel, "open('x', 'w').close()")).error is None
        os.kill(helper, signal.SIGKILL)
        with anyio.fail_after(60):
            while await kernel.is_alive():  # noqa: ASYNC110 - the sandbox ends with its helper
                await anyio.sleep(0.1)
    finally:
        await kernel.shutdown()
        kernel.workspace.remove()


# A long-lived command: creates under the quota, waits, tries again once told to.
LONG_LIVED = (
    "import os, sys\n"
    "os.mkdir('under'); print('made', flush=True)\n"
    "sys.stdin.readline()\n"
    "try:\n    os.mkdir('over'); r = 'made'\nexcept OSError as e:\n    r = e.strerror\n"
    "os.rmdir('under'); print(r, flush=True)\n"
    "sys.stdin.readline()\n"
    "os.mkdir('again'); print('made', flush=True)"
)


@pytest.mark.parametrize("backend", ["bwrap", "none"])
def test_any_long_lived_command_is_held_with_or_without_bubblewrap(backend: str, tmp_path: Path) -> None:
    """``Sandbox.wrap(guard=True)``: the lifeline answers, in front of bubblewrap or (``--sandbox
    none``) as the command's only parent."""
    sandbox = SANDBOX if backend == "bwrap" else Sandbox.detect("none")
    if sandbox.guard is None:
        pytest.skip(f"no creation guard for --sandbox {backend}: {sandbox.guard_problem}")
    uid = sandbox.allocate_uid()
    if uid is not None:
        os.chown(tmp_path, uid, uid)
    cmd = sandbox.wrap(["/usr/bin/python3", "-u", "-c", LONG_LIVED], workspace=tmp_path, uid=uid, guard=True)
    proc = subprocess.Popen(
        cmd.argv, env=cmd.env, cwd=cmd.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "made"
        limits = SessionLimits(CgroupSupport.disabled("not needed here"), sandbox.limits)
        limits.track("command", [proc.pid])
        limits.block_writes()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "Disk quota exceeded"
        assert sorted(os.listdir(tmp_path)) == []  # nothing made, and deleting worked
        limits.allow_writes()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "made"
        assert proc.wait(timeout=30) == 0
        assert sorted(os.listdir(tmp_path)) == ["again"]
    finally:
        proc.kill()
        proc.wait()


def test_the_guard_filter_sends_only_creating_calls_to_the_listener() -> None:
    for machine in ("x86_64", "aarch64"):
        program = seccomp.guard_program(machine)
        assert program is not None and len(program) % 8 == 0
        returns = {
            int.from_bytes(program[i + 4 : i + 8], "little")
            for i in range(0, len(program), 8)
            if int.from_bytes(program[i : i + 2], "little") == 0x06  # BPF_RET | BPF_K
        }
        assert returns == {0x7FFF0000, 0x7FC00000}, returns  # allow, or ask the listener: nothing else
    assert seccomp.guard_program("mips") is None


def test_the_probe_finds_the_guard_working_and_doctor_says_so() -> None:
    program = seccomp.guard_program()
    assert program is not None and creation_guard.probe(program) is None
    assert str(SANDBOX.describe()["creation_guard"]).startswith("active: seccomp user notification")
    assert "neither does a kernel already running" in str(SANDBOX.describe()["quota"])


def test_where_the_guard_is_missing_doctor_names_the_gap() -> None:
    bare = Sandbox("bwrap", "test", seccomp=SANDBOX.seccomp, guard=None, guard_problem="Linux 5.4")
    assert "a kernel already running can still make directories" in bare.quota_enforcement()
    assert "Linux 5.4" in bare.quota_enforcement()
    assert bare.describe()["creation_guard"] == "off: Linux 5.4"
