"""What sandboxed code can put in its working directory cannot crash, freeze or outgrow the server.

Issue 10's families, each tested as a family: names that are not UTF-8 (every language
that can make them), file-system objects that block or never end (FIFOs, sockets, symlink
loops, links to /proc, growing files, huge directories), output that is not serialisable
(lone surrogates, deep JSON, hundreds of images), and every writable place in the sandbox
(workspace, the kernel's socket directory, /tmp, /dev/shm). After each attack the server
answers another client at once and memory is intact.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.server import create_server
from tests.conftest import error_text, make_settings, structured

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.xdist_group("security"),
    pytest.mark.skipif(Sandbox.detect("auto").backend != "bwrap", reason="bubblewrap is not usable here"),
]

MEMORY_VALUE = "Ada likes short answers."
# memory_mb above the 512 MiB of /tmp and /dev/shm: with per-session control groups, filling one of
# them would otherwise hit the session's memory limit before the file system's own size.
# workspace_mb is also the largest file code may write (RLIMIT_FSIZE).
LIMITS = {"memory_mb": 1536, "workspace_mb": 64, "timeout": 30, "max_sessions": 64}


class Harness:
    def __init__(self, client: Client, other: Client, data_dir: Path) -> None:
        self.client = client
        self.other = other  # a second client of the same server
        self.data_dir = data_dir

    async def run(self, code: str, session: str, language: str = "python", **kw: object) -> dict:
        return structured(
            await self.client.call_tool(
                "run_code", {"code": code, "session_id": session, "language": language, **kw}
            )
        )

    async def tool(self, name: str, **args: object) -> dict:
        return structured(await self.client.call_tool(name, args))

    async def error(self, name: str, **args: object) -> str:
        return error_text(await self.client.call_tool(name, args))

    async def healthy(self, session: str) -> None:
        """Another client is answered (not blocked: the bound is on a hang), the session still runs
        code, memory is intact."""
        with anyio.fail_after(60):
            block = structured(await self.other.call_tool("memory_read", {"label": "human"}))
        assert block["value"] == MEMORY_VALUE
        out = await self.run("6 * 7", session)
        assert out["results"][0]["text"] == "42"


@pytest.fixture(scope="module")
async def h(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    data = tmp_path_factory.mktemp("files")
    server = create_server(make_settings(data, sandbox="required", pool_size=1, **LIMITS))
    async with Client(server) as client, Client(server) as other:
        structured(await client.call_tool("memory_rethink", {"label": "human", "new_memory": MEMORY_VALUE}))
        yield Harness(client, other, data)


def serialisable(result: dict) -> None:
    """A result any standard client can carry: strict UTF-8 JSON that parses back."""
    text = json.dumps(result, ensure_ascii=False)
    text.encode("utf-8")  # raises on a lone surrogate
    assert json.loads(text) == result


# --- names that are not UTF-8 ---------------------------------------------------------------
MAKERS = {
    "python": "open(b'bad\\xff\\xfe.txt', 'wb').write(b'made by python')",
    "bash": "printf 'made by bash' > $'bad\\xff\\xfe.txt'",
    "r": "name <- rawToChar(as.raw(c(0x62, 0x61, 0x64, 0xff, 0xfe, 0x2e, 0x74, 0x78, 0x74)))\n"
    "invisible(writeChar('made by r', name, eos = NULL))",
}


@pytest.mark.parametrize("language", sorted(MAKERS))
async def test_names_that_are_not_utf8_are_escaped_and_stay_addressable(h: Harness, language: str) -> None:
    """A file name with undecodable bytes shows as \\xNN in files and list_files, and downloads by that name."""
    session = f"names-{language}"
    out = await h.run(MAKERS[language], session, language)
    serialisable(out)
    assert [f["path"] for f in out["files"]] == ["bad\\xff\\xfe.txt"]
    listed = await h.tool("list_files", session_id=session)
    serialisable(listed)
    assert [f["path"] for f in listed["files"]] == ["bad\\xff\\xfe.txt"]
    got = await h.tool("download_file", path="bad\\xff\\xfe.txt", session_id=session)
    assert got["content"] == f"made by {language}"
    await h.healthy(session)


async def test_output_display_data_and_errors_with_undecodable_text_serialise(h: Harness) -> None:
    """Undecodable bytes in stdout, display data, JSON keys and exception text still give a result
    that is strict UTF-8 JSON."""
    code = (
        "from IPython.display import display\n"
        "import os, sys\n"
        "os.write(1, b'raw \\xff\\xfe bytes\\n')\n"
        "sys.stdout.write('out \\udcff\\n')\n"
        "display({'text/plain': 'shown \\udcff', 'application/json': {'k\\udcfe': ['v\\udc80']}}, raw=True)\n"
        "raise ValueError('bad \\udcff value')"
    )
    out = await h.run(code, "surrogates")
    serialisable(out)
    assert out["status"] == "error" and out["error"]["name"] == "ValueError"
    assert out["results"] and out["results"][0]["json"] is not None
    await h.healthy("surrogates")


# --- file-system objects that block ------------------------------------------------------------
async def test_a_fifo_is_refused_without_blocking_anyone(h: Harness) -> None:
    """download_file/upload_file on a FIFO fail at once; other clients are answered meanwhile."""
    await h.run("mkfifo pipe", "fifo", "bash")
    # a FIFO opened for reading with no writer would block for good: the bound is on that hang
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.healthy, "fifo-other")
            assert "pipe" in await h.error("download_file", path="pipe", session_id="fifo")
            assert "pipe" in await h.error("upload_file", path="pipe", content="x", session_id="fifo")
    await h.healthy("fifo")


async def test_sockets_links_and_loops_are_refused_in_words(h: Harness) -> None:
    """A unix socket, a symlink loop and a link to /proc/1/root each get a clear refusal."""
    code = (
        "import os, socket\n"
        "s = socket.socket(socket.AF_UNIX); s.bind('sock')\n"
        "os.symlink('loop2', 'loop1'); os.symlink('loop1', 'loop2')\n"
        "os.symlink('/proc/1/root', 'hostroot')"
    )
    await h.run(code, "objects")
    assert "socket" in await h.error("download_file", path="sock", session_id="objects")
    assert "symlink" in await h.error("download_file", path="loop1", session_id="objects")
    assert "symlink" in await h.error("download_file", path="hostroot/etc/passwd", session_id="objects")
    assert "symlink" in await h.error("upload_file", path="hostroot/tmp/x", content="x", session_id="objects")
    await h.healthy("objects")


async def test_a_file_that_keeps_growing_is_read_in_bounded_parts(h: Harness) -> None:
    """A file written forever by a background thread downloads as a bounded part or a link."""
    code = (
        "import threading\n"
        "def grow():\n"
        "    with open('grow.log', 'a') as f:\n"
        "        while True:\n"
        "            f.write('x' * 65536); f.flush()\n"
        "threading.Thread(target=grow, daemon=True).start()\n"
        "import os, time\n"
        "while not os.path.exists('grow.log') or os.path.getsize('grow.log') < 2**20:\n"
        "    time.sleep(0.01)"
    )
    await h.run(code, "grow")
    got = await h.client.call_tool("download_file", {"path": "grow.log", "session_id": "grow"})
    answer = structured(got)
    assert answer["complete"] is False and answer["content"] is None
    assert answer["resource"] == "workspace://grow/grow.log"
    part = await h.tool("download_file", path="grow.log", session_id="grow", offset=0, length=1000)
    assert part["content"] == "x" * 1000 and part["length"] == 1000
    await h.run("import os; os._exit(0)", "grow")  # stop the writer (the kernel restarts)


async def test_a_huge_directory_costs_later_calls_little_and_lists_in_pages(h: Harness) -> None:
    """100k files: the call's file list is capped with a note, list_files pages, later calls stay quick."""
    out = await h.run(
        "import os\nos.makedirs('many')\nfor i in range(100_000): open(f'many/f{i}', 'w').close()",
        "many",
        timeout=120,
    )
    assert len(out["files"]) <= 50
    assert any("more files" in n or "too large" in n for n in out["notes"])
    page = await h.tool("list_files", session_id="many", path="many", limit=10)
    assert len(page["files"]) == 10 and page["total"] == 100_000 and page["next_offset"] == 10
    glob = await h.tool("list_files", session_id="many", pattern="f9999*")
    assert sorted(f["path"] for f in glob["files"]) == [
        "many/f9999",
        "many/f99990",
        "many/f99991",
        "many/f99992",
        "many/f99993",
        "many/f99994",
        "many/f99995",
        "many/f99996",
        "many/f99997",
        "many/f99998",
        "many/f99999",
    ]
    quick = await h.run("1 + 1", "many")
    assert quick["files"] == [] and quick["results"][0]["text"] == "2"
    await h.run("import shutil; shutil.rmtree('many')", "many")
    await h.healthy("many")


# --- output that would flood or not parse ---------------------------------------------------------
async def test_deeply_nested_json_is_cut_to_a_string(h: Harness) -> None:
    """JSON 300 levels deep comes back parseable: below 32 levels it is a string."""
    code = (
        "from IPython.display import JSON, display\n"
        "v = 'leaf'\nfor _ in range(300): v = {'k': v}\n"
        "display(JSON(v))"
    )
    out = await h.run(code, "deep")
    serialisable(out)
    value = out["results"][0]["json"]
    depth = 0
    while isinstance(value, dict):
        value, depth = value["k"], depth + 1
    assert depth <= 33 and isinstance(value, str) and "nested deeper" in value
    await h.healthy("deep")


async def test_hundreds_of_images_stay_within_the_result_budget(h: Harness) -> None:
    """150 large PNGs: the result stays under --max-result-bytes, and a note says what was left out."""
    code = (
        "import base64, os, zlib, struct\n"
        "from IPython.display import Image, display\n"
        "def png(n):\n"
        "    raw = os.urandom(n)\n"
        "    def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n"
        "    w = 1000; h = n // (w * 3) or 1\n"
        "    rows = b''.join(b'\\x00' + raw[i * w * 3:(i + 1) * w * 3] for i in range(h))\n"
        "    return b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0)) + "
        "chunk(b'IDAT', zlib.compress(rows, 0)) + chunk(b'IEND', b'')\n"
        "for _ in range(150): display(Image(data=png(600_000)))"
    )
    result = await h.client.call_tool("run_code", {"code": code, "session_id": "images"})
    out = structured(result)
    images = [b for b in result.content if b.type == "image"]
    sent = sum(len(b.data) for b in images)
    assert 0 < len(images) < 150 and sent <= 4 * 1024 * 1024
    assert any("left out" in n and "image/png" in n for n in out["notes"])
    await h.healthy("images")


# --- closing stops every language ----------------------------------------------------------------
def sleeping(seconds: str) -> list[int]:
    """Host pids of ``sleep SECONDS`` processes (a unique length names one call's process)."""
    wanted = f"sleep\0{seconds}\0".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == wanted:
                found.append(int(pid))
        except OSError:
            continue
    return found


async def test_closing_a_session_stops_a_running_bash_call(h: Harness) -> None:
    """close_session ends a running bash call with SessionClosed, and its processes with it."""
    seconds = f"{os.getpid()}.25"
    results: list[dict] = []

    async def run_slow() -> None:
        results.append(await h.run(f"sleep {seconds}; echo done > out.txt", "closing", "bash"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_slow)
        with anyio.fail_after(60):
            while not sleeping(seconds):  # noqa: ASYNC110 - polling /proc: the command has started
                await anyio.sleep(0.05)
        await h.tool("close_session", session_id="closing")
    assert results[0]["status"] == "error" and results[0]["error"]["name"] == "SessionClosed"
    with anyio.fail_after(15):
        while sleeping(seconds):  # noqa: ASYNC110 - the command was killed, not left to finish
            await anyio.sleep(0.1)
    await h.healthy("closing")


# --- every writable place is bounded ----------------------------------------------------------------
async def test_the_kernels_socket_directory_counts_against_the_quota(h: Harness) -> None:
    """Writing into /run/kernmind (a host directory) is stopped by the workspace quota like the workspace."""
    code = "i = 0\nwhile True:\n    open(f'/run/kernmind/fill{i}', 'wb').write(b'x' * 4_000_000)\n    i += 1"
    out = await h.run(code, "runtime-fill", timeout=20)
    assert out["status"] == "error" and out["error"]["name"] == "WorkspaceQuotaExceeded"
    await h.run("import glob, os\nfor f in glob.glob('/run/kernmind/fill*'): os.remove(f)", "runtime-fill")
    await h.healthy("runtime-fill")


@pytest.mark.parametrize("place", ["/tmp", "/dev/shm"])
async def test_tmp_and_dev_shm_are_private_and_size_limited(h: Harness, place: str) -> None:
    """Writing past the size of /tmp or /dev/shm fails with 'no space' inside the sandbox."""
    code = (  # files of 16 MiB each: below the file-size limit, so the place itself runs out
        f"import errno, glob, os\nwritten = 0\ntry:\n    for i in range(200):\n"
        f"        with open(f'{place}/fill{{i}}', 'wb') as f:\n"
        "            for _ in range(16):\n                f.write(b'x' * (1 << 20)); written += 1\n"
        "except OSError as e:\n    print(e.errno == errno.ENOSPC, written)\n"
        f"for f in glob.glob('{place}/fill*'): os.remove(f)"
    )
    out = await h.run(code, f"fill-{place.strip('/').replace('/', '-')}", timeout=30)
    full, written = "".join(out["logs"]["stdout"]).split()
    assert full == "True" and 0 < int(written) <= 1024
    await h.healthy("fill-after")


async def test_multiprocessing_works_in_the_sandbox(h: Harness) -> None:
    """Pool(2).map works: /dev/shm is writable by the sandbox's own user."""
    out = await h.run(
        "from multiprocessing import Pool\nwith Pool(2) as p: r = p.map(abs, [-1, -2, 3])\nr", "mp"
    )
    assert out["status"] == "ok", out.get("error")
    assert out["results"][0]["text"] == "[1, 2, 3]"


# --- arguments that used to give opaque errors ------------------------------------------------------
async def test_bad_arguments_get_sentences(h: Harness) -> None:
    """An empty session id, a very deep path, NUL in bash code: each a sentence, not a bare failure."""
    assert "session_id" in await h.error("run_code", code="1", session_id="")
    deep = "/".join(["d"] * 2000) + "/f.txt"
    assert "too long" in await h.error("upload_file", path=deep, content="x", session_id="args")
    out = await h.run("echo a\x00b", "args", "bash")
    assert out["status"] == "error" and "NUL" in out["error"]["value"]
    for bad in ("NaN", "Infinity", "-inf"):
        msg = await h.error("run_code", code="1", session_id="args", timeout=bad)
        assert "timeout" in msg
    await h.healthy("args")


async def test_a_timeout_above_the_maximum_is_lowered_with_a_note(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, pool_size=0, timeout=5, max_timeout=10)
    async with Client(create_server(settings)) as client:
        out = structured(
            await client.call_tool("run_code", {"code": "echo hi", "language": "bash", "timeout": 60})
        )
    assert out["status"] == "ok"
    assert any("maximum" in n and "10s" in n for n in out["notes"])


async def test_a_server_killed_with_sigkill_leaves_nothing_the_next_start_keeps(tmp_path: Path) -> None:
    """After kill -9 the run directory (with connection files) is left; the next server removes it."""
    import signal

    from tests.transport.procs import StdioServer

    server = StdioServer.start(tmp_path)
    server.call_tool("run_code", {"code": "1"})
    run_roots = [tmp_path / "data" / "workspaces"]
    left = [p for root in run_roots if root.exists() for p in root.iterdir() if p.is_dir()]
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    assert left and all(p.exists() for p in left)
    again = StdioServer.start(tmp_path)
    try:
        again.call_tool("list_sessions", {})
        assert not any(p.exists() for p in left)
    finally:
        again.close_stdin()
        again.wait()
