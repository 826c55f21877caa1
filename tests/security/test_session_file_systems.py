"""With ``--workspace-fs image``, the kernel itself caps a session's disk: no burst passes (issue 33).

A real `kernmind serve --transport http --tokens FILE --workspace-fs image` with two principals
(root, ``mkfs.ext4`` and loop devices, as in CI). Each stored session's files are an ext4 image
of their own, sized for ``--workspace-mb 60`` and ``--workspace-files 2000``: the red team's
bursts (files held open and unnamed, a flood of names) end in "No space left on device" inside
the call, where counting alone let one burst pass before it noticed. The images follow the
session: mounted while it is live, unmounted when the server stops, cleaned up after a server
that was killed, deleted with the session.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from kernmind.execution.parts import RUNTIME_NAMES
from kernmind.execution.sandbox import volume
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.tokens_file import TokenFile
from tests.conftest import structured
from tests.transport.procs import HttpServer, http_client, start_http, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.skipif(volume.unavailable() is not None, reason=str(volume.unavailable())),
    pytest.mark.skipif(Sandbox.detect("auto").backend != "bwrap", reason="bubblewrap is not usable here"),
]

MIB = 2**20
QUOTA_MIB, NAMES = 60, 2000
FLAGS = [
    *("--workspace-fs", "image", "--workspace-mb", str(QUOTA_MIB), "--workspace-files", str(NAMES)),
    *("--sandbox", "required", "--preload", "[]", "--embedding-model", "none", "--memory-mb", "600"),
]
IMAGE_BYTES = volume.image_mib(QUOTA_MIB, NAMES) * MIB


class Deployment:
    def __init__(self, tmp: Path) -> None:
        file = TokenFile(tmp / "tokens.json")
        self.tmp = tmp
        self.tokens = {name: file.add(name, []) for name in ("alice", "bob")}
        self.server = self.start()

    def start(self) -> HttpServer:
        return start_http(self.tmp, "--tokens", str(self.tmp / "tokens.json"), *FLAGS)

    def client(self, who: str) -> Client:
        return http_client(self.server.url, {"Authorization": f"Bearer {self.tokens[who]}"}, "auto")

    def files(self, owner: str, session: str) -> Path:
        return self.server.data_dir / "sessions" / owner / session / "files"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = Deployment(tmp_path_factory.mktemp("images"))
    try:
        yield d
    finally:
        d.server.stop()
        assert not mounts_under(d.server.data_dir), "the server left session file systems mounted"


@pytest.fixture
async def alice(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("alice") as c:
        yield c


@pytest.fixture
async def bob(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("bob") as c:
        yield c


def mounts_under(root: Path) -> list[str]:
    prefix = os.path.realpath(root) + os.sep
    return [p for p in volume._mount_points() if p.startswith(prefix)]


async def run(client: Client, code: str, session: str) -> dict[str, Any]:
    return structured(await client.call_tool("run_code", {"code": code, "session_id": session}))


async def value(client: Client, code: str, session: str) -> Any:
    out = await run(client, code, session)
    assert out["status"] == "ok", json.dumps(out)[:3000]
    return json.loads(out["results"][0]["text"].strip("'"))


async def bob_works(bob: Client) -> None:
    assert await value(bob, "import json; json.dumps(6 * 7)", "bob-work") == 42


# Started by a call, it writes on after the call has returned, when no count runs: ten 30 MiB
# files opened with O_TMPFILE (no name; each under the per-file limit), held open; then it says
# what it managed on its stdout and keeps them open.
BACKGROUND_WRITER = """
import errno, json, os, time
held, written, err = [], 0, "none"
try:
    for i in range(10):
        held.append(os.open('.', os.O_TMPFILE | os.O_RDWR, 0o600))
        written += os.write(held[-1], bytes(30 * 2**20))
except OSError as exc:
    err = errno.errorcode[exc.errno]
print(json.dumps([err, written]), flush=True)
open('writer-done', 'w').close()  # a name without a block: there is room for it either way
time.sleep(600)
"""


async def test_a_process_writing_between_calls_stops_at_the_file_systems_size(
    deployment: Deployment, alice: Client, bob: Client
) -> None:
    """Between calls nothing counts: counting alone let a process left running put 300 MiB of
    unnamed files on the host's disk before the next call noticed. The session's file system
    refuses them at its size."""
    start = (
        "import subprocess, sys\n"
        f"writer = subprocess.Popen([sys.executable, '-c', {BACKGROUND_WRITER!r}], stdout=subprocess.PIPE, text=True)"
    )
    await value(alice, start + "\nwriter.pid", "unnamed")
    # No call until it is done: a call would count, find the session over and block the writer.
    done = deployment.files("alice", "unnamed") / "writer-done"
    assert await anyio.to_thread.run_sync(wait_until, done.exists, 60)
    err, written = await value(alice, "writer.stdout.readline().strip()", "unnamed")
    assert err == "ENOSPC", (err, written)
    assert QUOTA_MIB * MIB < written <= IMAGE_BYTES, written
    image = deployment.files("alice", "unnamed").parent / volume.IMAGE
    # What the host gives the session: the image's size, all of it reserved from the start (and the
    # host file system's own few blocks of its extent map).
    assert IMAGE_BYTES <= os.stat(image).st_blocks * 512 <= IMAGE_BYTES + MIB
    await bob_works(bob)
    # The count runs beside it and says why writes are blocked; ending the writer frees it all.
    out = await run(alice, "writer.kill()\nwriter.wait()", "unnamed")
    assert any("back under its 60 MiB quota" in n for n in out["notes"]), out
    assert await value(alice, "open('after.txt', 'w').write('fits')", "unnamed") == 4


FLOOD = (
    "import errno, json, os\nmade, err = 0, 'none'\ntry:\n    for i in range(5000):\n"
    "        os.mkdir(f'd{i}')\n        made += 1\nexcept OSError as exc:\n"
    "    err = errno.errorcode[exc.errno]\njson.dumps([err, made])"
)
MOST_NAMES = NAMES + NAMES // 50 + 64  # the file system's inodes (volume.attach)


async def flood(client: Client, session: str) -> int:
    """Run FLOOD; how many names it made. The file system stops it with ENOSPC; a call slowed past
    the count's first sample (0.5 s) is stopped by the count instead, whose sentence says how many
    names the session holds (measured by the server): the file system's cap holds either way."""
    out = await run(client, FLOOD, session)
    if out["status"] == "ok":
        err, made = json.loads(out["results"][0]["text"].strip("'"))
        assert err == "ENOSPC", (err, made)
        return int(made)
    error = out["error"]
    assert error["name"] == "WorkspaceQuotaExceeded", json.dumps(out)[:2000]
    return int(re.search(r"files ([\d,]+) names", error["value"])[1].replace(",", ""))


async def test_a_flood_of_names_stops_at_the_inode_cap(alice: Client, bob: Client) -> None:
    """5,000 directories asked for in one call, with --workspace-files 2000: the file system has
    no inode left from about the 2,100th, so the flood never reaches the host."""
    assert NAMES <= await flood(alice, "names") <= MOST_NAMES
    await bob_works(bob)


async def test_the_runtime_directory_is_a_file_system_of_its_own(alice: Client, bob: Client) -> None:
    """/run/kernmind (the kernel's sockets, a save of its variables) is capped by the kernel too:
    a flood of names there stops at its own inode count (1,000 and a little), well before the
    count's 2,000 for the session's two directories together."""
    out = await run(
        alice, FLOOD.replace("os.mkdir(f'd{i}')", "os.mkdir(f'/run/kernmind/d{i}')"), "runtime-names"
    )
    assert out["status"] == "ok", json.dumps(out)[:2000]
    err, made = json.loads(out["results"][0]["text"].strip("'"))
    # (mkfs rounds the inode count up to whole inode-table blocks of each block group)
    assert err == "ENOSPC" and RUNTIME_NAMES - 50 <= made <= RUNTIME_NAMES * 1.2 < NAMES, made
    await bob_works(bob)


async def test_the_image_follows_the_session_through_stops_kills_and_close(deployment: Deployment) -> None:
    """Mounted while live, unmounted at a clean stop, cleaned up after a kill, removed with the
    session; the files survive every stop and the file tools read them."""
    files = deployment.files("alice", "lasting")
    async with deployment.client("alice") as alice:
        assert await value(alice, "open('kept.txt', 'w').write('kept')", "lasting") == 4
        # (Saved at the stop from the kernel's runtime directory, a file system of its own.)
        assert await value(alice, "kept_var = 42\nkept_var", "lasting") == 42
        assert os.path.ismount(files) and (files.parent / volume.IMAGE).is_file()
        listed = structured(await alice.call_tool("list_files", {"session_id": "lasting"}))
        assert [f["path"] for f in listed["files"]] == ["kept.txt"], listed

    deployment.server.stop()
    assert not mounts_under(deployment.server.data_dir)
    deployment.server = deployment.start()
    # Stored, not loaded: its files are in the unmounted image, and the /ui page says so.
    page = httpx2.get(
        deployment.server.url.rsplit("/", 1)[0] + "/ui/sessions/lasting",
        headers={"Authorization": f"Bearer {deployment.tokens['alice']}"},
        timeout=30,
    )
    assert page.status_code == 200 and 'id="files-unmounted"' in page.text, page.text[:2000]
    async with deployment.client("alice") as alice:
        assert await value(alice, "import json; json.dumps(open('kept.txt').read())", "lasting") == "kept"
        assert await value(alice, "kept_var", "lasting") == 42

    deployment.server.stop(signal.SIGKILL)
    assert os.path.ismount(files)  # a killed server cannot unmount: the next one does
    deployment.server = deployment.start()
    assert wait_until(lambda: not mounts_under(deployment.server.data_dir), 10)
    async with deployment.client("alice") as alice:
        read = await alice.call_tool("download_file", {"path": "kept.txt", "session_id": "lasting"})
        assert "kept" in json.dumps(structured(read)), read
        closed = await alice.call_tool("close_session", {"session_id": "lasting"})
        assert not closed.is_error, closed
    assert not files.parent.exists() and not mounts_under(deployment.server.data_dir)


# How long this interpreter has been running, from inside its sandbox (/proc/self/stat's start).
AGE = (
    "import json, os\nstart = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n"
    "json.dumps(float(open('/proc/uptime').read().split()[0]) - start / os.sysconf('SC_CLK_TCK'))"
)


async def warm_pool_full(client: Client) -> None:
    for _ in range(600):
        listed = structured(await client.call_tool("list_sessions", {}))
        if listed["warm_kernels"] >= 1:
            return
        await anyio.sleep(0.1)
    raise AssertionError("the warm pool never filled")


async def test_a_warm_kernel_brings_its_file_system_to_a_new_session(tmp_path: Path) -> None:
    """A warm kernel starts on a file system of its own; a new session's first call takes it (its
    mount moved onto the session's files, its image renamed beside them) instead of starting a
    kernel: the session is capped all the same, and its files last."""
    server = start_http(tmp_path, *FLAGS, "--pool-size", "1")
    files = server.data_dir / "sessions" / "local" / "fresh" / "files"
    try:
        async with http_client(server.url, server.headers(None), "auto") as client:
            await warm_pool_full(client)
            await anyio.sleep(2.0)
            age = await value(client, AGE, "fresh")
            assert age > 1.5, f"the session's kernel is {age:.2f} s old: it was not the warm one"
            assert os.path.ismount(files) and (files.parent / volume.IMAGE).is_file()
            # The file list follows the moved file system (the one watched before went away).
            wrote = await run(client, "open('a.txt', 'w').write('a')", "fresh")
            assert [f["path"] for f in wrote["files"]] == ["a.txt"], wrote
            assert NAMES <= await flood(client, "fresh") <= MOST_NAMES
            # Back under (a session over its cap is held back by the count), one file to keep.
            clean = "for d in os.listdir('.'):\n    (os.rmdir if os.path.isdir(d) else os.remove)(d)"
            await run(client, clean, "fresh")
            await value(client, "open('kept.txt', 'w').write('kept')", "fresh")
        server.stop()
        assert not mounts_under(server.data_dir)
        assert not [p for p in server.data_dir.rglob("ws-*.img")], "a warm kernel's image was left behind"
        server = start_http(tmp_path, *FLAGS)
        async with http_client(server.url, server.headers(None), "auto") as client:
            assert await value(client, "import json, os; json.dumps(os.listdir('.'))", "fresh") == [
                "kept.txt"
            ]
    finally:
        server.stop()


async def test_stateless_calls_are_capped_too(tmp_path: Path) -> None:
    """--stateless: each call's fresh directory is a file system of its own."""
    server = start_http(tmp_path, *FLAGS, "--stateless", "--pool-size", "1")
    try:
        async with http_client(server.url, server.headers(None), "auto") as client:
            assert NAMES <= await flood(client, "stateless") <= MOST_NAMES
            assert await value(client, "import json, os; json.dumps(len(os.listdir('.')))", "stateless") == 0
    finally:
        server.stop()
    assert not mounts_under(server.data_dir) and not list(server.data_dir.rglob("ws-*.img"))


def test_doctor_says_which_enforcement_is_active(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "kernmind",
        "doctor",
        "--data-dir",
        str(tmp_path),
        "--workspace-fs",
        "image",
    ]
    report = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout
    assert "image: each stored session's files are an ext4 file system" in report, report
    disk = os.statvfs(tmp_path)
    room = disk.f_bavail * disk.f_frsize // (volume.image_mib(2048, 100_000) * MIB)  # (the default caps)
    said = re.search(r"the data directory's disk has room for ([\d,]+) more", report)
    assert said and abs(int(said[1].replace(",", "")) - room) <= 1, report  # (other tests write meanwhile)
    counting = volume.describe("count", QUOTA_MIB, NAMES)  # (the line doctor prints without the option)
    assert counting.startswith("count: measured") and "possible here: --workspace-fs image" in counting
