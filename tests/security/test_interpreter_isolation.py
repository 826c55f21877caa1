"""What a fresh interpreter promises: nothing of another interpreter reaches it.

The contract every way of making a fresh Python interpreter must keep (a new sandboxed
kernel per interpreter today, a fork of a pre-warmed template tomorrow), tested on the real
server through a real MCP client. A fresh interpreter is made in three ways, and each
property is checked for each way that it applies to:

- ``stateless``: every call on a ``--stateless`` server;
- ``reset``: ``reset: true`` on a named session (its files stay, by design);
- ``new-session``: a call in another named session.

**Later interpreters** (``earlier`` pollutes everything it can reach, then a later fresh
interpreter looks): globals, patched modules and builtins, environment, process attributes,
lowered limits, files in ``/tmp``, ``/dev/shm`` and the workspace, open descriptors and
background processes do not reach it.

**Each interpreter**: an unprivileged uid of its own with no capabilities and
``no_new_privs`` (when the server runs as root), the configured rlimits, a private
size-limited ``/tmp`` and ``/dev/shm``, its workspace at ``/workspace``.

**Siblings** (two interpreters alive at once, the first one held open until the second
has looked): they cannot see or signal each other's processes, share no loopback or
abstract socket, no SysV or POSIX IPC objects, no ``/tmp``, ``/dev/shm`` or workspace.

The servers use ``pool_size=0`` so that every later interpreter is made after the earlier
one has done its damage.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.rlimits import Limits
from kernmind.server import create_server
from tests.conftest import make_settings, structured

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.xdist_group("isolation"),
    pytest.mark.skipif(Sandbox.detect("auto").backend != "bwrap", reason="bubblewrap is not usable here"),
]

AS_ROOT = os.geteuid() == 0
LIMITS = {
    "memory_mb": 1536,
    "max_processes": 200,
    "workspace_mb": 256,  # also the largest file (RLIMIT_FSIZE)
}
TMP_BYTES = Limits().tmp_mb * 1024 * 1024
MODES = ["stateless", "reset", "new-session"]

Run = Callable[[str], Awaitable[dict[str, Any]]]


# --- code that runs inside the interpreters ------------------------------------------------

# Random numbers from the interpreter's generators (numpy's too, where installed).
DRAWS = """\
def draws():
    import random
    out = [random.random()]
    try:
        import numpy
        out.append(float(numpy.random.random()))
    except ImportError:
        pass
    return out
"""

POLLUTE = """\
import builtins, json, math, os, resource, signal, statistics, subprocess, sys
token = {token!r}
{draws}
facts = {{"uid": os.getuid(), "draws": draws()}}
# globals, patched modules and builtins, the import path, a fake module
iso_global = token
statistics.mean = lambda *a, **k: "patched"
math.pi = 3
builtins.iso_builtin = token
sys.modules["iso_fake_module"] = type(sys)("iso_fake_module")
sys.path.append("/iso-" + token)
# environment and process attributes
os.environ["ISO_ENV"] = token
os.putenv("ISO_PUTENV", token)
os.umask(0o077)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))
resource.setrlimit(resource.RLIMIT_DATA, (512 * 2**20, 512 * 2**20))
# files in every writable place
for place in ("/tmp", "/dev/shm", "/workspace"):
    with open(f"{{place}}/iso-{{token}}", "w") as fh:
        fh.write(token)
# descriptors left open (and inheritable)
held = open("/workspace/iso-fd-" + token, "w")
r, w = os.pipe()
for fd in (held.fileno(), r, w):
    os.set_inheritable(fd, True)
facts["fds"] = [os.readlink(f"/proc/self/fd/{{fd}}") for fd in (held.fileno(), r, w)]
# a background process that ignores hang-ups and terminations, in its own session
subprocess.Popen(
    ["sh", "-c", "trap '' HUP INT TERM; while :; do sleep 1; done", "iso-bg-" + token],
    start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
os.chdir("/tmp")
print(json.dumps(facts))
"""

OBSERVE = """\
import builtins, json, math, os, resource, signal, statistics, sys
token = {token!r}
{draws}
def listing(path):
    return sorted(os.listdir(path))
def fd_targets():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{{fd}}"))
        except OSError:
            pass
    return out
def status():
    keep = ("Uid", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")
    return {{k: v.split()[0] for k, v in (l.split(":", 1) for l in open("/proc/self/status")) if k in keep}}
def mount(point):
    found = None
    for line in open("/proc/self/mounts"):
        dev, where, fstype, opts = line.split()[:4]
        if where == point:
            found = {{"fstype": fstype, "bytes": os.statvfs(point).f_blocks * os.statvfs(point).f_frsize}}
    return found
mask = os.umask(0o022); os.umask(mask)
names = ("RLIMIT_DATA", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")
print(json.dumps({{
    "draws": draws(),
    "global": "iso_global" in globals(),
    "mean": statistics.mean([1, 2]),
    "math_pi": math.pi,
    "builtin": hasattr(builtins, "iso_builtin"),
    "fake_module": "iso_fake_module" in sys.modules,
    "sys_path": [p for p in sys.path if "iso-" in p],
    "env": [k for k in os.environ if k.startswith("ISO_")],
    "umask": mask,
    "sigusr1_default": signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
    "cwd": os.getcwd(),
    "home": os.environ.get("HOME"),
    "rlimits": {{n: resource.getrlimit(getattr(resource, n)) for n in names}},
    "tmp": listing("/tmp"), "dev_shm": listing("/dev/shm"), "workspace": listing("/workspace"),
    "fds": fd_targets(),
    "status": status(),
    "mounts": {{p: mount(p) for p in ("/tmp", "/dev/shm")}},
}}))
"""

# A sibling that sets up everything another interpreter might reach, reports it, and stays
# alive until the test releases it (by creating a file in its workspace from the host).
SIBLING = """\
import ctypes, json, os, socket, subprocess, time
token = {token!r}
facts = {{"uid": os.getuid()}}
proc = subprocess.Popen(["sh", "-c", "while :; do sleep 1; done", "iso-sib-" + token], start_new_session=True)
for place in ("/tmp", "/dev/shm", "/workspace"):
    open(f"{{place}}/sib-{{token}}", "w").write(token)
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen()
facts["port"] = tcp.getsockname()[1]
abstract = socket.socket(socket.AF_UNIX)
abstract.bind("\\0iso-" + token)
abstract.listen()
# Positive controls: the sibling itself can reach both listeners.
socket.create_connection(("127.0.0.1", facts["port"]), timeout=5).close()
probe = socket.socket(socket.AF_UNIX); probe.connect("\\0iso-" + token); probe.close()
libc = ctypes.CDLL(None, use_errno=True)
facts["sysv_key"] = 0x150000 + os.getpid() % 0xFFFF
facts["sysv_id"] = libc.shmget(facts["sysv_key"], 4096, 0o1000 | 0o666)  # IPC_CREAT
open(f"ready-{{token}}", "w").write(json.dumps(facts))
deadline = time.monotonic() + 60
while not os.path.exists(f"release-{{token}}") and time.monotonic() < deadline:
    time.sleep(0.05)
proc.kill()
libc.shmctl(facts["sysv_id"], 0, None)  # IPC_RMID
print("released" if os.path.exists(f"release-{{token}}") else "not released")
"""

LOOK_AT_SIBLING = """\
import ctypes, json, os, socket
token, port, sysv_key, host_workspace = {token!r}, {port}, {sysv_key}, {host_workspace!r}
def reachable(family, address):
    s = socket.socket(family)
    s.settimeout(3)
    try:
        s.connect(address)
        return True
    except OSError:
        return False
    finally:
        s.close()
cmdlines = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmdlines.append(open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace"))
        except OSError:
            pass
libc = ctypes.CDLL(None, use_errno=True)
print(json.dumps({{
    "uid": os.getuid(),
    "sees_process": any(token in c for c in cmdlines),
    "tcp": reachable(socket.AF_INET, ("127.0.0.1", port)),
    "abstract": reachable(socket.AF_UNIX, "\\0iso-" + token),
    "sysv": libc.shmget(sysv_key, 0, 0) != -1,
    "files": [p for p in ("/tmp", "/dev/shm", "/workspace") if os.path.exists(f"{{p}}/sib-{{token}}")],
    "host_workspace": os.path.exists(host_workspace),
}}))
"""

SIGNAL_SIBLING = """\
import os, signal
outcomes = []
for target in {targets}:
    try:
        os.kill(target, signal.SIGKILL)
        outcomes.append("sent")
    except OSError as e:
        outcomes.append(e.errno)
print(outcomes)
try:
    os.kill(-1, signal.SIGKILL)  # everything this interpreter may signal
except ProcessLookupError:
    pass
"""


def json_stdout(out: dict[str, Any]) -> dict[str, Any]:
    assert out["status"] == "ok", out.get("error")
    return json.loads("".join(out["logs"]["stdout"]).strip().splitlines()[-1])


def host_processes(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                continue
    return found


async def wait_until_gone(marker: str) -> list[int]:
    """Processes still matching ``marker`` after up to 15 s (released kernels stop in the background)."""
    for _ in range(150):
        if not host_processes(marker):
            return []
        await anyio.sleep(0.1)
    return host_processes(marker)


# --- servers and the three ways to a fresh interpreter ---------------------------------------


@dataclass
class Server:
    client: Client
    data_dir: Path

    async def run(self, code: str, **kw: object) -> dict[str, Any]:
        return structured(await self.client.call_tool("run_code", {"code": code, "timeout": 90, **kw}))


@pytest.fixture(scope="module")
async def stateless_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    data = tmp_path_factory.mktemp("iso-stateless")
    settings = make_settings(data, sandbox="required", stateless=True, pool_size=0, **LIMITS)
    async with Client(create_server(settings)) as client:
        yield Server(client, data)


@pytest.fixture(scope="module")
async def session_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    data = tmp_path_factory.mktemp("iso-sessions")
    settings = make_settings(data, sandbox="required", pool_size=0, max_sessions=64, **LIMITS)
    async with Client(create_server(settings)) as client:
        yield Server(client, data)


@dataclass
class Pair:
    """Two interpreters made one after the other in one of the three ways."""

    mode: str
    server: Server
    earlier: Run
    later: Run
    earlier_session: str | None


def pair_for(mode: str, stateless: Server, sessions: Server) -> Pair:
    tag = uuid.uuid4().hex[:8]
    if mode == "stateless":
        return Pair(mode, stateless, stateless.run, stateless.run, None)
    first = f"iso-{tag}"
    second = first if mode == "reset" else f"iso-{tag}-other"

    async def earlier(code: str) -> dict[str, Any]:
        return await sessions.run(code, session_id=first)

    async def later(code: str) -> dict[str, Any]:
        return await sessions.run(code, session_id=second, reset=mode == "reset")

    return Pair(mode, sessions, earlier, later, first)


@dataclass
class Aftermath:
    """What the earlier interpreter left, and what the later one saw."""

    token: str
    mode: str
    earlier: dict[str, Any]
    later: dict[str, Any]


@pytest.fixture(scope="module", params=MODES)
async def aftermath(
    request: pytest.FixtureRequest, stateless_server: Server, session_server: Server
) -> Aftermath:
    """Run the polluting interpreter and then a fresh one (once per mode for the module)."""
    mode: str = request.param
    pair = pair_for(mode, stateless_server, session_server)
    token = uuid.uuid4().hex[:12]
    earlier = json_stdout(await pair.earlier(POLLUTE.format(token=token, draws=DRAWS)))
    later = json_stdout(await pair.later(OBSERVE.format(token=token, draws=DRAWS)))
    if pair.earlier_session is not None and mode == "new-session":
        await pair.server.client.call_tool("close_session", {"session_id": pair.earlier_session})
    return Aftermath(token, mode, earlier, later)


# --- nothing reaches a later interpreter ------------------------------------------------------


async def test_random_generators_are_not_shared_with_a_later_interpreter(aftermath: Aftermath) -> None:
    """random and numpy.random are seeded afresh: a later interpreter does not repeat the earlier draws."""
    earlier, later = aftermath.earlier["draws"], aftermath.later["draws"]
    assert len(earlier) == len(later) >= 1
    assert all(a != b for a, b in zip(earlier, later, strict=True))


async def test_globals_do_not_reach_a_later_interpreter(aftermath: Aftermath) -> None:
    assert aftermath.later["global"] is False


async def test_patched_modules_and_builtins_do_not_reach_a_later_interpreter(aftermath: Aftermath) -> None:
    """statistics.mean and math.pi replaced, a builtin added, a fake module and a path entry inserted."""
    seen = aftermath.later
    assert (seen["mean"], seen["math_pi"]) == (1.5, 3.141592653589793)
    assert (seen["builtin"], seen["fake_module"], seen["sys_path"]) == (False, False, [])


async def test_environment_changes_do_not_reach_a_later_interpreter(aftermath: Aftermath) -> None:
    assert aftermath.later["env"] == []


async def test_process_attributes_do_not_reach_a_later_interpreter(aftermath: Aftermath) -> None:
    """Working directory, umask and signal dispositions start from their defaults."""
    seen = aftermath.later
    assert (seen["cwd"], seen["umask"], seen["sigusr1_default"]) == ("/workspace", 0o022, True)


async def test_lowered_limits_do_not_reach_a_later_interpreter(aftermath: Aftermath) -> None:
    limits = aftermath.later["rlimits"]
    assert limits["RLIMIT_CPU"] == [Limits().cpu_seconds] * 2
    assert limits["RLIMIT_DATA"] == [LIMITS["memory_mb"] * 2**20] * 2


async def test_tmp_and_dev_shm_files_do_not_reach_a_later_interpreter(aftermath: Aftermath) -> None:
    left = f"iso-{aftermath.token}"
    assert left not in aftermath.later["tmp"]
    assert left not in aftermath.later["dev_shm"]


async def test_workspace_files_do_not_reach_a_later_interpreter_except_across_reset(
    aftermath: Aftermath,
) -> None:
    """A stateless call and a new session start with an empty workspace; reset keeps the session's files."""
    if aftermath.mode == "reset":
        assert f"iso-{aftermath.token}" in aftermath.later["workspace"]
    else:
        assert aftermath.later["workspace"] == []


async def test_open_descriptors_do_not_reach_a_later_interpreter(aftermath: Aftermath) -> None:
    opened = aftermath.earlier["fds"]
    assert len(opened) == 3
    assert not set(opened) & set(aftermath.later["fds"])


async def test_background_processes_do_not_outlive_their_interpreter(aftermath: Aftermath) -> None:
    """A detached, signal-ignoring process ends with its interpreter (for a new session: when the
    earlier session is closed)."""
    assert await wait_until_gone(f"iso-bg-{aftermath.token}") == []


# --- each interpreter ---------------------------------------------------------------------------


@pytest.mark.skipif(not AS_ROOT, reason="as a normal user every sandbox runs as that user")
async def test_each_interpreter_runs_as_its_own_unprivileged_uid(aftermath: Aftermath) -> None:
    earlier, later = aftermath.earlier["uid"], int(aftermath.later["status"]["Uid"])
    assert later != 0 and earlier != 0
    assert later != earlier


async def test_each_interpreter_has_no_capabilities_and_cannot_gain_privileges(aftermath: Aftermath) -> None:
    status = aftermath.later["status"]
    assert {k: int(status[k], 16) for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb")} == dict.fromkeys(
        ("CapPrm", "CapEff", "CapBnd", "CapAmb"), 0
    )
    assert status["NoNewPrivs"] == "1"


async def test_each_interpreter_has_the_configured_limits(aftermath: Aftermath) -> None:
    mib = 2**20
    assert aftermath.later["rlimits"] == {
        "RLIMIT_DATA": [LIMITS["memory_mb"] * mib] * 2,
        "RLIMIT_CPU": [Limits().cpu_seconds] * 2,
        "RLIMIT_NPROC": [LIMITS["max_processes"]] * 2,
        "RLIMIT_FSIZE": [LIMITS["workspace_mb"] * mib] * 2,
        "RLIMIT_NOFILE": [Limits().max_open_files] * 2,
        "RLIMIT_CORE": [0, 0],
    }


async def test_each_interpreter_has_a_private_size_limited_tmp_and_dev_shm(aftermath: Aftermath) -> None:
    """Both are tmpfs mounts of its own, no larger than the sandbox's tmp size, and writable
    (the earlier interpreter wrote a file into each)."""
    for point in ("/tmp", "/dev/shm"):
        mount = aftermath.later["mounts"][point]
        assert mount["fstype"] == "tmpfs"
        assert 0 < mount["bytes"] <= TMP_BYTES


async def test_each_interpreter_works_in_its_workspace(aftermath: Aftermath) -> None:
    assert (aftermath.later["cwd"], aftermath.later["home"]) == ("/workspace", "/workspace")


# --- siblings alive at the same time -------------------------------------------------------------


@dataclass
class Sibling:
    token: str
    facts: dict[str, Any]
    host_workspace: Path


@contextlib.asynccontextmanager
async def held_sibling(server: Server, run: Run) -> AsyncIterator[Sibling]:
    """An interpreter that has set up its listeners, files and processes, held open until the
    body is done."""
    token = uuid.uuid4().hex[:12]
    outcome: dict[str, Any] = {}

    async def hold() -> None:
        outcome["out"] = await run(SIBLING.format(token=token))

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        ready = None
        with anyio.fail_after(120):
            while ready is None and "out" not in outcome:
                ready = next(server.data_dir.glob(f"**/ready-{token}"), None)
                await anyio.sleep(0.05)
        assert ready is not None, f"the sibling never got ready: {outcome.get('out')}"
        try:
            yield Sibling(token, json.loads(ready.read_text()), ready.parent)
        finally:
            (ready.parent / f"release-{token}").touch()
    assert "".join(outcome["out"]["logs"]["stdout"]).strip() == "released", outcome["out"]


@dataclass
class Sighting:
    """What an interpreter saw of a sibling alive beside it."""

    sibling: Sibling
    seen: dict[str, Any]


@pytest.fixture(scope="module", params=["stateless", "new-session"])
async def sighting(
    request: pytest.FixtureRequest, stateless_server: Server, session_server: Server
) -> Sighting:
    """Hold a sibling open and look at it from a second interpreter (once per mode for the module)."""
    pair = pair_for(request.param, stateless_server, session_server)
    async with held_sibling(pair.server, pair.earlier) as sib:
        code = LOOK_AT_SIBLING.format(
            token=sib.token,
            port=sib.facts["port"],
            sysv_key=sib.facts["sysv_key"],
            host_workspace=str(sib.host_workspace),
        )
        return Sighting(sib, json_stdout(await pair.later(code)))


async def test_siblings_cannot_see_each_others_processes(sighting: Sighting) -> None:
    assert sighting.seen["sees_process"] is False


async def test_siblings_share_no_loopback_or_abstract_socket(sighting: Sighting) -> None:
    """A listener on 127.0.0.1 and one on an abstract unix address are invisible next door."""
    assert (sighting.seen["tcp"], sighting.seen["abstract"]) == (False, False)


async def test_siblings_share_no_ipc_objects(sighting: Sighting) -> None:
    """A SysV shared-memory segment and a POSIX one (/dev/shm) stay with their creator."""
    assert sighting.sibling.facts["sysv_id"] >= 0
    assert sighting.seen["sysv"] is False
    assert "/dev/shm" not in sighting.seen["files"]


async def test_siblings_share_no_tmp_or_workspace(sighting: Sighting) -> None:
    assert sighting.seen["files"] == []
    assert sighting.seen["host_workspace"] is False  # the sibling's directory is not even reachable by path


@pytest.mark.skipif(not AS_ROOT, reason="as a normal user every sandbox runs as that user")
async def test_siblings_run_as_different_uids(sighting: Sighting) -> None:
    assert sighting.seen["uid"] != sighting.sibling.facts["uid"]


@pytest.mark.parametrize("mode", ["stateless", "new-session"])
async def test_siblings_cannot_signal_each_other(
    mode: str, stateless_server: Server, session_server: Server
) -> None:
    """SIGKILL aimed at a sibling's host pids, then kill(-1): the sibling's processes live on."""
    pair = pair_for(mode, stateless_server, session_server)
    async with held_sibling(pair.server, pair.earlier) as sib:
        victims = host_processes(f"iso-sib-{sib.token}")
        assert len(victims) == 1
        out = await pair.later(SIGNAL_SIBLING.format(targets=victims))
        # kill(-1) may take the signalling interpreter itself down; either way it answered.
        assert out["status"] == "ok" or out["error"]["name"] == "KernelDied"
        assert host_processes(f"iso-sib-{sib.token}") == victims
        os.kill(victims[0], 0)  # still there
