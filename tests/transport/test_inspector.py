"""A real third-party client: the MCP Inspector CLI (``@modelcontextprotocol/inspector``, Node).

It drives ``kernmind serve`` over stdio (the Inspector launches the server) and over
Streamable HTTP (with the bearer token in ``--header``), in both protocol eras
(``--protocol-era legacy`` = the 2025-11-25 handshake, ``modern`` = 2026-07-28): tools/list,
a ``run_code`` call, and a memory write then read (``memory_create`` / ``memory_read``).

The Inspector is found at ``$KERNMIND_INSPECTOR`` or in ``build/inspector`` where
``.ci/run`` installs it (``npm install --prefix build/inspector @modelcontextprotocol/inspector@2.12.0``);
without it (or without ``node``) these tests skip and say how to install it. It keeps state
in ``~/.mcp-inspector``, so each run gets a private, writable HOME.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.transport.procs import HttpServer, serve_argv, server_env, start_http

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
INSPECTOR_VERSION = "2.12.0"
INSTALL_HINT = (
    "MCP Inspector CLI not installed: run `bash .ci/run`, or `npm install --prefix build/inspector "
    f"@modelcontextprotocol/inspector@{INSPECTOR_VERSION}` (needs node/npm), or point "
    "KERNMIND_INSPECTOR at an mcp-inspector executable"
)
TOKEN = "inspector-token-5b9c"
ERAS = ["legacy", "modern"]


def inspector_bin() -> str | None:
    explicit = os.environ.get("KERNMIND_INSPECTOR")
    if explicit:
        return explicit if Path(explicit).exists() or shutil.which(explicit) else None
    local = REPO / "build" / "inspector" / "node_modules" / ".bin" / "mcp-inspector"
    return str(local) if local.exists() else None


@pytest.fixture(scope="module")
def inspector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    binary = inspector_bin()
    if binary is None:
        pytest.skip(INSTALL_HINT)
    if shutil.which("node") is None:
        pytest.skip("MCP Inspector tests need `node` on PATH (Node 20+)")
    home = tmp_path_factory.mktemp("inspector-home")

    def run(*args: str, era: str) -> dict[str, Any]:
        """One Inspector CLI invocation; returns its JSON result (exit 0 required)."""
        argv = [binary, "--cli", "--format", "json", "--protocol-era", era, *args]
        env = server_env(home, HOME=str(home), NO_COLOR="1")
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
        assert proc.returncode == 0, f"{argv}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
        return json.loads(proc.stdout)["result"]

    yield run


def _check_era(result: dict[str, Any], era: str) -> None:
    # A 2026-07-28 server stamps serverInfo into every result's _meta; a 2025-11-25 one does not.
    stamped = "io.modelcontextprotocol/serverInfo" in (result.get("_meta") or {})
    assert stamped == (era == "modern"), result.get("_meta")


def _exercise(run: Any, target: list[str], era: str, label: str) -> None:
    """tools/list, run_code, memory write + read through the Inspector."""
    listed = run(*target, "--method", "tools/list", era=era)
    names = {t["name"] for t in listed["tools"]}
    assert {"run_code", "list_sessions", "memory_create", "memory_read", "archival_memory_search"} <= names
    run_code = next(t for t in listed["tools"] if t["name"] == "run_code")
    assert "outputSchema" in run_code

    code = json.dumps({"code": "import sys\nprint('hello from', sys.version_info[0])\n6 * 7"})
    ran = run(*target, "--method", "tools/call", "--tool-name", "run_code", "--tool-args-json", code, era=era)
    _check_era(ran, era)
    out = ran["structuredContent"]
    assert out["status"] == "ok", out
    assert out["results"][0]["text"] == "42"
    assert out["logs"]["stdout"] == ["hello from 3\n"]

    value = f"written by the MCP Inspector ({era})"
    args = json.dumps({"label": label, "value": value, "description": "inspector test"})
    created = run(
        *target, "--method", "tools/call", "--tool-name", "memory_create", "--tool-args-json", args, era=era
    )
    assert created["isError"] is False
    read = run(
        *target,
        "--method",
        "tools/call",
        "--tool-name",
        "memory_read",
        "--tool-args-json",
        json.dumps({"label": label}),
        era=era,
    )
    _check_era(read, era)
    assert read["structuredContent"]["value"] == value
    assert read["structuredContent"]["version"] == 1


def test_inspector_over_stdio_both_eras(inspector: Any, tmp_path: Path) -> None:
    """The Inspector launches ``kernmind serve`` itself, once per call (memory persists in the DB)."""

    def era_run(era: str) -> None:
        data = tmp_path / era
        target = serve_argv(data)
        _exercise(inspector, target, era, label=f"stdio-{era}")

    # The two eras are independent (own data directories): run them side by side.
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(era_run, era) for era in ERAS]:
            future.result()


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory, inspector: Any) -> Iterator[HttpServer]:
    server = start_http(tmp_path_factory.mktemp("inspector-http"), token=TOKEN)
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log_text()


@pytest.mark.parametrize("era", ERAS)
def test_inspector_over_http_with_token(inspector: Any, http_server: HttpServer, era: str) -> None:
    target = [http_server.url, "--transport", "http", "--header", f"Authorization: Bearer {TOKEN}"]
    _exercise(inspector, target, era, label=f"http-{era}")


def test_inspector_without_token_is_refused(inspector: Any, http_server: HttpServer) -> None:
    binary = inspector_bin()
    assert binary is not None
    proc = subprocess.run(
        [
            binary,
            "--cli",
            "--format",
            "json",
            "--stored-auth-only",
            http_server.url,
            "--method",
            "tools/list",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=server_env(http_server.data_dir.parent, HOME=str(http_server.data_dir.parent / "home")),
        check=False,
    )
    assert proc.returncode != 0
    assert "tools" not in proc.stdout


def test_inspector_strict_schema_check_finds_nothing(inspector: Any, tmp_path: Path) -> None:
    """``--strict`` reports every tool-schema portability problem (errors and warnings) on
    stderr; kernmind's 25 tools must give it none (issue 25: an empty ``items`` schema in the
    run_code / job_status / job_cancel output schemas was one)."""
    binary = inspector_bin()
    assert binary is not None
    home = tmp_path / "home"
    proc = subprocess.run(
        [
            binary,
            "--cli",
            "--format",
            "json",
            "--strict",
            *serve_argv(tmp_path / "data"),
            "--method",
            "tools/list",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=server_env(tmp_path, HOME=str(home), NO_COLOR="1"),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(proc.stdout)["result"]["tools"]) >= 20
    problems = [line for line in proc.stderr.splitlines() if line.startswith(("Warning:", "Error:"))]
    assert problems == [], proc.stderr[-3000:]
