"""``kernmind ui`` for stdio users: one-time login link, the data dir a stdio server writes,
and pages that stay paged at 10,000 passages and 100 sessions.

A data dir is filled first (10k passages through ``Passages.add``, 100 stored sessions through
``SessionStore``); ``kernmind ui --ui-port 0`` serves it; a real stdio ``kernmind serve`` on
the same data dir then stores a passage and runs code, and the page shows both without a
restart. Plain HTTP (httpx): the browser's part is tests/ui/test_browser.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters

from kernmind.config import Settings
from kernmind.execution.sessions.disk_store import Meta, SessionStore
from kernmind.memory.records import PassageIn
from kernmind.memory.store import MemoryStore
from tests.conftest import structured
from tests.transport.procs import serve_argv, server_env

pytestmark = [pytest.mark.xdist_group("ui_standalone"), pytest.mark.slow]

PASSAGES = 10_000
SESSIONS = 100
LINK = re.compile(r"log in once with (http://\S+/ui/login\?once=\S+)")


async def _fill(data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir, embedding_model="none")
    async with MemoryStore.from_settings(settings) as store:
        t0 = 1_600_000_000.0
        items = [
            PassageIn(f"note {i} about topic {i % 37}", ["bulk"], occurred_at=t0 + i * 60)
            for i in range(PASSAGES)
        ]
        await store.passages.add(items)
    sessions = SessionStore(settings.sessions_dir, max_sessions=1000, max_bytes=1 << 30)
    for i in range(SESSIONS):
        home = sessions.home("local", f"bulk-{i:03d}")
        home.files.mkdir(parents=True)
        (home.files / "f.txt").write_text("x" * i)
        home.save_meta(Meta("local", f"bulk-{i:03d}", bytes=i, files=1))
    # a kept install, as execution/packages/stored.py leaves it in the session's home
    (sessions.home("local", "bulk-007").root / "packages" / "python" / "demo_pkg-1.2.dist-info").mkdir(
        parents=True
    )


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path, subprocess.Popen[bytes]]]:
    tmp = tmp_path_factory.mktemp("ui_alone")
    data = tmp / "data"
    anyio.run(_fill, data)
    log = tmp / "ui.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernmind",
                "ui",
                "--data-dir",
                str(data),
                "--ui-port",
                "0",
                "--embedding-model",
                "none",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=server_env(tmp),
        )
    try:
        deadline = time.monotonic() + 60
        while not (found := LINK.search(log.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        yield found.group(1), data, tmp, proc
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def client(ui: tuple[str, Path, Path, subprocess.Popen[bytes]]) -> Iterator[httpx2.Client]:
    """Logged in with the link (which works once only)."""
    logged_in = login(ui[0])
    try:
        yield logged_in
    finally:
        logged_in.close()


def login(link: str) -> httpx2.Client:
    client = httpx2.Client(timeout=30)
    first = client.get(link, follow_redirects=False)
    assert first.status_code == 303 and "kernmind_ui" in client.cookies
    cookie = first.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    return client


def test_the_one_time_link_logs_in_once(
    ui: tuple[str, Path, Path, subprocess.Popen[bytes]], client: httpx2.Client
) -> None:
    link = ui[0]
    base = link.split("/ui/")[0]
    assert httpx2.get(base + "/ui/memory/blocks", timeout=30).status_code == 303  # no cookie: to the login
    again = httpx2.get(link, timeout=30, follow_redirects=False)
    assert again.status_code == 401 and "kernmind_ui" not in again.cookies  # used once already
    assert client.get(base + "/ui/principals").status_code == 200  # the local user is the admin
    # a host name that is not loopback is refused (a rebound DNS name cannot use the login)
    assert httpx2.get(link, headers={"Host": "evil.example:80"}, timeout=30).status_code == 421


def test_pages_stay_paged_at_ten_thousand_passages_and_a_hundred_sessions(
    ui: tuple[str, Path, Path, subprocess.Popen[bytes]], client: httpx2.Client
) -> None:
    link = ui[0]
    base = link.split("/ui/")[0]
    timings = {}
    for path in ("/ui/memory/passages?page=150", "/ui/memory/search?q=topic+12", "/ui/sessions"):
        t0 = time.monotonic()
        page = client.get(base + path)
        timings[path] = time.monotonic() - t0
        assert page.status_code == 200, page.text[:500]
    print("page times (s):", {k: round(v, 3) for k, v in timings.items()})
    timeline = client.get(base + "/ui/memory/passages?page=150").text
    assert f"page 151 of {PASSAGES // 50} ({PASSAGES} in all)" in timeline
    assert "note 7500 about" in timeline and "note 7550 " not in timeline  # one page of 50, in time order
    sessions = client.get(base + "/ui/sessions").text
    assert sessions.count('href="/ui/sessions/bulk-') == SESSIONS
    assert "topic 12" in client.get(base + "/ui/memory/search?q=topic+12").text
    ranged = client.get(base + "/ui/memory/passages?start=2020-09-13T12:26:40Z&end=2020-09-13T12:36:40Z").text
    assert re.search(r"\((1[01]) in all\)", ranged), ranged[-2000:]
    one = client.get(base + "/ui/sessions/bulk-007").text
    assert "demo_pkg 1.2" in one and "f.txt" in one


async def _stdio_writes(data_dir: Path, tmp: Path) -> int:
    # (room for a session beside the 100 stored ones: the default cap is 100)
    argv = serve_argv(
        data_dir, "--embedding-model", "none", "--sandbox", "none", "--max-stored-sessions", "500"
    )
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=server_env(tmp))
    with anyio.fail_after(120):
        async with Client(params) as mcp:
            stored = structured(
                await mcp.call_tool("archival_memory_insert", {"content": "written by the stdio server"})
            )
            ran = await mcp.call_tool("run_code", {"code": "print('from stdio')", "session_id": "from-stdio"})
            assert structured(ran)["status"] == "ok"
            return int(stored["id"])


def test_it_reads_what_a_stdio_server_writes_meanwhile(
    ui: tuple[str, Path, Path, subprocess.Popen[bytes]], client: httpx2.Client
) -> None:
    link, data, tmp, _ = ui
    base = link.split("/ui/")[0]
    new_id = anyio.run(_stdio_writes, data, tmp)
    page = client.get(f"{base}/ui/memory/passages/{new_id}")
    assert page.status_code == 200 and "written by the stdio server" in page.text
    session = client.get(f"{base}/ui/sessions/from-stdio")
    assert session.status_code == 200 and "print(&#x27;from stdio&#x27;)" in session.text
    notebook = client.get(f"{base}/ui/sessions/from-stdio/notebook.ipynb")
    assert notebook.status_code == 200 and "from stdio" in notebook.text
