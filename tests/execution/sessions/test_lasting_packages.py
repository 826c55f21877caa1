"""Installed packages last with their session: after a stop, a SIGKILL or idle reaping, the
session resumes with its packages importable (before its variables come back), within the
stored-size caps, and ``list_sessions`` shows their size.

Real ``kernmind serve`` processes on one data dir (``tests/transport/procs.py``) and an
in-process server for reaping and caps; real installs with uv from a wheelhouse the test builds.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.execution.packages import PackageInstaller
from kernmind.server import create_server
from tests.conftest import make_settings, structured
from tests.execution.packages.package_sources import NpmRegistry, make_wheel
from tests.transport.procs import StdioServer, run_cli

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.slow]

BOXES = "ANSWER = 42\nclass Box:\n    def __init__(self, value):\n        self.value = value\n"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheelhouse")
    d.chmod(0o755)
    make_wheel(d, "boxes", "1.0", modules={"boxes/__init__.py": BOXES}, requires=("beta>=1",))
    make_wheel(d, "beta", "2.0")
    make_wheel(d, "bulky", "1.0", modules={"bulky/__init__.py": "", "bulky/data.txt": "x" * 1_500_000})
    return d


def sources(wheelhouse: Path) -> tuple[str, ...]:
    return ("--package-index", "none", "--find-links", str(wheelhouse))


def run(server: StdioServer, code: str, **kw: Any) -> dict[str, Any]:
    out = server.call_tool("run_code", {"code": code, **kw})["structuredContent"]
    assert out["status"] == "ok", out
    return out


def row(server: StdioServer, session_id: str) -> dict[str, Any]:
    rows = server.call_tool("list_sessions", {})["structuredContent"]["sessions"]
    [found] = [r for r in rows if r["session_id"] == session_id]
    return found


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_packages_come_back_after_a_restart_and_a_kill(
    tmp_path: Path, wheelhouse: Path, stop: signal.Signals
) -> None:
    data = tmp_path / "data"
    first = StdioServer.start(tmp_path / "a", *sources(wheelhouse), data_dir=data)
    try:
        run(first, "x = 1", session_id="pk")
        installed = first.call_tool("install_packages", {"packages": ["boxes"], "session_id": "pk"})
        assert {p["name"] for p in installed["structuredContent"]["installed"]} == {"boxes", "beta"}
        run(first, "import boxes; box = boxes.Box(7)", session_id="pk")
        assert row(first, "pk")["packages_bytes"] > 0
        first.proc.send_signal(stop)
        first.wait(60)
    finally:
        first.kill()

    listing = run_cli(["sessions", "list", "--data-dir", str(data)], tmp_path)
    header, *lines = listing.stdout.splitlines()
    [line] = [ln for ln in lines if ln.startswith("local/pk ")]
    column = header.index("PACKAGES")
    assert line[column:].split("  ")[0].endswith("KiB"), listing.stdout

    second = StdioServer.start(tmp_path / "b", *sources(wheelhouse), data_dir=data)
    try:
        stored = row(second, "pk")
        assert stored["state"] == "stored" and stored["packages_bytes"] > 0
        out = run(second, "import boxes, beta; (boxes.ANSWER, beta.VERSION)", session_id="pk")
        assert out["results"][0]["text"] == "(42, '2.0')"
        notes = " ".join(out["notes"])
        assert "its installed packages are back: beta, boxes" in notes
        if stop == signal.SIGTERM:  # variables saved at the stop: a Box unpickles (its package is back first)
            assert "box" in notes
            assert run(second, "box.value", session_id="pk")["results"][0]["text"] == "7"
        assert row(second, "pk")["packages_bytes"] == stored["packages_bytes"]
    finally:
        second.kill()


@pytest.mark.anyio
async def test_packages_come_back_after_idle_reaping_and_go_with_the_session(
    tmp_path: Path, wheelhouse: Path
) -> None:
    settings = make_settings(
        tmp_path, pool_size=0, idle_timeout=1, package_index="none", find_links=str(wheelhouse)
    )
    async with Client(create_server(settings)) as client:
        await client.call_tool("install_packages", {"packages": ["boxes"], "session_id": "idle"})
        for _ in range(100):  # unloaded by the reaper once idle
            rows = structured(await client.call_tool("list_sessions", {}))["sessions"]
            if [r["state"] for r in rows if r["session_id"] == "idle"] == ["stored"]:
                break
            await anyio.sleep(0.2)
        else:
            raise AssertionError(f"never reaped: {rows}")
        out = structured(
            await client.call_tool("run_code", {"code": "import boxes; boxes.ANSWER", "session_id": "idle"})
        )
        assert out["results"][0]["text"] == "42", out
        home = tmp_path / "sessions" / "local" / "idle"
        assert (home / "packages" / "python" / "boxes" / "__init__.py").is_file()
        await client.call_tool("close_session", {"session_id": "idle"})
    assert not home.exists()


@pytest.mark.anyio
async def test_packages_past_the_stored_size_cap_last_only_while_live(
    tmp_path: Path, wheelhouse: Path
) -> None:
    settings = make_settings(
        tmp_path, pool_size=0, max_stored_mb=1, package_index="none", find_links=str(wheelhouse)
    )
    async with Client(create_server(settings)) as client:
        small = structured(
            await client.call_tool("install_packages", {"packages": ["beta"], "session_id": "cap"})
        )
        assert not any("not stored" in n for n in small["notes"])
        big = structured(
            await client.call_tool("install_packages", {"packages": ["bulky"], "session_id": "cap"})
        )
        [note] = [n for n in big["notes"] if "not stored with it" in n]
        assert "--max-stored-mb" in note and "close_session" in note
        out = structured(
            await client.call_tool("run_code", {"code": "import bulky, beta; 'ok'", "session_id": "cap"})
        )
        assert out["results"][0]["text"] == "'ok'"  # installed for the session's life all the same
        [listed] = [
            r
            for r in structured(await client.call_tool("list_sessions", {}))["sessions"]
            if r["session_id"] == "cap"
        ]
        assert listed["packages_bytes"] == 0
    assert not (tmp_path / "sessions" / "local" / "cap" / "packages").exists()


def test_a_killed_keep_leaves_the_old_copy_or_the_new(tmp_path: Path) -> None:
    """A server killed between the renames of ``keep`` loses neither copy (``recover``)."""
    from kernmind.execution.packages import stored
    from kernmind.execution.packages.layer import Layer

    home = tmp_path / "home"
    home.mkdir()
    first = Layer(tmp_path / "one").create()
    (first.python / "old.py").write_text("A = 1\n")
    stored.keep(first, home)
    (home / "packages").rename(home / ".packages-old")  # killed after the first rename
    (home / ".packages-new").mkdir()  # and a half-made new copy
    restored = stored.restore(home, lambda: Layer(tmp_path / f"fresh-{time.monotonic_ns()}").create())
    assert restored is not None and (restored.python / "old.py").read_text() == "A = 1\n"
    assert not (home / ".packages-old").exists() and not (home / ".packages-new").exists()


@pytest.mark.anyio
@pytest.mark.skipif(PackageInstaller.find_deno() is None, reason="Deno is not installed")
async def test_npm_packages_come_back_too(
    tmp_path: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with NpmRegistry(
        {"leftpad": {"1.0.0": "module.exports = (s, n) => String(s).padStart(n, '.');"}}
    ).running() as reg:
        monkeypatch.setenv(
            "NPM_CONFIG_REGISTRY", f"{reg.url}/"
        )  # the host's npm setting, as an operator sets it
        settings = make_settings(tmp_path, pool_size=0)
        async with Client(create_server(settings)) as client:
            args = {"packages": ["npm:leftpad@1"], "language": "javascript", "session_id": "js"}
            structured(await client.call_tool("install_packages", args))
        async with Client(create_server(settings)) as client:  # a new server on the same data dir
            code = 'import pad from "npm:leftpad@1";\nconsole.log(pad(7, 3))'
            out = structured(
                await client.call_tool(
                    "run_code", {"code": code, "language": "javascript", "session_id": "js"}
                )
            )
    assert out["status"] == "ok" and "".join(out["logs"]["stdout"]).strip() == "..7", out
    assert "its installed packages are back: npm:leftpad" in " ".join(out["notes"])
