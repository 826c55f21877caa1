"""The upgrade that joins the --token principal's earlier memory (``default/<agent>``) to the
local user's (``<agent>``), on a real SQLite file, through ``kernmind memory show``; and its
stored sessions (``sessions/default/<id>``) moved to the local user's."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from kernmind.cli import main
from kernmind.execution.sessions.disk_store import SessionStore
from kernmind.memory.database import PassageFilter
from kernmind.memory.records import PassageIn
from kernmind.memory.store import MemoryStore

from .conftest import db_location

pytestmark = pytest.mark.slow  # real stores on SQLite and on a real PostgreSQL

DEFAULTS = {"persona": "who I am", "human": "who you are"}


def _write_both(db: str) -> None:
    async def go() -> None:
        async with MemoryStore(db, "default/default", default_blocks=DEFAULTS) as old:
            await old.blocks.append("human", "Name: Ada (told over HTTP)")
            await old.blocks.create("projects", "kernmind", "what I work on", 500)
            await old.passages.add([PassageIn("met Ada in Paris over HTTP", ["travel"], 1710072000.0)])
            await old.conversations.start("old chat", conversation_id="c1")
            await old.conversations.add("c1", "user", "remember the bees")
        async with MemoryStore(db, "default", default_blocks=DEFAULTS) as new:
            await new.blocks.append("human", "Name: Ada (told over stdio)")
            await new.passages.add([PassageIn("Ada likes tea", [])])
            await new.conversations.start("new chat", conversation_id="c1")

    anyio.run(go)


def _read(db: str, namespace: str) -> tuple[dict[str, str], list[str]]:
    async def go() -> tuple[dict[str, str], list[str]]:
        async with MemoryStore(db, namespace) as store:
            blocks = {b.label: b.value for b in await store.blocks.list()}
            passages = await store.passages.search_text("", PassageFilter(), 100, 0)
            return blocks, sorted(p.content for p in passages)

    return anyio.run(go)


def test_memory_show_moves_the_old_token_namespace_in_and_keeps_both_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location(tmp_path)
    _write_both(db)
    capsys.readouterr()
    assert main(["memory", "show", "--db", str(db)]) == 0
    out = capsys.readouterr()
    assert "namespace 'default'" in out.out  # it names what it shows
    assert "human-from-http" in out.err and "moved" in out.err
    blocks, passages = _read(db, "default")
    assert blocks["human"] == "Name: Ada (told over stdio)"
    assert blocks["human-from-http"] == "Name: Ada (told over HTTP)"  # both kept, one renamed
    assert blocks["projects"] == "kernmind"
    assert blocks["persona"] == ""  # untouched defaults: one left, no duplicate
    assert "persona-from-http" not in blocks
    assert passages == ["Ada likes tea", "met Ada in Paris over HTTP"]
    assert "'c1-from-http'" in out.err  # a conversation id both had: both kept
    assert _read(db, "default/default") == ({}, [])  # nothing left behind, nothing twice
    assert main(["memory", "show", "--db", str(db)]) == 0  # a second run moves nothing
    assert "moved" not in capsys.readouterr().err
    assert _read(db, "default")[1] == passages


def test_the_tokens_sessions_become_the_local_users(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    for owner, sid in (("default", "analysis"), ("default", "shared"), ("local", "shared")):
        home = root / owner / sid
        (home / "files").mkdir(parents=True)
        (home / "files" / "data.csv").write_text(f"{owner}\n")
        (home / "meta.json").write_text(json.dumps({"owner": owner, "session_id": sid}))
    store = SessionStore(root, max_sessions=100, max_bytes=2**30)
    rows = {(s.meta.owner, s.meta.session_id) for s in store.list()}
    assert rows == {("local", "analysis"), ("local", "shared"), ("local", "shared-from-http")}
    assert (root / "local" / "shared-from-http" / "files" / "data.csv").read_text() == "default\n"
    assert (root / "local" / "shared" / "files" / "data.csv").read_text() == "local\n"
    assert not (root / "default").exists() and len(store.moved) == 2


def test_the_tokens_finished_jobs_become_the_local_users(tmp_path: Path) -> None:
    from kernmind.execution.sessions.jobs import adopt_legacy_jobs

    old = tmp_path / "jobs" / "default"
    old.mkdir(parents=True)
    (old / "job-a.json").write_text(json.dumps({"id": "job-a", "owner": "default", "state": "done"}))
    (old / "job-b.json").write_text(json.dumps({"id": "job-b", "owner": "default", "state": "running"}))
    assert adopt_legacy_jobs(tmp_path / "jobs") == 1
    moved = json.loads((tmp_path / "jobs" / "local" / "job-a.json").read_text())
    assert moved["owner"] == "local" and moved["state"] == "done"
    assert (old / "job-b.json").exists()  # an older server's running job stays until it ends
