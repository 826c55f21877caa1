"""The agent fails fast and starts fast: the key and the endpoint are checked before any MCP
server starts, with a sentence saying what to check, and nothing on the way to the first model
request waits for the conversation recorder.

Times are printed (``-s``), never asserted; what is asserted is the order of things — no
server was launched (its database was never created), no chat request was sent.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernmind.agent import Agent, AgentConfig, ModelError, ServerSpec

from .scripted_openai import ScriptedOpenAI, call, reply, tools
from .test_cli import toy_config
from .toy_server import build

pytestmark = pytest.mark.slow  # each test runs the agent (some a server too) as a subprocess

CLEAN = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNMIND_AGENT_API_KEY", "KERNMIND_AGENT_BASE_URL")


def agent(*args: str, key: str | None = "k") -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    if key is not None:
        env["OPENAI_API_KEY"] = key
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kernmind", "agent", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return proc, time.monotonic() - started


def kernmind_flags(tmp_path: Path) -> list[str]:
    return ["--sandbox", "none", "--pool-size", "0", "--data-dir", str(tmp_path / "data")]


def no_server_ran(tmp_path: Path) -> bool:
    return not (tmp_path / "data" / "kernmind.db").exists()


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listen queue is full: connections are neither accepted nor refused."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):
        client = socket.socket()
        client.setblocking(False)
        try:
            client.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(client)
    try:
        yield port
    finally:
        for s in [*fillers, server]:
            s.close()


def test_no_api_key_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc, took = agent("-p", "hi", *kernmind_flags(tmp_path), key=None)
    print(f"no key: {took:.2f} s")
    assert proc.returncode == 2, proc.stderr
    assert "no API key" in proc.stderr and "OPENAI_API_KEY" in proc.stderr and "--base-url" in proc.stderr
    assert no_server_ran(tmp_path)


def test_a_closed_port_is_reported_before_any_server_starts(tmp_path: Path, closed_port: int) -> None:
    url = f"http://127.0.0.1:{closed_port}/v1"
    proc, took = agent("-p", "hi", "--base-url", url, *kernmind_flags(tmp_path))
    print(f"closed port: {took:.2f} s")
    assert proc.returncode == 1, proc.stderr
    assert f"cannot reach the model endpoint {url} (connection refused" in proc.stderr
    assert "Check that the server is running" in proc.stderr and "--base-url" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert no_server_ran(tmp_path)


def test_an_endpoint_that_never_answers_is_reported_after_the_connect_timeout(
    tmp_path: Path, silent_port: int
) -> None:
    url = f"http://127.0.0.1:{silent_port}/v1"
    proc, took = agent("-p", "hi", "--base-url", url, "--connect-timeout", "1", *kernmind_flags(tmp_path))
    print(f"silent port, --connect-timeout 1: {took:.2f} s")
    assert proc.returncode == 1, proc.stderr
    assert f"cannot reach the model endpoint {url} (no answer within 1 s)" in proc.stderr
    assert no_server_ran(tmp_path)


def test_a_refused_key_is_reported_before_any_server_starts(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    llm.models_status = 401
    proc, took = agent("-p", "hi", "--base-url", llm.url, "--model", "scripted", *kernmind_flags(tmp_path))
    print(f"refused key: {took:.2f} s")
    assert proc.returncode == 1, proc.stderr
    assert "refused the API key (HTTP 401: Incorrect API key provided)" in proc.stderr
    assert "OPENAI_API_KEY" in proc.stderr
    assert llm.requests == [] and no_server_ran(tmp_path)


def test_a_model_the_endpoint_does_not_list_is_a_note_not_an_error(
    llm: ScriptedOpenAI, tmp_path: Path
) -> None:
    llm.models = [{"id": "llama3.1:8b"}, {"id": "qwen2.5:7b"}]
    llm.add(reply("hello"))
    cfg = str(toy_config(tmp_path))
    proc, _ = agent(
        "-p", "hi", "--base-url", llm.url, "--model", "scripted", "--no-kernmind", "--mcp-config", cfg
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello\n"
    assert "does not list model 'scripted' (it lists 2: llama3.1:8b, qwen2.5:7b)" in proc.stderr
    assert llm.model_listings == 1


@pytest.mark.anyio
async def test_the_python_api_checks_the_endpoint_before_starting_servers(closed_port: int) -> None:
    never = ServerSpec("never", "http://127.0.0.1:1/mcp")  # connecting would fail with ServerStartError
    config = AgentConfig(model="m", base_url=f"http://127.0.0.1:{closed_port}/v1", servers=[never])
    with pytest.raises(ModelError, match="connection refused"):
        async with Agent(config):
            pass


class SlowRecorder:
    """A recorder whose start is held until the test releases it (a slow disk, a model loading)."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.messages: list[dict[str, Any]] = []
        self.closed = False

    async def start(self) -> None:
        await self.release.wait()

    async def record(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    async def close(self) -> None:
        self.closed = True


@pytest.mark.anyio
async def test_the_first_model_request_does_not_wait_for_the_recorder(llm: ScriptedOpenAI) -> None:
    server, _ = build()
    recorder = SlowRecorder()
    llm.add(tools(call("add", {"a": 2, "b": 3})), reply("5"))
    config = AgentConfig(
        model="scripted",
        base_url=llm.url,
        api_key="k",
        servers=[ServerSpec("toy", server)],
        recorder=recorder,
    )
    async with Agent(config) as agent:
        with anyio.fail_after(60):
            assert (await agent.run("2+3?")).answer == "5"  # answered while the recorder is still held
        assert recorder.messages == []
        recorder.release.set()
    # leaving the agent stored everything, in order
    assert [m["role"] for m in recorder.messages] == ["user", "assistant", "tool", "assistant"]
    assert recorder.closed
