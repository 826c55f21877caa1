"""The session store and the job records are never followed through a link nor waited on.

What is planted on the disk before the server starts: a session whose ``files/`` is a
symbolic link to a directory elsewhere, one whose ``meta.json`` is a directory, ones whose
bookkeeping files are FIFOs, and a job record that is a FIFO. Through a real MCP server
(in-process, on fake kernels: what is refused is refused before any kernel starts), every
call answers at once with a sentence, the link's target is never touched, the other
sessions keep working, and the operator can remove the damaged ones.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from kernmind.execution.sessions.disk_store import LOCAL_OWNER, SessionStore
from tests.conftest import error_text, structured
from tests.execution.fakes import fake_client, fake_settings

pytestmark = [pytest.mark.anyio, pytest.mark.fast]

CALL_LIMIT = 30  # seconds: nothing here may wait on a FIFO


def plant(data: Path, outside: Path) -> None:
    sessions = data / "sessions" / LOCAL_OWNER
    # files/ is a link to a directory outside the store
    (sessions / "linked").mkdir(parents=True)
    (sessions / "linked" / "files").symlink_to(outside, target_is_directory=True)
    # meta.json is a directory
    (sessions / "dirmeta" / "files").mkdir(parents=True)
    (sessions / "dirmeta" / "meta.json").mkdir()
    # bookkeeping files are FIFOs
    for name in (".lock", "meta.json", "history.jsonl"):
        home = sessions / f"fifo{name.replace('.', '-')}"
        (home / "files").mkdir(parents=True)
        os.mkfifo(home / name)
    jobs = data / "jobs" / LOCAL_OWNER
    jobs.mkdir(parents=True)
    os.mkfifo(jobs / "job-0123456789ab.json")


@pytest.fixture(scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Client, Path, Path]]:
    root = tmp_path_factory.mktemp("hostile-store")
    data, outside = root / "data", root / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not the session's")
    before = os.stat(outside)
    plant(data, outside)
    async with fake_client(fake_settings(data, pool_size=0)) as (client, _):
        yield client, data, outside
    after = os.stat(outside)
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)  # never chowned or chmodded


async def call(client: Client, tool: str, args: dict) -> object:
    with anyio.fail_after(CALL_LIMIT):
        return await client.call_tool(tool, args)


async def test_a_files_link_is_refused_and_its_target_is_untouched(setup: tuple[Client, Path, Path]) -> None:
    client, _, outside = setup
    for tool, args in (
        ("run_code", {"code": "open('secret.txt').read()", "session_id": "linked"}),
        ("list_files", {"session_id": "linked"}),
        ("download_file", {"path": "secret.txt", "session_id": "linked"}),
        ("upload_file", {"path": "x.txt", "content": "planted", "session_id": "linked"}),
    ):
        text = error_text(await call(client, tool, args))
        assert (
            "stored session 'linked' cannot be loaded: its files/ is a symbolic link, not a directory" in text
        ), (tool, text)
        assert "kernmind sessions rm linked" in text
        assert str(outside) not in text
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_a_meta_that_is_a_directory_is_refused_with_a_sentence(
    setup: tuple[Client, Path, Path],
) -> None:
    client, _, _ = setup
    text = error_text(await call(client, "run_code", {"code": "1", "session_id": "dirmeta"}))
    assert "its meta.json is a directory, not a file" in text, text


async def test_fifos_in_the_store_never_hang_a_call(setup: tuple[Client, Path, Path]) -> None:
    client, _, _ = setup
    listing = structured(await call(client, "list_sessions", {}))  # reads every meta and lock
    assert {"fifo-lock", "fifometa-json", "fifohistory-jsonl"} <= {
        s["session_id"] for s in listing["sessions"]
    }
    for sid, name in (
        ("fifo-lock", ".lock"),
        ("fifometa-json", "meta.json"),
        ("fifohistory-jsonl", "history.jsonl"),
    ):
        text = error_text(await call(client, "run_code", {"code": "1", "session_id": sid}))
        assert f"its {name} is a FIFO" in text, text


async def test_a_job_record_that_is_a_fifo_answers_at_once(setup: tuple[Client, Path, Path]) -> None:
    client, _, _ = setup
    for tool in ("job_status", "job_cancel"):
        text = error_text(await call(client, tool, {"job_id": "job-0123456789ab"}))
        assert "the record of job 'job-0123456789ab' is not a regular file" in text, text


async def test_healthy_sessions_keep_working_and_damaged_ones_can_be_removed(
    setup: tuple[Client, Path, Path],
) -> None:
    client, data, outside = setup
    out = structured(await call(client, "run_code", {"code": "6 * 7", "session_id": "healthy"}))
    assert out["results"][0]["text"] == "42"
    store = SessionStore(data / "sessions", max_sessions=100, max_bytes=2**40)
    for sid in ("linked", "dirmeta", "fifo-lock"):
        store.remove(LOCAL_OWNER, sid)
        assert not (data / "sessions" / LOCAL_OWNER / sid).exists()
    assert (outside / "secret.txt").read_text() == "not the session's"  # the link went, not its target
