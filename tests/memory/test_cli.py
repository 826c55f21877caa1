"""``kernmind memory export|import`` through the real command line (``kernmind.cli.main``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from kernmind.cli import main
from kernmind.memory.database import PassageFilter
from kernmind.memory.records import PassageIn
from kernmind.memory.store import MemoryStore


def seed(db: Path, agent: str) -> None:
    async def go() -> None:
        async with MemoryStore(db, agent, default_blocks={"persona": "p", "human": "h"}) as store:
            await store.blocks.append("human", "Name: Ada")
            await store.blocks.create("rules", "be brief", "house rules", 100, read_only=True)
            await store.passages.add(
                [PassageIn("met Ada in Paris", ["travel"], 1710072000.0), PassageIn("Ada likes tea", [])]
            )

    anyio.run(go)


def dump(db: Path, agent: str) -> tuple[dict[str, tuple[str, str, int, bool]], list[tuple[str, list[str]]]]:
    async def go() -> tuple[dict[str, tuple[str, str, int, bool]], list[tuple[str, list[str]]]]:
        async with MemoryStore(db, agent) as store:
            blocks = {
                b.label: (b.value, b.description, b.limit, b.read_only) for b in await store.blocks.list()
            }
            passages = await store.passages.search_text("", PassageFilter(), 100, 0)
            return blocks, sorted((p.content, p.tags) for p in passages)

    return anyio.run(go)


def test_export_import_roundtrip_into_another_namespace(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    seed(db, "alice")
    out = tmp_path / "alice.json"
    assert main(["memory", "export", "--db", str(db), "--agent", "alice", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "kernmind-memory" and doc["namespace"] == "alice"
    assert {b["label"] for b in doc["blocks"]} == {"persona", "human", "rules"}
    assert {p["content"] for p in doc["passages"]} == {"met Ada in Paris", "Ada likes tea"}

    # into a second database and namespace; flags may come before or after the action
    db2 = tmp_path / "other.db"
    assert main(["memory", "--db", str(db2), "import", str(out), "--agent", "bob"]) == 0
    assert dump(db2, "bob") == dump(db, "alice")

    # dates survive: the Paris passage is still from 2024-03-10
    async def dated() -> list[str]:
        async with MemoryStore(db2, "bob") as store:
            return [
                p.content
                for p in await store.passages.search_text("", PassageFilter(end=1710115200.0), 10, 0)
            ]

    assert anyio.run(dated) == ["met Ada in Paris"]

    # importing again: blocks exist -> refused, nothing changes
    before = dump(db2, "bob")
    assert main(["memory", "import", str(out), "--db", str(db2), "--agent", "bob"]) == 1
    assert dump(db2, "bob") == before
    # with --replace: blocks overwritten, identical passages skipped (no duplicates)
    assert main(["memory", "import", str(out), "--db", str(db2), "--agent", "bob", "--replace"]) == 0
    assert dump(db2, "bob") == before


def test_import_over_untouched_default_blocks(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    seed(db, "alice")
    out = tmp_path / "a.json"
    assert main(["memory", "export", "--db", str(db), "--agent", "alice", "-o", str(out)]) == 0

    # a server already ran on the new machine and seeded empty persona/human blocks
    async def fresh_server_namespace() -> None:
        async with MemoryStore(tmp_path / "new.db", default_blocks={"persona": "p", "human": "h"}) as store:
            assert [b.label for b in await store.blocks.list()] == ["persona", "human"]

    anyio.run(fresh_server_namespace)
    assert main(["memory", "import", str(out), "--db", str(tmp_path / "new.db")]) == 0
    blocks, _ = dump(tmp_path / "new.db", "default")
    assert blocks["human"][0] == "Name: Ada"


def test_export_to_stdout_with_history(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    seed(db, "default")
    proc = subprocess.run(
        [sys.executable, "-m", "kernmind", "memory", "export", "--with-history", "--db", str(db)],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(proc.stdout)
    assert [h["op"] for h in doc["history"] if h["label"] == "human"] == ["seed", "append"]


@pytest.mark.parametrize("content", ["not json", '{"format": "other"}', "[1, 2]"])
def test_import_rejects_bad_files(tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["memory", "import", str(bad), "--db", str(tmp_path / "m.db")]) == 1
    assert "kernmind memory import" in capsys.readouterr().err
    assert main(["memory", "import", "--db", str(tmp_path / "m.db")]) == 2
