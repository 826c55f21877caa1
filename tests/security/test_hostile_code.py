"""The hostile-input suite: code that attacks the host or the server fails, and the server keeps serving.

Every case runs against one bwrap-sandboxed server with tight limits, and ends by checking
``healthy()``: the next call answers within a few seconds and the memory block written at
the start is intact. The first line of each test's docstring says what it proves.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.server import create_server
from tests.conftest import error_text, make_settings, structured

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.xdist_group("security"),
    pytest.mark.skipif(Sandbox.detect("auto").backend != "bwrap", reason="bubblewrap is not usable here"),
]

SECRET = "sk-kernmind-test-secret-0123456789"
MEMORY_VALUE = "The user's name is Ada. She prefers terse answers."
# workspace_mb is also the largest file code may write (RLIMIT_FSIZE).
LIMITS = {"memory_mb": 256, "max_processes": 128, "workspace_mb": 64, "timeout": 20}


class Harness:
    def __init__(self, client: Client, data_dir: Path) -> None:
        self.client = client
        self.data_dir = data_dir

    async def run(self, code: str, session: str, **kw: object) -> dict:
        return structured(
            await self.client.call_tool("run_code", {"code": code, "session_id": session, **kw})
        )

    async def healthy(self, session: str) -> None:
        """The server answers the next call and stored memory is intact (the bound is on a hang)."""
        with anyio.fail_after(120):
            out = await self.run("6 * 7", session)
        assert out["results"][0]["text"] == "42"
        block = structured(await self.client.call_tool("memory_read", {"label": "human"}))
        assert block["value"] == MEMORY_VALUE


@pytest.fixture(scope="module")
async def h(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    data = tmp_path_factory.mktemp("sec")
    old = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = SECRET  # the server's environment holds a secret
    try:
        settings = make_settings(data, sandbox="required", pool_size=1, max_sessions=64, **LIMITS)
        async with Client(create_server(settings)) as client:
            structured(
                await client.call_tool("memory_rethink", {"label": "human", "new_memory": MEMORY_VALUE})
            )
            yield Harness(client, data)
    finally:
        if old is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = old


def host_processes_matching(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


# --- resource exhaustion --------------------------------------------------------------


async def test_fork_bomb_is_contained(h: Harness) -> None:
    """A fork bomb hits the process limit, is stopped by the time limit, and leaves nothing behind."""
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    out = await h.run(code, "fork", timeout=4)
    assert out["status"] == "timeout"
    await h.healthy("fork")


async def test_shell_fork_bomb_is_contained(h: Harness) -> None:
    """The classic bash fork bomb runs out of processes instead of taking the machine down."""
    # The bomb's shells run on in the background after the first returns: the cell reads what
    # they say until one of them says its fork failed (the session's process limit), for at most 6 s.
    code = (
        "import os, select, subprocess, sys, time\n"
        "p = subprocess.Popen(['bash', '-c', ':(){ :|:& };:'], stderr=subprocess.PIPE)\n"
        "said, end = b'', time.monotonic() + 6\n"
        "while b'Resource temporarily unavailable' not in said and time.monotonic() < end:\n"
        "    if select.select([p.stderr], [], [], 0.2)[0]:\n"
        "        said += os.read(p.stderr.fileno(), 65536)\n"
        "sys.stderr.write(said.decode(errors='replace')[-2000:])"
    )
    out = await h.run(code, "bashfork", timeout=10)
    assert "Resource temporarily unavailable" in "".join(out["logs"]["stderr"]), out
    await h.healthy("bashfork")


async def test_allocating_ten_times_the_memory_limit_fails(h: Harness) -> None:
    """Asking for 10x the memory limit raises MemoryError; the session survives with its state."""
    await h.run("keep = 'me'", "mem")
    out = await h.run("x = bytearray(10 * 256 * 1024 * 1024)", "mem")
    assert out["status"] == "error" and out["error"]["name"] == "MemoryError"
    assert (await h.run("keep", "mem"))["results"][0]["text"] == "'me'"
    await h.healthy("mem")


async def test_gradual_memory_growth_is_stopped(h: Harness) -> None:
    """Growing memory in small steps stops at the limit too."""
    out = await h.run("chunks = []\nwhile True: chunks.append(bytearray(8 * 1024 * 1024))", "memgrow")
    assert out["status"] == "error" and out["error"]["name"] == "MemoryError"
    await h.healthy("memgrow")


async def test_filling_the_disk_is_stopped_by_the_workspace_quota(h: Harness) -> None:
    """Writing file after file is stopped soon after the workspace quota, not when the disk is full."""
    code = "i = 0\nwhile True:\n    open(f'fill{i}', 'wb').write(b'x' * 4_000_000)\n    i += 1"
    out = await h.run(code, "disk", timeout=15)
    assert out["status"] == "error"
    assert out["error"]["name"] == "WorkspaceQuotaExceeded"
    files = structured(await h.client.call_tool("list_files", {"session_id": "disk"}))["files"]
    assert sum(f["size"] for f in files) < 2 * 1024 * 1024 * 1024
    # Over the quota, code that doesn't grow the directory still runs (so it can clean up).
    slow = await h.run("import time, os\ntime.sleep(1.2)\nlen(os.listdir('.')) > 0", "disk")
    assert slow["status"] == "ok" and slow["results"][0]["text"] == "True"
    await h.run("import glob, os\nfor f in glob.glob('fill*'): os.remove(f)", "disk")
    await h.healthy("disk")


async def test_filling_the_disk_from_another_language_is_stopped_too(h: Harness) -> None:
    """The workspace quota also stops subprocess languages (here bash), not only Python."""
    code = "i=0; while true; do head -c 4000000 /dev/zero > fill$i; i=$((i+1)); done"
    result = await h.client.call_tool(
        "run_code", {"code": code, "language": "bash", "session_id": "disk-sh", "timeout": 15}
    )
    out = structured(result)
    assert out["status"] == "error"
    assert out["error"]["name"] == "WorkspaceQuotaExceeded"
    await h.run("import glob, os\nfor f in glob.glob('fill*'): os.remove(f)", "disk-sh")
    await h.healthy("disk-sh")


async def test_one_huge_file_is_cut_at_the_file_size_limit(h: Harness) -> None:
    """A single file larger than the file-size limit cannot be written."""
    out = await h.run("open('big.bin', 'wb').write(b'x' * 100_000_000)", "bigfile")
    # the file-size limit is the session's quota (--workspace-mb): the write stops at it, and
    # either the kernel refuses the byte past it or the quota's watch stops the call first
    value = out["error"]["value"] if out["status"] == "error" else ""
    assert "File too large" in value or "past its 64 MiB workspace quota" in value, out
    await h.healthy("bigfile")


async def test_too_many_open_files_fails_cleanly(h: Harness) -> None:
    """Opening files without bound hits the open-files limit as an OSError."""
    out = await h.run("fds = [open('/dev/null') for _ in range(100_000)]", "fds")
    assert out["status"] == "error" and "Too many open files" in out["error"]["value"]
    await h.run("for f in fds: f.close()\ndel fds", "fds")
    await h.healthy("fds")


async def test_infinite_loop_is_stopped_by_the_time_limit(h: Harness) -> None:
    """A busy loop is interrupted at the time limit and the session keeps its state."""
    out = await h.run("while True:\n    pass", "loop", timeout=2)
    assert out["status"] == "timeout" and out["state_preserved"] is True
    await h.healthy("loop")


async def test_printing_a_gigabyte_does_not_hurt_the_server(h: Harness) -> None:
    """A gigabyte on stdout is cut inside the kernel: it never crosses to the server, even under a
    256 MiB limit. The kernel keeps the whole output in a file of the working directory, which stops
    at the 64 MiB quota; a call still running when the quota is first sampled (a loaded machine: it
    takes 0.5 s on a quiet one) is stopped for growing the directory past it, as any code would be."""
    out = await h.run(
        "import sys\nfor _ in range(1000): sys.stdout.write('x' * 1_000_000)", "gig", timeout=30
    )
    seen = {k: v for k, v in out.items() if k != "logs"}
    if out["status"] == "error":
        assert out["error"]["name"] == "WorkspaceQuotaExceeded", seen
    else:
        assert out["status"] == "ok" and out["truncated"] is True, seen
    assert len("".join(out["logs"]["stdout"])) <= 60_000
    await h.healthy("gig")


async def test_binary_garbage_and_invalid_utf8_on_stdout(h: Harness) -> None:
    """Raw bytes and invalid UTF-8 on stdout come back as text; nothing breaks."""
    code = "import os, sys\nos.write(1, bytes(range(256)) * 4)\nos.write(1, b'\\xff\\xfe\\xc3\\x28 end\\n')\nprint('done')"
    out = await h.run(code, "garbage")
    assert out["status"] == "ok"
    assert "done" in "".join(out["logs"]["stdout"])
    await h.healthy("garbage")


# --- network -------------------------------------------------------------------------


async def test_cannot_reach_a_listener_on_the_hosts_loopback(h: Harness) -> None:
    """The sandbox has its own network namespace: the host's 127.0.0.1 is out of reach."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)"
        out = await h.run(code, "net-lo")
        assert out["status"] == "error"
        assert out["error"]["name"] in ("ConnectionRefusedError", "OSError", "TimeoutError")
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    await h.healthy("net-lo")


async def test_cannot_reach_an_outside_address(h: Harness) -> None:
    """Only a loopback interface exists inside, so the host's external address is unreachable."""
    outside = next(
        (
            a
            for a in subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
            if "." in a
        ),
        "192.0.2.2",
    )
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        code = (
            "import socket\n"
            "names = [n for _, n in socket.if_nameindex()]\n"
            f"try:\n    socket.create_connection(({outside!r}, {port}), timeout=3)\n    reached = True\n"
            "except OSError as e:\n    reached = str(e)\n"
            "names, reached"
        )
        out = await h.run(code, "net-out")
        text = out["results"][0]["text"]
        assert text.startswith("(['lo'],"), text
        assert "unreachable" in text.lower()
    finally:
        listener.close()
    await h.healthy("net-out")


# --- reading and writing outside the workspace ------------------------------------------


async def test_cannot_read_the_hosts_home_or_the_memory_database(h: Harness) -> None:
    """Neither $HOME of the server user, its data directory nor the SQLite database are visible."""
    db = str(h.data_dir / "kernmind.db")
    code = (
        "import os\n"
        f"checks = [os.path.exists({db!r}), os.path.exists({str(h.data_dir)!r}), os.path.exists('/root/.bashrc'),\n"
        f"          os.path.exists({str(Path.home())!r} + '/.bashrc'), os.path.expanduser('~')]\n"
        "checks"
    )
    out = await h.run(code, "read-host")
    assert out["results"][0]["text"] == "[False, False, False, False, '/workspace']"
    await h.healthy("read-host")


async def test_cannot_read_shadow_or_other_root_files(h: Harness) -> None:
    """System files readable only by root stay unreadable (code runs as an unprivileged uid)."""
    out = await h.run("open('/etc/shadow').read()", "shadow")
    assert out["status"] == "error" and out["error"]["name"] in ("PermissionError", "FileNotFoundError")
    await h.healthy("shadow")


async def test_server_environment_is_invisible_including_proc(h: Harness) -> None:
    """The server's variables (an API key) are in neither os.environ nor any /proc/*/environ."""
    code = (
        "import os\n"
        "leaks = [k for k, v in os.environ.items() if 'sk-kernmind' in v]\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            if b'sk-kernmind' in open(f'/proc/{pid}/environ', 'rb').read(): leaks.append(pid)\n"
        "        except OSError:\n"
        "            pass\n"
        "leaks, sorted(os.environ)"
    )
    out = await h.run(code, "env")
    text = out["results"][0]["text"]
    assert text.startswith("([],"), text
    assert "OPENAI_API_KEY" not in text
    assert os.environ["OPENAI_API_KEY"] == SECRET  # the server really had it
    await h.healthy("env")


async def test_only_the_sandboxs_own_processes_are_visible(h: Harness) -> None:
    """A private pid namespace: the server and other host processes cannot be seen."""
    out = await h.run("import os\nlen([p for p in os.listdir('/proc') if p.isdigit()])", "pids")
    assert int(out["results"][0]["text"]) < 10
    await h.healthy("pids")


async def test_cannot_write_outside_the_workspace(h: Harness) -> None:
    """System directories are read-only; /tmp is private to the sandbox and vanishes with it."""
    marker = f"kernmind-tmp-{os.getpid()}"
    code = (
        "results = []\n"
        "for path in ['/usr/evil', '/etc/evil', '/evil', '/root/evil']:\n"
        "    try:\n        open(path, 'w').write('x'); results.append(path)\n"
        "    except OSError:\n        pass\n"
        f"open('/tmp/{marker}', 'w').write('x')\n"
        "results"
    )
    out = await h.run(code, "write-out")
    assert out["results"][0]["text"] == "[]"
    assert not Path(f"/tmp/{marker}").exists()
    assert not Path("/usr/evil").exists() and not Path("/etc/evil").exists()
    await h.healthy("write-out")


async def test_cannot_become_root(h: Harness) -> None:
    """Code runs as an unprivileged uid and cannot switch to root."""
    out = await h.run(
        "import os\nuid = os.getuid()\ntry:\n    os.setuid(0)\nexcept OSError as e:\n    err = e.errno\nuid != 0, err",
        "root",
    )
    assert out["results"][0]["text"] == "(True, 1)"
    await h.healthy("root")


# --- processes ------------------------------------------------------------------------


async def test_killing_the_parent_process(h: Harness) -> None:
    """Killing the kernel's parent ends at most this session's interpreter (it says so); the server
    is untouched."""
    out = await h.run(
        "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError as e:\n    print(e.errno)",
        "kill-parent",
    )
    assert out["status"] == "ok" or out["error"]["name"] == "KernelDied", out
    await h.healthy("kill-parent")


async def test_killing_every_visible_process(h: Harness) -> None:
    """kill(-1) reaches only the sandbox's own processes: its children die, the host and server do not."""
    code = (
        "import os, signal, subprocess, time\n"
        "kids = [subprocess.Popen(['sleep', '300']) for _ in range(3)]\n"
        "try:\n    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    pass\n"
        "[k.wait(timeout=30) for k in kids]"
    )
    out = await h.run(code, "kill-all")
    if out["status"] == "ok":  # the kernel itself is spared by kill(-1); its children are not
        assert out["results"][0]["text"] == "[-9, -9, -9]"
    else:
        assert out["error"]["name"] == "KernelDied"
    await h.healthy("kill-all")


async def until_running(pattern: str, seconds: float = 30) -> bool:
    """Whether a host process matching ``pattern`` appears within ``seconds`` (a daemon's fork)."""
    with anyio.move_on_after(seconds):
        while not host_processes_matching(pattern):  # noqa: ASYNC110 - polling /proc
            await anyio.sleep(0.02)
    return bool(host_processes_matching(pattern))


async def test_a_daemon_does_not_outlive_its_session(h: Harness) -> None:
    """A double-forked, setsid daemon dies when its session is closed."""
    marker = "987651"
    code = f"import subprocess\nsubprocess.Popen(['setsid', 'sleep', '{marker}'], start_new_session=True)"
    await h.run(code, "daemon")
    assert await until_running(f"sleep\x00{marker}"), "the daemon did not start"
    structured(await h.client.call_tool("close_session", {"session_id": "daemon"}))
    for _ in range(50):
        if not host_processes_matching(f"sleep\x00{marker}"):
            break
        await anyio.sleep(0.1)
    assert host_processes_matching(f"sleep\x00{marker}") == []
    await h.healthy("daemon2")


async def test_a_daemon_does_not_outlive_the_server(tmp_path: Path) -> None:
    """Killing the server with SIGKILL takes every sandboxed process with it (--die-with-parent)."""
    marker = "987652"
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "kernmind",
            "serve",
            "--data-dir",
            str(tmp_path),
            "--pool-size",
            "0",
            "--sandbox",
            "required",
        ],
    )
    server_pid = None
    async with Client(params) as client:
        code = f"import subprocess\nsubprocess.Popen(['setsid', 'sleep', '{marker}'], start_new_session=True)"
        structured(await client.call_tool("run_code", {"code": code}))
        assert await until_running(f"sleep\x00{marker}"), "the daemon did not start"
        for pid in host_processes_matching("kernmind\x00serve"):
            if str(tmp_path) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                server_pid = pid
        assert server_pid is not None
        os.kill(server_pid, 9)
        for _ in range(50):
            if not host_processes_matching(f"sleep\x00{marker}"):
                break
            await anyio.sleep(0.1)
        assert host_processes_matching(f"sleep\x00{marker}") == []


# --- files and sessions --------------------------------------------------------------------


async def test_path_traversal_through_upload_and_download_is_refused(h: Harness) -> None:
    """'..', absolute paths and NUL bytes are refused by the file tools with a clear message."""
    for bad in ["../escape.txt", "/etc/passwd", "a/../../escape.txt", "nul\x00byte"]:
        msg = error_text(
            await h.client.call_tool("upload_file", {"path": bad, "content": "x", "session_id": "paths"})
        )
        assert "working directory" in msg or "NUL" in msg
        msg = error_text(await h.client.call_tool("download_file", {"path": bad, "session_id": "paths"}))
        assert "working directory" in msg or "NUL" in msg
    assert not list(h.data_dir.glob("**/escape.txt"))
    await h.healthy("paths")


async def test_symlinks_planted_by_code_cannot_redirect_the_file_tools(h: Harness) -> None:
    """Links made inside the sandbox to host paths are not followed by download_file/upload_file."""
    db = str(h.data_dir / "kernmind.db")
    await h.run(
        f"import os\nos.symlink('/etc/passwd', 'passwd')\nos.symlink({db!r}, 'db')\nos.symlink('/etc', 'etc')",
        "links",
    )
    for name in ["passwd", "db"]:
        msg = error_text(await h.client.call_tool("download_file", {"path": name, "session_id": "links"}))
        assert "symlink" in msg
    msg = error_text(
        await h.client.call_tool(
            "upload_file", {"path": "etc/evil.conf", "content": "x", "session_id": "links"}
        )
    )
    assert "outside" in msg
    assert not Path("/etc/evil.conf").exists()
    await h.healthy("links")


async def test_one_session_cannot_read_anothers_files(h: Harness) -> None:
    """Each session sees only its own workspace, even knowing the other's host path."""
    await h.run("open('private.txt', 'w').write('alice only')", "alice")
    others = list(h.data_dir.glob("**/private.txt"))  # the session lives under the data dir
    assert len(others) == 1
    code = (
        "import os, glob\n"
        "roots = ['/workspace', '/tmp', '/root', '/home', '/var', '/srv', '/mnt', '/opt', '/run']\n"
        "found = [p for r in roots for p in glob.glob(r + '/**/private.txt', recursive=True)]\n"
        f"os.path.exists({str(others[0])!r}), found"
    )
    out = await h.run(code, "mallory")
    assert out["status"] == "ok", out.get("error")
    assert out["results"][0]["text"] == "(False, [])"
    await h.healthy("mallory")


async def test_binary_upload_round_trips_and_is_confined(h: Harness) -> None:
    """A binary upload lands in the session's directory only, and downloads back as base64."""
    data = bytes(range(256))
    structured(
        await h.client.call_tool(
            "upload_file",
            {
                "path": "blob.bin",
                "content": base64.b64encode(data).decode(),
                "encoding": "base64",
                "session_id": "bin",
            },
        )
    )
    out = await h.run("open('blob.bin','rb').read() == bytes(range(256))", "bin")
    assert out["results"][0]["text"] == "True"
    down = structured(await h.client.call_tool("download_file", {"path": "blob.bin", "session_id": "bin"}))
    assert down["encoding"] == "base64" and base64.b64decode(down["content"]) == data
    await h.healthy("bin")
