"""One principal cannot take more than its session's share: memory, processes, disk (issue 23).

A real `kernmind serve --transport http --tokens FILE` with two principals, alice and bob,
bubblewrap sandboxes and tight limits (`--memory-mb 300 --workspace-mb 60 --max-processes 64`).
Alice attacks; bob (another principal, on the same server) keeps working meanwhile. Where the
host lets the server make control groups (root in CI), a session's processes and its
in-memory `/tmp` and `/dev/shm` share one memory limit and one process limit; a second
server with `--cgroups none` shows the fallback (per-process limits only) and that the
workspace quota holds without groups too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import CgroupSupport
from kernmind.tokens_file import TokenFile
from tests.conftest import structured
from tests.execution.sandbox import name_makers
from tests.transport.procs import HttpServer, http_client, start_http, wait_until

SUPPORT = CgroupSupport.detect()
GROUPS = SUPPORT.active
SUPPORT.close()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.xdist_group("limits"),
    pytest.mark.skipif(Sandbox.detect("auto").backend != "bwrap", reason="bubblewrap is not usable here"),
]
needs_groups = pytest.mark.skipif(not GROUPS, reason=f"no control groups here: {SUPPORT.reason}")

MIB = 2**20
LIMITS = [
    *("--memory-mb", "300", "--workspace-mb", "60", "--workspace-files", "20000"),
    *("--max-processes", "64", "--timeout", "60"),
]
# No preloads: with 300 MiB the fork-server template would drop them anyway (they use over half).
FLAGS = ["--sandbox", "required", "--preload", "[]", "--embedding-model", "none", *LIMITS]


class Deployment:
    def __init__(self, server: HttpServer, tokens: dict[str, str]) -> None:
        self.server = server
        self.tokens = tokens

    def client(self, who: str) -> Client:
        return http_client(self.server.url, {"Authorization": f"Bearer {self.tokens[who]}"}, "auto")


def deploy(tmp: Path, *extra: str) -> Deployment:
    tokens_file = tmp / "tokens.json"
    file = TokenFile(tokens_file)
    tokens = {name: file.add(name, []) for name in ("alice", "bob")}
    return Deployment(start_http(tmp, "--tokens", str(tokens_file), *FLAGS, *extra), tokens)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = deploy(tmp_path_factory.mktemp("limits"))
    try:
        yield d
    finally:
        d.server.stop()
        # The server removed every control group it made.
        assert wait_until(lambda: not server_group_dirs(d.server.proc.pid), 10), server_group_dirs(
            d.server.proc.pid
        )


@pytest.fixture(scope="module")
def fallback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = deploy(tmp_path_factory.mktemp("limits-none"), "--cgroups", "none", "--no-fork-server")
    try:
        yield d
    finally:
        d.server.stop()


@pytest.fixture
async def alice(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("alice") as c:
        yield c


@pytest.fixture
async def bob(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("bob") as c:
        yield c


async def run(client: Client, code: str, session: str, language: str = "python", **kw: Any) -> dict[str, Any]:
    args = {"code": code, "session_id": session, "language": language, **kw}
    return structured(await client.call_tool("run_code", args))


async def bob_keeps_working(bob: Client, stop: anyio.Event, session: str = "bob-work") -> list[float]:
    """Bob's calls while alice attacks: each must answer right (returns their durations)."""
    times = []
    n = 0
    while not stop.is_set():
        n += 1
        started = time.monotonic()
        out = await run(bob, f"{n} * 2", session)
        times.append(time.monotonic() - started)
        assert out["status"] == "ok" and out["results"][0]["text"] == str(n * 2), out
        await anyio.sleep(0.2)
    return times


async def while_bob_works(bob: Client, attack: Any) -> Any:
    """Run ``attack()`` while bob makes calls; bob's calls all answer; returns the attack's result."""
    stop = anyio.Event()
    result: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def attack_then_stop() -> None:
            try:
                result.append(await attack())
            finally:
                stop.set()

        tg.start_soon(bob_keeps_working, bob, stop)
        tg.start_soon(attack_then_stop)
    return result[0]


def server_group_dirs(server_pid: int) -> list[str]:
    """The control-group directories a server made (``kernmind-<pid>-…``) that still exist."""
    found = []
    for root in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        for dirpath, dirnames, _ in os.walk(root):
            found += [f"{dirpath}/{d}" for d in dirnames if d.startswith(f"kernmind-{server_pid}-")]
            if dirpath.count("/") > 6:
                dirnames.clear()
    return found


def oom_kills_in_groups(server_pid: int) -> int:
    """Processes the out-of-memory killer stopped in the server's control groups (what the server
    itself reads before a call to say a session was stopped between calls)."""
    kills = 0
    for top in server_group_dirs(server_pid):
        for dirpath, _, filenames in os.walk(top):
            for name in ("memory.events", "memory.oom_control"):
                if name in filenames:
                    try:
                        text = Path(dirpath, name).read_text()
                    except OSError:
                        continue
                    kills += sum(
                        int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")
                    )
    return kills


def processes_in_groups(server_pid: int) -> list[int]:
    """Live processes inside the server's control groups."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            membership = (entry / "cgroup").read_text()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"/kernmind-{server_pid}-" in membership and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def stopped_for_memory(out: dict[str, Any]) -> bool:
    error = out.get("error") or {}
    return (
        out["status"] == "error"
        and error.get("name") == "MemoryLimitExceeded"
        and "more than its 300 MiB memory limit (--memory-mb) and was stopped" in error.get("value", "")
    )


# --- memory: one limit for the session's processes and its in-memory files ------------------------

ATTACKS = {
    # 45 files of 10 MiB: under the 512 MiB size of the tmpfs, over the session's 300 MiB.
    "dev_shm": "for i in range(45):\n    open(f'/dev/shm/f{i}', 'wb').write(b'x' * 10 * 2**20)",
    "tmp": "for i in range(45):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * 10 * 2**20)",
    # Two children of 200 MiB each: each under RLIMIT_DATA, together over the session's limit.
    "child_processes": (
        "import subprocess, sys\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'b = bytearray(200 * 2**20); import time; time.sleep(20)'])"
        " for _ in range(2)]\n"
        "[k.wait() for k in kids]"
    ),
    # The kernel's own data plus files in /dev/shm.
    "kernel_and_dev_shm": (
        "keep = bytearray(150 * 2**20)\nfor i in range(20):\n    open(f'/dev/shm/g{i}', 'wb').write(b'x' * 10 * 2**20)"
    ),
}


@needs_groups
@pytest.mark.parametrize("where", sorted(ATTACKS))
async def test_a_session_past_its_memory_is_stopped_and_told_why(
    alice: Client, bob: Client, where: str
) -> None:
    session = f"mem-{where}"
    await run(alice, "x = 'kept?'", session)
    out = await while_bob_works(bob, lambda: run(alice, ATTACKS[where], session))
    assert stopped_for_memory(out), (out["status"], out.get("error"), out.get("notes"))
    assert "/tmp and /dev/shm count together" in out["error"]["value"]
    assert out["state_preserved"] is False
    # The session goes on, on a fresh interpreter (its variables are gone, as the result said).
    again = await run(alice, "'x' in dir()", session)
    assert again["status"] == "ok" and again["results"][0]["text"] == "False"


@needs_groups
async def test_memory_in_another_language_is_the_sessions_too(alice: Client, bob: Client) -> None:
    out = await while_bob_works(
        bob,
        # 45 files of 10 MiB: each under the file-size limit (the 60 MiB disk quota), together over 300 MiB
        lambda: run(
            alice,
            "for i in $(seq 45); do head -c 10485760 /dev/zero > /dev/shm/big$i; done; echo done",
            "mem-bash",
            "bash",
        ),
    )
    assert stopped_for_memory(out) and "done" not in "".join(out["logs"]["stdout"]), out
    assert (await run(alice, "echo fine", "mem-bash", "bash"))["logs"]["stdout"] == ["fine\n"]


@needs_groups
async def test_a_process_left_running_that_outgrows_the_session_is_stopped_between_calls(
    deployment: Deployment, alice: Client
) -> None:
    """A background thread that keeps filling /dev/shm after its call returned: the next call
    says the session was stopped for its memory."""
    code = (
        "import threading, time\n"
        "def fill():\n"
        "    for i in range(45):\n"
        "        open(f'/dev/shm/bg{i}', 'wb').write(b'x' * 10 * 2**20); time.sleep(0.02)\n"
        "threading.Thread(target=fill, daemon=True).start()"
    )
    pid = deployment.server.proc.pid
    kills = oom_kills_in_groups(pid)
    assert (await run(alice, code, "mem-between"))["status"] == "ok"
    # the thread outgrows the session once it has written 300 MiB: wait for the kill, not for a time
    assert await anyio.to_thread.run_sync(lambda: wait_until(lambda: oom_kills_in_groups(pid) > kills, 60))
    out = await run(alice, "1 + 1", "mem-between")
    assert any(
        "between calls, the session used more than its 300 MiB memory limit" in n for n in out["notes"]
    ), out
    assert out["status"] == "ok" and out["results"][0]["text"] == "2"


# --- processes -------------------------------------------------------------------------------------


@needs_groups
async def test_a_fork_bomb_stays_in_its_session(deployment: Deployment, alice: Client, bob: Client) -> None:
    """The classic bash fork bomb hits the session's process limit; bob and the server keep
    answering; closing the session leaves no process behind."""
    pid = deployment.server.proc.pid
    await run(bob, "1", "bob-work")
    before = set(processes_in_groups(pid))
    peak: list[int] = []

    async def bomb() -> dict[str, Any]:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while True:
                    peak.append(len(set(processes_in_groups(pid)) - before))
                    await anyio.sleep(0.3)

            tg.start_soon(watch)
            out = await run(alice, ":(){ :|:& };:\nsleep 4", "forks", "bash", timeout=8)
            tg.cancel_scope.cancel()
        return out

    out = await while_bob_works(bob, bomb)
    assert "Resource temporarily unavailable" in json.dumps(out["logs"]), out  # bash's forks failed
    # Alice's bomb reached the session's limit and no further (bob's calls add a few processes).
    assert 40 <= max(peak) <= 64 + 8, peak
    python_bomb = (
        "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time; time.sleep(60); os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    print(n, e.errno)"
    )
    out = await run(alice, python_bomb, "forks-py")
    started, errno = map(int, "".join(out["logs"]["stdout"]).split())
    assert started < 64 and errno == 11, out  # EAGAIN at the session's pids.max
    for session in ("forks", "forks-py"):
        structured(await alice.call_tool("close_session", {"session_id": session}))
    # Nothing of the bombs is left in the server's groups.
    assert wait_until(lambda: not set(processes_in_groups(pid)) - before, 10), (
        set(processes_in_groups(pid)) - before
    )
    assert (await run(bob, "6 * 7", "bob-after-bomb"))["results"][0]["text"] == "42"


# --- the workspace quota ----------------------------------------------------------------------------

# A new file of a session over its quota: not created where the creation guard holds running
# kernels (``creation_guard.py``), else created empty and not grown.
REFUSED_WRITE = "Disk quota exceeded" if Sandbox.detect("auto").guard is not None else "File too large"
# 150 MiB in one call, as three files of 50 MiB (no file may be larger than the 60 MiB quota:
# RLIMIT_FSIZE); closed however the write ends (a file deleted while open keeps counting).
WRITE_150 = (
    "import os\nfor part in range(3):\n    fd = os.open(f'f{i}-{{part}}', os.O_WRONLY | os.O_CREAT)\n"
    "    try:\n        os.write(fd, b'\\1' * 50 * 2**20)\n    finally:\n        os.close(fd)"
)


async def files_mib(client: Client, session: str) -> float:
    listing = structured(await client.call_tool("list_files", {"session_id": session}))
    return sum(f["size"] for f in listing["files"]) / MIB


NOT_INTERRUPTED = "the code did not stop when interrupted; the interpreter was restarted"


def over_note(out: dict[str, Any]) -> str:
    notes = [n for n in out["notes"] if "over its 60 MiB workspace quota (--workspace-mb)" in n]
    assert len(notes) == 1, out["notes"]
    return notes[0]


async def check_quota_holds(alice: Client, bob: Client, session: str) -> None:
    results = [await run(alice, WRITE_150.format(i=i), session) for i in range(5)]
    # One burst: the first write (over the quota) is all that lands; then nothing grows.
    assert await files_mib(alice, session) <= 151
    for out in results[1:]:
        assert out["status"] == "error" and REFUSED_WRITE in out["error"]["value"], out
    size = await files_mib(alice, session)
    note = over_note(results[-1])
    over = re.search(r"is ([\d.]+) MiB over", note)
    assert over and abs(float(over[1]) - (size - 60)) < 1, (note, size)  # what lies there, past 60 MiB
    assert f"Delete at least {over[1]} MiB" in note and re.search(r"f0-\d \(50 MiB\)", note), note
    # Other languages are blocked too (a new sandbox starts with the block).
    bash = await run(alice, "head -c 1000000 /dev/zero > more.bin; ls -s more.bin", session, "bash")
    over_note(bash)
    assert await files_mib(alice, session) <= 151
    # Bob is not alice: his session writes as usual.
    assert (await run(bob, "open('b.bin', 'wb').write(b'2' * 10 * 2**20)", "bob-disk"))["results"][0][
        "text"
    ] == str(10 * MIB)
    # Over the quota, code still runs and deletes; once under, writing works again.
    cleaned = await run(
        alice, "import os, glob\nfor f in glob.glob('*'): os.remove(f)\nsorted(os.listdir('.'))", session
    )
    assert cleaned["status"] == "ok" and any("back under its 60 MiB quota" in n for n in cleaned["notes"]), (
        cleaned
    )
    after = await run(alice, "open('small.txt', 'w').write('fits')", session)
    assert after["status"] == "ok" and after["notes"] == [], after


async def test_repeated_writes_never_leave_more_than_one_burst_over_the_quota(
    alice: Client, bob: Client
) -> None:
    await check_quota_holds(alice, bob, "quota")


FALLOCATE = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]\n"
    "fd = os.open('pre', os.O_RDWR)\n"
    "codes = [0 if libc.fallocate(fd, mode, 0, 100 * 2**20) == 0 else ctypes.get_errno() for mode in (0, 1)]\n"
    "os.close(fd)\ncodes"
)


async def test_over_the_quota_no_directories_links_or_preallocation_grow_it(alice: Client) -> None:
    """The holes a file-size limit leaves: 10,000 directories, a deep tree, links, ``fallocate``.
    Over the quota, a sandbox started then creates nothing, the kernel that was already running
    cannot preallocate, and code still deletes; every result carries the quota note."""
    session = "holes"
    await run(alice, "open('pre', 'w').close()", session)
    await run(alice, WRITE_150.format(i=0), session)
    size = await files_mib(alice, session)
    assert size > 60
    names = sorted(
        f["path"] for f in structured(await alice.call_tool("list_files", {"session_id": session}))["files"]
    )
    # Python, in the kernel that ran before the session went over: no preallocation at all.
    out = await run(alice, FALLOCATE, session)
    assert out["results"][0]["text"] == "[27, 95]", out  # EFBIG (the size would grow), EOPNOTSUPP
    over_note(out)
    # That same running kernel creates nothing either (the creation guard, docs/security.md).
    attempts = (
        "import os\nrefused = []\n"
        "for make in (lambda: os.mkdir('late'), lambda: open('late.txt', 'w').close()):\n"
        "    try:\n        make()\n    except OSError as e:\n        refused.append(e.strerror)\n"
        "refused"
    )
    out = await run(alice, attempts, session)
    assert out["results"][0]["text"] == "['Disk quota exceeded', 'Disk quota exceeded']", out
    # Bash, a sandbox started while over: nothing is created, in the workspace or in a deep tree.
    script = (
        "echo refused $(mkdir d{1..10000} 2>&1 | grep -c 'Disk quota exceeded')\n"
        "mkdir -p $(printf 'deep/%.0s' {1..200}) 2>&1\n"
        "ln -s f0-0 link 2>&1; ln f0-0 hard 2>&1; touch empty 2>&1\n"
        "fallocate -n -l 100M f0-0 2>&1\n"
        "ls | sort | tr '\\n' ' '"
    )
    bash = await run(alice, script, session, "bash")
    text = "".join(bash["logs"]["stdout"])
    assert "refused 10000\n" in text and "Disk quota exceeded" in text, text  # every one of them
    assert text.rstrip().endswith(" ".join(names)), (text, names)  # made nothing: what was there is all
    assert "keep size mode is unsupported" in text, text  # util-linux says EOPNOTSUPP so
    over_note(bash)
    assert await files_mib(alice, session) <= size
    # Deleting works, and the session is back under with writing allowed again.
    cleaned = await run(
        alice, "import glob, os\nfor f in glob.glob('*'):\n    os.remove(f)", session, "python"
    )
    assert any("back under its 60 MiB quota" in n for n in cleaned["notes"]), cleaned
    again = await run(alice, "mkdir d1 && touch d1/x && ls d1", session, "bash")
    assert "".join(again["logs"]["stdout"]).strip() == "x" and again["notes"] == [], again


async def list_row(client: Client, session: str) -> dict[str, Any]:
    rows = structured(await client.call_tool("list_sessions", {}))["sessions"]
    return next(r for r in rows if r["session_id"] == session)


async def check_blocked_then_cleaned(client: Client, session: str, clean: str) -> None:
    """The next write is refused; cleaning up (``clean``) brings the session back under."""
    refused = await run(client, "open('after.txt', 'w').write('x')", session)
    assert refused["status"] == "error" and REFUSED_WRITE in refused["error"]["value"], refused
    cleaned = await run(client, clean, session)
    assert any("back under its 60 MiB quota" in n for n in cleaned["notes"]), cleaned
    again = await run(client, "open('after.txt', 'w').write('fits')", session)
    assert again["status"] == "ok" and again["notes"] == [], again


async def test_a_burst_of_directories_and_long_links_is_counted_and_the_next_write_refused(
    alice: Client,
) -> None:
    """The red team's 40,000 directories and 40,000 symbolic links with 4,000-byte targets, scaled
    down: 8,000 of each hold no byte of file data but 64 MiB of disk blocks, past 60 MiB."""
    session = "dir-burst"
    burst = "import os\nfor i in range(8000):\n    os.mkdir(f'd{i}')\n    os.symlink('x' * 4000, f'l{i}')"
    note = over_note(await run(alice, burst, session))
    assert "in the working directory" in note, note
    assert (await list_row(alice, session))["workspace_bytes"] > 60 * MIB
    clean = "import glob, os\nfor d in glob.glob('d*'):\n    os.rmdir(d)\nfor link in glob.glob('l*'):\n    os.remove(link)"
    await check_blocked_then_cleaned(alice, session, clean)


async def test_many_empty_files_hit_the_names_cap(alice: Client) -> None:
    """25,000 empty files take no block but 25,000 inodes: past ``--workspace-files 20000``."""
    session = "names"
    make = "import os\nfor i in range(25000):\n    os.close(os.open(f'e{i}', os.O_CREAT | os.O_WRONLY))"
    out = await run(alice, make, session)
    notes = [n for n in out["notes"] if "(--workspace-files)" in n]
    assert len(notes) == 1 and "over its 20,000" in notes[0], out["notes"]
    clean = "import glob, os\nfor f in glob.glob('e*'):\n    os.remove(f)"
    await check_blocked_then_cleaned(alice, session, clean)


async def test_files_deleted_while_open_and_o_tmpfile_files_count(alice: Client) -> None:
    """40 MiB in an ``O_TMPFILE`` file, then 30 MiB in a named file (over: 70 MiB), then that file
    deleted while still open: nothing of it has a name any more, and the session is still over
    (it was "back under" when only names counted)."""
    session = "held"
    tmpfile = (
        "import os\nheld = [os.open('.', os.O_TMPFILE | os.O_RDWR, 0o600)]\n"
        "os.write(held[0], b'\\1' * 40 * 2**20)"
    )
    assert (await run(alice, tmpfile, session))["notes"] == []  # 40 MiB: under 60
    named = (
        "held.append(os.open('gone', os.O_CREAT | os.O_RDWR, 0o600))\nos.write(held[1], b'\\2' * 30 * 2**20)"
    )
    over_note(await run(alice, named, session))  # (the sampler may stop it: the file is there either way)
    out = await run(alice, "os.remove('gone')\nos.listdir('.')", session)
    assert out["results"][0]["text"] == "[]", out  # nothing with a name
    note = over_note(out)
    assert "that its processes still hold open" in note, note
    await check_blocked_then_cleaned(alice, session, "for fd in held:\n    os.close(fd)")


async def test_a_long_call_growing_unnamed_files_or_names_is_stopped_while_it_runs(alice: Client) -> None:
    """The sampler while code runs counts what the measurement around calls counts: an
    ``O_TMPFILE`` file growing by 2 MiB steps, and empty files made one by one, are each stopped
    past the caps, in the call, with ``WorkspaceQuotaExceeded``."""
    grow = (  # a new unnamed file every 40 MiB: no file may be larger than the quota (RLIMIT_FSIZE)
        "import os, time\nfds = []\nfor i in range(150):\n"
        "    if i % 20 == 0:\n        fds.append(os.open('.', os.O_TMPFILE | os.O_RDWR, 0o600))\n"
        "    os.write(fds[-1], b'\\1' * 2 * 2**20)\n    time.sleep(0.02)"
    )
    out = await run(alice, grow, "long-held")
    assert out["status"] == "error" and out["error"]["name"] == "WorkspaceQuotaExceeded", out
    assert "still hold open" in over_note(out)
    await check_blocked_then_cleaned(alice, "long-held", "for fd in fds:\n    os.close(fd)")
    names = (
        "import time\nfor i in range(60000):\n    open(f'n{i}', 'w').close()\n"
        "    if i % 1000 == 0:\n        time.sleep(0.05)"
    )
    out = await run(alice, names, "long-names")
    assert out["status"] == "error" and out["error"]["name"] == "WorkspaceQuotaExceeded", out
    assert "past its 20,000 (--workspace-files)" in out["error"]["value"], out
    clean = "import glob, os\nfor f in glob.glob('n*'):\n    os.remove(f)"
    await check_blocked_then_cleaned(alice, "long-names", clean)


async def test_io_uring_is_off_and_no_name_is_made_over_the_quota_from_python_or_bash(alice: Client) -> None:
    """``name_makers.PROBE`` from the session's running Python kernel (the creation guard) and from
    bash (a sandbox started over the quota: the stricter filter); io_uring fails under and over."""
    session = "families"
    for tag in ("u", "o", "bu", "bo"):
        setup = f"KM_PROBE_TAG={tag} python3 - <<'KMEOF'\n{name_makers.SETUP}\nKMEOF"
        assert (await run(alice, setup, session, "bash"))["status"] == "ok"

    async def probe(tag: str, language: str) -> dict[str, str]:
        if language == "bash":
            code = f"export KM_PROBE_TAG={tag}\npython3 - <<'KMEOF'\n{name_makers.PROBE}\nKMEOF"
        else:
            code = f"import os\nos.environ['KM_PROBE_TAG'] = '{tag}'\n{name_makers.PROBE}"
        out = await run(alice, code, session, language)
        return name_makers.parse("".join(out["logs"]["stdout"]))

    under = [await probe("u", "python"), await probe("bu", "bash")]
    over_note(await run(alice, WRITE_70, session))
    over = [await probe("o", "python"), await probe("bo", "bash")]
    for out in under:
        assert all(out[f] == "ok" for f in name_makers.FAMILIES), out
    for out in over:
        for family in name_makers.FAMILIES:
            assert out[family] == ("ENOSYS" if family.startswith("openat2") else "EDQUOT"), (family, out)
    for out in under + over:
        assert all(out[call] == "ENOSYS" for call in name_makers.IO_URING), out
    names = "import os\nprint(' '.join(sorted(n for n in os.listdir('.') if n[:2] in ('o_', 'bo'))))"
    made = "".join((await run(alice, names, session))["logs"]["stdout"]).split()
    assert made == sorted(f"{t}_{n}" for t in ("o", "bo") for n in ("existing", "moved_from", "xattr_target"))


JAVA_MKDIR = (
    'String made;\ntry { java.nio.file.Files.createDirectory(java.nio.file.Path.of("{name}")); made = "made"; }\n'
    'catch (java.io.IOException e) { made = e.getMessage(); }\nmade + " by " + java.lang.management.ManagementFactory.getRuntimeMXBean().getStartTime()'
)
WRITE_70 = "open('big', 'wb').write(b'\\1' * 70 * 2**20)"  # over 60 MiB, too quick for the sampler


async def java_mkdir(client: Client, session: str, name: str) -> tuple[str, str]:
    """(what making directory ``name`` from Java said, its JVM's start time: one per JVM)."""
    out = await run(client, JAVA_MKDIR.replace("{name}", name), session, "java")
    said, _, pid = out["results"][0]["text"].strip('"').rpartition(" by ")
    return said, pid


async def test_a_java_host_creates_nothing_while_its_session_is_over_the_quota(alice: Client) -> None:
    """Java's JShell host lives across calls, like a kernel: one started under the quota has the
    creation guard (nothing created while over, creating again once under, the same JVM); one
    started over is retired once the session is back under, so creating works again."""
    if Sandbox.detect("auto").guard is None:
        pytest.skip("the creation guard does not work here (kernmind doctor says why)")
    session = "java-guard"
    await run(alice, "1", session)  # Python first: its kernel settles the workspace's uid
    probe = structured(
        await alice.call_tool("run_code", {"code": "1", "session_id": session, "language": "java"})
    )
    if probe["status"] != "ok":
        pytest.skip(f"no Java here: {probe.get('error')}")
    said, host = await java_mkdir(alice, session, "early")
    assert said == "made"
    over = await run(alice, WRITE_70, session)
    over_note(over)
    assert await java_mkdir(alice, session, "late") == ("late: Disk quota exceeded", host)  # the same JVM
    await run(alice, "import os\nos.remove('big')", session)
    assert await java_mkdir(alice, session, "again") == ("made", host)
    # A host started while over: the stricter filter for life; retired once the session is under.
    await run(alice, "System.exit(0);", session, "java")
    over_note(await run(alice, WRITE_70, session))
    said, blocked_host = await java_mkdir(alice, session, "over")
    assert said == "over: Disk quota exceeded" and blocked_host != host
    await run(alice, "import os\nos.remove('big')", session)
    said, fresh_host = await java_mkdir(alice, session, "under")
    assert said == "made" and fresh_host != blocked_host


async def test_the_runtime_directory_counts_against_the_quota(alice: Client) -> None:
    """300 MB written into /run/kernmind (a host directory) is stopped and blocked like the workspace."""
    code = "for i in range(30):\n    open(f'/run/kernmind/fill{i}', 'wb').write(b'x' * 10 * 2**20)"
    out = await run(alice, code, "runtime-dir")
    assert out["status"] == "error"
    if out["state_preserved"] is False:  # a loaded machine: the interrupt came too late (next test)
        assert any(n.startswith(NOT_INTERRUPTED) for n in out["notes"]), out["notes"]
        out = await run(alice, code, "runtime-dir")  # a fresh interpreter: stopped and blocked as below
        assert out["status"] == "error"
    note = over_note(out)
    assert "in /run/kernmind" in note and "/run/kernmind/fill" in note
    size = "import os\nsum(os.path.getsize(f'/run/kernmind/{f}') for f in os.listdir('/run/kernmind'))"
    used = int((await run(alice, size, "runtime-dir"))["results"][0]["text"])
    again = await run(alice, code, "runtime-dir")
    assert again["status"] == "error" and REFUSED_WRITE in again["error"]["value"]
    # One burst (what was written before the sample that found it over), and not a byte more
    # (opening fill0 again for writing truncated it: it may shrink).
    assert int((await run(alice, size, "runtime-dir"))["results"][0]["text"]) <= used
    await run(
        alice, "import glob, os\nfor f in glob.glob('/run/kernmind/fill*'): os.remove(f)", "runtime-dir"
    )


async def test_a_quota_stop_the_code_ignores_restarts_the_interpreter_and_says_so(alice: Client) -> None:
    """Code that ignores the interrupt after the quota stopped it: its interpreter is restarted, and
    the result says so (its /run/kernmind went with it, so the session is back under at once)."""
    code = (
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nkept = 1\n"
        "for i in range(30):\n"
        "    try:\n        open(f'/run/kernmind/fill{i}', 'wb').write(b'x' * 10 * 2**20)\n"
        "    except OSError:\n        pass\n"
        "while True:\n    time.sleep(1)"
    )
    out = await run(alice, code, "deaf")
    assert out["status"] == "error" and out["error"]["name"] == "WorkspaceQuotaExceeded", out
    assert out["error"]["value"].endswith("the session is back under it now (the notes say why)."), out
    assert out["state_preserved"] is False
    restarted = [n for n in out["notes"] if n.startswith(NOT_INTERRUPTED)]
    assert restarted and "/run/kernmind went with it" in restarted[0], out["notes"]
    assert any("back under its 60 MiB quota" in n for n in out["notes"]), out["notes"]
    after = await run(alice, "open('note.txt', 'w').write('writes again')", "deaf")
    assert after["status"] == "ok" and after["results"][0]["text"] == "12", after


async def test_writes_between_calls_are_caught_before_the_next_call(alice: Client) -> None:
    """A thread that keeps writing after its call returned: the next call measures first, finds the
    session over and blocks it; from then on it does not grow."""
    code = (
        "import threading, time, os\nerrors = []\n"
        "def write():\n"
        "    i = 0\n"
        "    while True:\n"
        "        try:\n"
        "            with open(f'bg{i % 1000}', 'wb') as f: f.write(b'x' * 5 * 2**20)\n"
        "        except OSError as e:\n"
        "            errors.append(e.errno)\n"
        "        i += 1; time.sleep(0.05)\n"
        "threading.Thread(target=write, daemon=True).start()"
    )
    await run(alice, code, "between")
    with anyio.fail_after(60):
        while await files_mib(alice, "between") <= 60:  # noqa: ASYNC110 - written past the quota
            await anyio.sleep(0.1)
    out = await run(alice, "1 + 1", "between")
    over_note(out)
    size = await files_mib(alice, "between")

    async def errors_seen() -> int:
        return int((await run(alice, "len(errors)", "between"))["results"][0]["text"])

    refused = await errors_seen()
    with anyio.fail_after(60):  # the thread has tried (and failed) five more writes since
        while await errors_seen() < refused + 5:  # noqa: ASYNC110 - the kernel's thread writes
            await anyio.sleep(0.1)
    late = await run(alice, "sorted(set(errors))", "between")
    assert await files_mib(alice, "between") <= size + 0.1  # not growing once over
    # The thread's writes fail: opening for writing is refused (EDQUOT, the creation guard), or
    # a file opened just before the block cannot grow (EFBIG).
    assert "122" in late["results"][0]["text"] or "27" in late["results"][0]["text"], late
    structured(await alice.call_tool("close_session", {"session_id": "between"}))


async def test_a_stored_session_over_its_names_still_reads_in_a_long_first_call(tmp_path: Path) -> None:
    """A session left over its names cap, stored, and loaded again by a call that runs longer than
    the count's first sample: the call only reads, so it goes on (it was stopped as if it had made
    the names itself)."""
    flags = ["--workspace-files", "500"]
    server = start_http(tmp_path, *FLAGS, *flags)
    try:
        async with http_client(server.url, server.headers(None), "auto") as client:
            make = "import os\nfor i in range(600):\n    os.close(os.open(f'e{i}', os.O_CREAT | os.O_WRONLY))"
            assert any("over its 500" in n for n in (await run(client, make, "over"))["notes"])
        server.stop()
        server = start_http(tmp_path, *FLAGS, *flags)
        async with http_client(server.url, server.headers(None), "auto") as client:
            out = await run(client, "import os, time\ntime.sleep(1.5)\nlen(os.listdir('.'))", "over")
            made = len(os.listdir(server.data_dir / "sessions" / "local" / "over" / "files"))
            assert made > 500, made  # (a call slowed past the first sample is stopped before 600)
            assert out["status"] == "ok" and out["results"][0]["text"] == str(made), json.dumps(out)[:2000]
            assert any("over its 500" in n for n in out["notes"]), out["notes"]
    finally:
        server.stop()


async def test_a_session_over_its_quota_keeps_its_variables_when_the_server_stops(tmp_path: Path) -> None:
    """Over the quota, the session's files may not grow, but the interpreter's own save of its
    variables (written outside the files, bounded by --snapshot-mb) still lands: a server that
    stops and starts again brings them back."""
    server = start_http(tmp_path, *FLAGS)
    try:
        async with http_client(server.url, server.headers(None), "auto") as client:
            fill = "kept = {'answer': 42}\nopen('big.bin', 'wb').write(b'x' * 70 * 2**20)"
            over_note(await run(client, fill, "over-save"))
            refused = await run(client, "open('more.bin', 'wb').write(b'y' * 2**20)", "over-save")
            assert refused["status"] == "error" and REFUSED_WRITE in refused["error"]["value"], refused
        server.stop()
        server = start_http(tmp_path, *FLAGS)
        async with http_client(server.url, server.headers(None), "auto") as client:
            out = await run(client, "kept['answer']", "over-save")
            assert out["status"] == "ok" and out["results"][0]["text"] == "42", json.dumps(out)[:2000]
            assert any("restored" in n for n in out["notes"]), out["notes"]
            # Still over, still blocked: the save lifted the block for nothing else.
            again = await run(client, "open('more.bin', 'wb').write(b'y' * 2**20)", "over-save")
            assert again["status"] == "error" and REFUSED_WRITE in again["error"]["value"], again
            # A fresh interpreter, started while the session is over.
            fresh = await run(client, "kept = {'later': 7}", "over-save", reset=True)
            assert fresh["status"] == "ok", fresh
        server.stop()
        server = start_http(tmp_path, *FLAGS)
        async with http_client(server.url, server.headers(None), "auto") as client:
            out = await run(client, "sorted(kept.items())", "over-save")
            assert out["results"][0]["text"] == "[('later', 7)]", json.dumps(out)[:2000]
        assert not list((server.data_dir / "sessions" / "local" / "over-save" / "files").glob("*.tmp"))
    finally:
        server.stop()


# --- the fallback: no control groups -------------------------------------------------------------


async def test_without_control_groups_per_process_limits_stay_and_the_quota_still_holds(
    fallback: Deployment,
) -> None:
    async with fallback.client("alice") as alice, fallback.client("bob") as bob:
        # RLIMIT_DATA still bounds each process: a single huge allocation fails, the session lives.
        out = await run(alice, "x = bytearray(400 * 2**20)", "fb-mem")
        assert out["status"] == "error" and out["error"]["name"] == "MemoryError"
        # Nothing counts the session as a whole: two 200 MiB children together are not stopped.
        kids = ATTACKS["child_processes"].replace("time.sleep(20)", "time.sleep(1)")
        together = await run(alice, kids, "fb-mem")
        assert together["status"] == "ok", together
        await check_quota_holds(alice, bob, "fb-quota")


def test_doctor_says_which_limits_hold_a_session(tmp_path: Path) -> None:
    def doctor(*extra: str) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "kernmind", "doctor", "--json", "--data-dir", str(tmp_path),
             "--no-fork-server", "--embedding-model", "none", *extra],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)

    off = doctor("--cgroups", "none")["session_limits"]
    assert off["mode"] == "none" and "per process only" in off["enforced"]
    report = doctor()
    limits = report["session_limits"]
    if GROUPS:
        assert limits["mode"] in ("v1", "v2") and "per session: memory 2048 MiB" in limits["enforced"]
        assert report["live_test"]["in_control_group"] is True
    else:
        assert limits["mode"] == "none" and limits["reason"]
