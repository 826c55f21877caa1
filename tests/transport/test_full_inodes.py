"""A disk out of inodes stops no one: over real HTTP, two principals, the data dir on a tmpfs
with few inodes (``nr_inodes``), filled up to the last one by the test.

Bytes are left but no file can be made: every whole-file write (a temporary file renamed over
the record) fails at its creation with ENOSPC, where a full disk fails half-way. While no inode
is left: calls are answered (their result, and a note in words where a record could not be
written; or a refusal in words), never with ``internal error``; both principals are served;
no record is left broken. Once inodes are freed, everything recovers without a restart.
Needs root (to mount the tmpfs); skipped otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.tokens_file import TokenFile
from tests.conftest import error_text, structured
from tests.transport.procs import HttpServer, http_client, start_http, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.xdist_group("transport"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs as the data dir needs root"),
]

INODES = 4000
FULL = "the disk is full"


class Deployment:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        file = TokenFile(root / "tokens.json")
        self.tokens = {name: file.add(name, []) for name in ("alice", "bob")}
        self.server: HttpServer | None = None
        self.ballast = self.data / "ballast"

    def start(self) -> HttpServer:
        self.server = start_http(
            self.root,
            *("--tokens", str(self.root / "tokens.json"), "--sandbox", "none", "--embedding-model", "none"),
        )
        return self.server

    def client(self, who: str) -> Client:
        assert self.server is not None
        return http_client(self.server.url, {"Authorization": f"Bearer {self.tokens[who]}"}, "auto")

    def take_every_inode(self) -> int:
        """Make empty files until no inode is left (bounded by the tmpfs's count)."""
        self.ballast.mkdir(exist_ok=True)
        made = len(os.listdir(self.ballast))
        for _ in range(INODES + 10):
            try:
                (self.ballast / str(made)).touch(exist_ok=False)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return made
            made += 1
        raise AssertionError("the tmpfs never ran out of inodes")

    def free(self) -> None:
        for name in os.listdir(self.ballast):
            (self.ballast / name).unlink()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    (tmp_path / "data").mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size=256m,nr_inodes={INODES}", "tmpfs", str(tmp_path / "data")],
        check=True,
    )
    deployment = Deployment(tmp_path)
    try:
        yield deployment
    finally:
        if deployment.server is not None and deployment.server.proc.poll() is None:
            deployment.server.proc.kill()
            deployment.server.proc.wait()
        subprocess.run(["umount", "-l", str(tmp_path / "data")], check=False)


async def call(client: Client, tool: str, **arguments: Any) -> str:
    """The call's text: its structured result, or its error; never an internal error."""
    with anyio.fail_after(60):
        result = await client.call_tool(tool, arguments)
    text = error_text(result) if result.is_error else json.dumps(result.structured_content)
    assert "internal error" not in text, text
    return text


def whole_records(data: Path) -> None:
    """Every session's meta parses, every history line parses, no temporary file is left (one
    may exist for a moment: a meta being written, or retried by the reaper after a failure)."""
    for meta in data.glob("sessions/*/*/meta.json"):
        json.loads(meta.read_bytes())

        def left(folder: Path = meta.parent) -> list[str]:
            return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]

        assert wait_until(lambda: not left(), 5), left()
    for history in data.glob("sessions/*/*/history.jsonl"):
        for line in history.read_bytes().splitlines():
            json.loads(line)


async def test_a_disk_out_of_inodes_stops_no_one_and_recovers(deployment: Deployment) -> None:
    server = deployment.start()
    async with deployment.client("alice") as alice, deployment.client("bob") as bob:
        structured(await alice.call_tool("run_code", {"code": "x = 1", "session_id": "s"}))
        structured(await bob.call_tool("run_code", {"code": "y = 1", "session_id": "b"}))
        structured(await alice.call_tool("memory_create", {"label": "notes", "value": "one"}))

        deployment.take_every_inode()
        for want in ("2", "3", "4"):  # the server's reserve (one file) is given up at the first failure
            for client, code, sid in ((alice, "x += 1; x", "s"), (bob, "y += 1; y", "b")):
                out = json.loads(await call(client, "run_code", code=code, session_id=sid))
                assert out["results"][0]["text"] == want, out  # a live session goes on
            deployment.take_every_inode()
        text = await call(alice, "run_code", code="1", session_id="new")  # a new session needs files
        assert f"{FULL}: could not create session 'new'" in text, text
        text = await call(bob, "run_code", code="1", session_id="j", background=True)
        assert f"{FULL}: could not start a background job" in text, text
        await call(alice, "memory_append", label="notes", content="two")  # answered either way
        whole_records(deployment.data)

        deployment.free()
        out = structured(await alice.call_tool("run_code", {"code": "x", "session_id": "s"}))
        assert out["results"][0]["text"] in ("4", "3", "2"), out  # the session lived on
        out = structured(await bob.call_tool("run_code", {"code": "6 * 7", "session_id": "new-b"}))
        assert out["results"][0]["text"] == "42", out
        structured(await alice.call_tool("memory_append", {"label": "notes", "content": "three"}))
        whole_records(deployment.data)
    assert server.stop() == 0
    log = server.log_text()
    assert "Exception in ASGI application" not in log and "internal error (ref" not in log
