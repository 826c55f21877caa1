"""End to end over real stdio: `python -m kernmind serve` as a subprocess, the SDK's stdio client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import structured

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("python"), pytest.mark.slow]


def server_params(tmp_path: Path, *extra: str) -> StdioServerParameters:
    args = ["-m", "kernmind", "serve", "--data-dir", str(tmp_path), "--pool-size", "1", *extra]
    return StdioServerParameters(command=sys.executable, args=args)


async def test_stdio_server_runs_python_with_state_and_images(tmp_path: Path) -> None:
    async with Client(server_params(tmp_path)) as client:
        assert client.server_info is not None and client.server_info.name == "kernmind"
        assert client.server_info.version  # read from the installed distribution
        names = {t.name for t in (await client.list_tools()).tools}
        assert {
            "run_code",
            "list_sessions",
            "close_session",
            "upload_file",
            "download_file",
            "list_files",
        } <= names
        first = structured(
            await client.call_tool("run_code", {"code": "import sys\nprint('to stdout')\nn = 20"})
        )
        assert first["logs"]["stdout"] == ["to stdout\n"]
        second = structured(await client.call_tool("run_code", {"code": "n + 22"}))
        assert second["results"][0]["text"] == "42"
        plot = await client.call_tool(
            "run_code", {"code": "import matplotlib.pyplot as plt\nplt.bar([1, 2], [3, 4])"}
        )
        assert [b.type for b in plot.content].count("image") == 1


def test_doctor_reports_a_working_setup(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kernmind", "doctor", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "live test      ok" in proc.stdout
    assert "python         ok" in proc.stdout
    assert str(tmp_path / "kernmind.db") in proc.stdout
    assert "meaning search ok — sentence-transformers/all-MiniLM-L6-v2 loaded in" in proc.stdout
    assert " INFO " not in proc.stderr  # routine lines would land after "ready:" on a terminal


def templates_of_server(data_dir: Path) -> list[int]:
    """Fork-server templates whose parent is the `kernmind serve` using ``data_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parent = Path(f"/proc/{ppid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if b"forkserver/template.py" in cmdline and str(data_dir).encode() in parent:
            found.append(int(entry.name))
    return found


async def test_serve_launches_the_fork_server_template_once_before_the_handshake(tmp_path: Path) -> None:
    """`kernmind serve` starts the template before it imports the SDK (the first run_code does
    not wait for a late one); the lifespan adopts that template instead of starting another."""
    async with Client(server_params(tmp_path)) as client:
        assert templates_of_server(tmp_path)  # already there when the handshake is answered
        first = structured(await client.call_tool("run_code", {"code": "6 * 7", "reset": True}))
        assert first["results"][0]["text"] == "42"
        assert len(templates_of_server(tmp_path)) == 1
