"""Faults on the server's own bookkeeping: ENOSPC and EIO on every session record write and
read, over real HTTP with two principals.

The faults come from diskio's fault point (``KERNMIND_TEST_DISK_FAULTS``, a file of rules
the test rewrites while the server runs): a write fails half-way through its bytes, as a disk
that fills up or breaks does, a read before it starts. For each errno, while alice's session
records (meta, history, job records) cannot be written:

- her calls answer — with their result and a note in words, or a refusal in words — and
  never ``internal error``; bob, whose records are fine, is served as usual;
- with every bookkeeping write on the server failing, both are still answered in words;
- what was stored before stays whole: the meta is the last good one and parses, the history
  has exactly its earlier lines (no half line), no temporary file is left;
- once the fault is gone, everything works again without a restart: the history records
  again, a stored session whose meta could not be read loads, its variables back.

A real full disk (tmpfs) is in test_full_disk.py; this covers EIO, which no tmpfs gives, and
each record on its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.diskio import FAULTS_VARIABLE
from kernmind.tokens_file import TokenFile
from tests.conftest import error_text, structured
from tests.transport.procs import HttpServer, http_client, start_http, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("faults"), pytest.mark.slow]

TROUBLE = {"ENOSPC": "the disk is full", "EIO": "the disk reported an I/O error"}


class Deployment:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.rules = root / "faults.json"
        self.rules.write_text("{}")
        file = TokenFile(root / "tokens.json")
        self.tokens = {name: file.add(name, []) for name in ("alice", "bob")}
        self.server = start_http(
            root,
            *("--tokens", str(root / "tokens.json"), "--sandbox", "none", "--embedding-model", "none"),
            *("--idle-timeout", "3", "--autosave-seconds", "1"),
            env={FAULTS_VARIABLE: str(self.rules)},
        )
        self.sessions = self.server.data_dir / "sessions"

    def fail(self, **rules: str) -> None:
        """Make the operations named fail: ``fail(**{"write */x": "EIO"})``; none: clear."""
        self.rules.write_text(json.dumps(rules))

    def client(self, who: str) -> Client:
        return http_client(self.server.url, {"Authorization": f"Bearer {self.tokens[who]}"}, "auto")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deployment = Deployment(tmp_path_factory.mktemp("faults"))
    try:
        yield deployment
    finally:
        server: HttpServer = deployment.server
        if server.proc.poll() is None:
            assert server.stop() == 0, server.log_text()[-3000:]


@pytest.fixture
async def alice(deployment: Deployment) -> AsyncIterator[Client]:
    deployment.fail()
    async with deployment.client("alice") as client:
        yield client
    deployment.fail()


@pytest.fixture
async def bob(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("bob") as client:
        yield client


async def run(client: Client, code: str, session: str, **extra: Any) -> dict[str, Any]:
    with anyio.fail_after(60):
        return structured(await client.call_tool("run_code", {"code": code, "session_id": session, **extra}))


def lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a history file, each parsed (a half line fails here)."""
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def no_temporary_files(folder: Path) -> None:
    """No temporary file is left behind. One can exist for a moment: the reaper retries the metas
    a failing disk held back, each through a temporary file it removes when the write fails."""

    def left() -> list[str]:
        return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]

    assert wait_until(lambda: not left(), 5), left()


def noted(out: dict[str, Any], trouble: str) -> str:
    notes = " ".join(out["notes"])
    assert trouble in notes, out["notes"]
    return notes


@pytest.mark.parametrize("name", ["ENOSPC", "EIO"])
async def test_record_writes_that_fail_answer_in_words_and_keep_what_was_stored(
    deployment: Deployment, alice: Client, bob: Client, name: str
) -> None:
    session = f"w-{name.lower()}"
    home = deployment.sessions / "alice" / session
    await run(alice, "x = 1", session)
    await run(bob, "y = 1", "b")
    history = lines(home / "history.jsonl")

    # Alice's records cannot be written: her call runs and says what it could not keep.
    deployment.fail(**{f"write {home}/*": name, f"append {home}/*": name})
    # the last good meta is the one on disk once writes fail (the call's own bookkeeping may
    # still have been writing `last_used` when it answered)
    meta = (home / "meta.json").read_bytes()
    out = await run(alice, "x += 1; x", session)
    assert out["results"][0]["text"] == "2", out
    # (a history line written after the answer that fails is told with the next call)
    out = await run(alice, "x", session)
    assert out["results"][0]["text"] == "2", out
    noted(out, TROUBLE[name])
    bob_out = await run(bob, "y + 41", "b")
    assert bob_out["results"][0]["text"] == "42", bob_out
    assert not any(trouble in " ".join(bob_out["notes"]) for trouble in TROUBLE.values()), bob_out
    assert lines(home / "history.jsonl") == history  # the half-written lines were cut back off
    assert json.loads((home / "meta.json").read_bytes()) == json.loads(meta)  # the last good one
    no_temporary_files(home)

    # Every bookkeeping write on the server fails: both are still answered in words.
    deployment.fail(**{"write *": name, "append *": name})
    for client, code, sid, want in ((alice, "x += 1; x", session, "3"), (bob, "y += 1; y", "b", "2")):
        out = await run(client, code, sid)
        assert out["results"][0]["text"] == want, out
        out = await run(client, "1", sid)
        noted(out, TROUBLE[name])
    text = error_text(await bob.call_tool("run_code", {"code": "1", "session_id": "j", "background": True}))
    assert TROUBLE[name] in text and "internal error" not in text, text

    # The disk is back: records are written again, without a restart.
    deployment.fail()
    out = await run(alice, "x", session)
    assert out["results"][0]["text"] == "3", out
    # its history line may be written just after the answer (as above)
    wait_until(lambda: (lines(home / "history.jsonl") or [{}])[-1].get("code") == "x", 10)
    recorded = lines(home / "history.jsonl")
    assert recorded[: len(history)] == history and recorded[-1]["code"] == "x", recorded
    assert json.loads((home / "meta.json").read_bytes())["session_id"] == session
    no_temporary_files(home)


async def state_of(client: Client, session: str) -> str | None:
    with anyio.fail_after(60):
        listed = structured(await client.call_tool("list_sessions", {}))
    return next((s["state"] for s in listed["sessions"] if s["session_id"] == session), None)


async def until_stored(client: Client, session: str) -> None:
    """Wait for the idle reaper to store the session (bounded)."""
    with anyio.fail_after(60):
        while (state := await state_of(client, session)) != "stored":
            assert state is not None, f"session {session!r} is gone"
            await anyio.sleep(0.25)


@pytest.mark.parametrize("name", ["ENOSPC", "EIO"])
async def test_a_session_stored_while_its_meta_cannot_be_written_loads_again(
    deployment: Deployment, alice: Client, bob: Client, name: str
) -> None:
    session = f"s-{name.lower()}"
    home = deployment.sessions / "alice" / session
    await run(alice, "kept = 'first'", session)

    deployment.fail(**{f"write {home}/meta.json": name})
    await until_stored(alice, session)  # the unload's meta write failed half-way
    assert json.loads((home / "meta.json").read_bytes())["session_id"] == session  # a whole, earlier one
    no_temporary_files(home)
    assert (await run(bob, "6 * 7", "b"))["results"][0]["text"] == "42"
    result = await alice.call_tool("run_code", {"code": "kept", "session_id": session})
    text = error_text(result) if result.is_error else json.dumps(result.structured_content)
    assert "internal error" not in text, text

    deployment.fail()
    out = await run(alice, "kept", session)
    assert out["results"][0]["text"] == "'first'", out
    json.loads((home / "meta.json").read_bytes())  # whole


async def test_a_stored_session_whose_meta_cannot_be_read_is_refused_in_words_then_loads(
    deployment: Deployment, alice: Client, bob: Client
) -> None:
    session = "r"
    home = deployment.sessions / "alice" / session
    await run(alice, "kept = 41", session)
    await until_stored(alice, session)

    deployment.fail(**{f"read {home}/meta.json": "EIO"})
    result = await alice.call_tool("run_code", {"code": "kept + 1", "session_id": session})
    if result.is_error:  # refused in words
        assert TROUBLE["EIO"] in error_text(result) and "internal error" not in error_text(result)
    else:  # or loaded from what could be read: the variables come back
        assert structured(result)["results"][0]["text"] == "42", result
    assert (await run(bob, "6 * 7", "b"))["results"][0]["text"] == "42"

    deployment.fail()
    out = await run(alice, "kept + 1", session)
    assert out["results"][0]["text"] == "42", out


# --- the tokens file ------------------------------------------------------------------------------
def replace_tokens_file(deployment: Deployment, kind: str) -> bytes:
    """Put something unreadable where the tokens file is (atomically); returns the good contents."""
    path = deployment.root / "tokens.json"
    good = path.read_bytes()
    spare = deployment.root / "tokens.new"
    if kind == "fifo":
        os.mkfifo(spare)
    elif kind == "directory":
        spare.mkdir()
    elif kind == "nested":
        spare.write_bytes(b"[" * 200_000)
    else:  # the same contents in a new file (its stamp changes), which cannot be read
        spare.write_bytes(good)
        deployment.fail(**{f"read {path}": kind})
    if kind == "directory":  # (a directory cannot be renamed over a file)
        path.unlink()
    os.replace(spare, path)
    return good


def restore_tokens_file(deployment: Deployment, good: bytes) -> None:
    path = deployment.root / "tokens.json"
    spare = deployment.root / "tokens.new"
    spare.write_bytes(good)
    if path.is_dir():
        path.rmdir()
    os.replace(spare, path)
    deployment.fail()


@pytest.mark.parametrize("kind", ["EIO", "nested", "directory", "fifo"])
async def test_a_tokens_file_that_cannot_be_read_keeps_the_last_good_one(
    deployment: Deployment, kind: str
) -> None:
    good = replace_tokens_file(deployment, kind)
    try:
        for who in ("bob", "alice"):
            with anyio.fail_after(30):  # (a FIFO waited on would hang every request: it fails here)
                async with deployment.client(who) as client:
                    assert (await run(client, "6 * 7", "t"))["results"][0]["text"] == "42"
    finally:
        restore_tokens_file(deployment, good)
    log = deployment.server.log_text()
    assert "is unusable, keeping the previous contents" in log


async def test_a_job_whose_final_record_cannot_be_written_keeps_its_result(
    deployment: Deployment, bob: Client, alice: Client
) -> None:
    records = deployment.server.data_dir / "jobs" / "bob"
    go = deployment.root / "go"  # the job ends once the fault is in place
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n6 * 7"
    with anyio.fail_after(60):
        started = await bob.call_tool("run_code", {"code": code, "session_id": "job", "background": True})
    job = structured(started)["job_id"]
    deployment.fail(**{f"write {records}/*": "EIO"})
    go.touch()

    async def status() -> dict[str, Any]:
        with anyio.fail_after(60):
            return structured(await bob.call_tool("job_status", {"job_id": job}))

    with anyio.fail_after(60):
        while (now := await status())["state"] == "running":
            assert now["job_id"] == job
            await anyio.sleep(0.25)
    assert now["state"] == "done" and now["result"]["results"][0]["text"] == "42", now  # kept in memory
    assert json.loads((records / f"{job}.json").read_bytes())["state"] == "running"  # the last good record
    no_temporary_files(records)
    assert (await run(alice, "6 * 7", "a"))["results"][0]["text"] == "42"

    deployment.fail()  # the disk is back: the next job start writes what could not be written
    with anyio.fail_after(60):
        structured(await bob.call_tool("run_code", {"code": "1", "session_id": "job2", "background": True}))
    assert json.loads((records / f"{job}.json").read_bytes())["state"] == "done"
