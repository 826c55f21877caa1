"""``kernmind memory export|import`` through the real command line (``kernmind.cli.main``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from kernmind.cli import main
from kernmind.memory.conversations import MessageFilter
from kernmind.memory.database import PassageFilter
from kernmind.memory.embeddings import StaticEmbedder
from kernmind.memory.recall import Recall
from kernmind.memory.records import PassageIn
from kernmind.memory.store import MemoryStore

from .conftest import another_db_location, db_location


def seed(db: str, agent: str) -> None:
    async def go() -> None:
        async with MemoryStore(db, agent, default_blocks={"persona": "p", "human": "h"}) as store:
            await store.blocks.append("human", "Name: Ada")
            await store.blocks.create("rules", "be brief", "house rules", 100, read_only=True)
            await store.passages.add(
                [PassageIn("met Ada in Paris", ["travel"], 1710072000.0), PassageIn("Ada likes tea", [])]
            )

    anyio.run(go)


def dump(db: str, agent: str) -> tuple[dict[str, tuple[str, str, int, bool]], list[tuple[str, list[str]]]]:
    async def go() -> tuple[dict[str, tuple[str, str, int, bool]], list[tuple[str, list[str]]]]:
        async with MemoryStore(db, agent) as store:
            blocks = {
                b.label: (b.value, b.description, b.limit, b.read_only) for b in await store.blocks.list()
            }
            passages = await store.passages.search_text("", PassageFilter(), 100, 0)
            return blocks, sorted((p.content, p.tags) for p in passages)

    return anyio.run(go)


def test_export_import_roundtrip_into_another_namespace(tmp_path: Path) -> None:
    db = db_location(tmp_path)
    seed(db, "alice")
    out = tmp_path / "alice.json"
    assert main(["memory", "export", "--db", str(db), "--agent", "alice", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "kernmind-memory" and doc["namespace"] == "alice"
    assert {b["label"] for b in doc["blocks"]} == {"persona", "human", "rules"}
    assert {p["content"] for p in doc["passages"]} == {"met Ada in Paris", "Ada likes tea"}

    # into a second database and namespace; flags may come before or after the action
    db2 = another_db_location(tmp_path, "other.db")
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
    db = db_location(tmp_path)
    seed(db, "alice")
    out = tmp_path / "a.json"
    assert main(["memory", "export", "--db", str(db), "--agent", "alice", "-o", str(out)]) == 0

    # a server already ran on the new machine and seeded empty persona/human blocks
    new = another_db_location(tmp_path, "new.db")

    async def fresh_server_namespace() -> None:
        async with MemoryStore(new, default_blocks={"persona": "p", "human": "h"}) as store:
            assert [b.label for b in await store.blocks.list()] == ["persona", "human"]

    anyio.run(fresh_server_namespace)
    assert main(["memory", "import", str(out), "--db", new]) == 0
    blocks, _ = dump(new, "default")
    assert blocks["human"][0] == "Name: Ada"


def test_export_to_stdout_with_history(tmp_path: Path) -> None:
    db = db_location(tmp_path)
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
    assert main(["memory", "import", str(bad), "--db", db_location(tmp_path)]) == 1
    assert "kernmind memory import" in capsys.readouterr().err
    assert main(["memory", "import", "--db", db_location(tmp_path)]) == 2


def test_flags_may_come_anywhere(tmp_path: Path) -> None:
    """import --data-dir DIR FILE, FILE --data-dir DIR, and --data-dir before the action all work."""
    db = tmp_path / "src.db"
    seed(db, "alice")
    out = tmp_path / "a.json"
    assert main(["memory", "export", "--db", str(db), "--agent", "alice", "-o", str(out)]) == 0
    for i, order in enumerate(
        [
            ["memory", "import", "--data-dir", "{d}", str(out)],
            ["memory", "import", str(out), "--data-dir", "{d}"],
            ["memory", "--data-dir", "{d}", "import", str(out)],
            ["memory", "--data-dir", "{d}", "import", "--replace", str(out), "--agent", "default"],
        ]
    ):
        d = tmp_path / f"dir{i}"
        assert main([a.replace("{d}", str(d)) for a in order]) == 0, order
        assert dump(d / "kernmind.db", "default") == dump(db, "alice"), order


def test_memory_help_lists_only_memory_settings(capsys: pytest.CaptureFixture[str]) -> None:
    """kernmind memory --help shows storage and memory flags, not the server's."""
    with pytest.raises(SystemExit):
        main(["memory", "--help"])
    text = capsys.readouterr().out
    for flag in ("--db", "--agent", "--embedding-model", "show", "search", "export", "import"):
        assert flag in text
    for flag in ("--sandbox", "--pool-size", "--transport", "--port", "--token", "--timeout", "--memory-mb"):
        assert flag not in text


def test_show_lists_blocks_and_prints_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """memory show: a table of the blocks; memory show LABEL: that block as the agent sees it."""
    db = db_location(tmp_path)
    seed(db, "default")
    capsys.readouterr()
    assert main(["memory", "show", "--db", str(db)]) == 0
    table = capsys.readouterr().out
    assert "human" in table and "9/5000" in table and "rules" in table and "(read-only)" in table
    assert main(["memory", "show", "human", "--db", str(db)]) == 0
    assert "<value>\nName: Ada\n</value>" in capsys.readouterr().out
    assert main(["memory", "show", "nope", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "no memory block labelled 'nope'" in err and "'human'" in err


def test_search_from_the_shell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """memory search QUERY ranks archival passages like the tool (word forms, tags, meaning)."""
    db = db_location(tmp_path)
    seed(db, "default")
    capsys.readouterr()
    assert main(["memory", "search", "meeting Ada in France", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.index("met Ada in Paris") < out.index("Ada likes tea") and "ranked by hybrid" in out
    assert (
        main(["memory", "search", "Ada", "--tag", "travel", "--db", str(db), "--embedding-model", "none"])
        == 0
    )
    out = capsys.readouterr().out
    assert "ranked by bm25" in out and "met Ada in Paris" in out and "tea" not in out


def test_migrate_moves_a_namespace_with_history_vectors_and_conversations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """memory migrate --from sqlite:PATH --to DB copies everything of --agent; undo still works there."""
    source = tmp_path / "source.db"
    seed(str(source), "alice")

    async def more() -> None:
        async with MemoryStore(source, "alice") as store:
            await store.blocks.append("human", "Likes tea")
            cid = await store.conversations.start()
            await store.conversations.add(cid, "user", "Remember my tea preference")
            recall = Recall(store.passages, StaticEmbedder())
            while await recall.backfill_batch():
                pass

    anyio.run(more)
    destination = another_db_location(tmp_path, "dest.db")
    argv = ["memory", "migrate", "--from", f"sqlite:{source}", "--to", destination, "--agent", "alice"]
    assert main(argv) == 0
    assert "migrated namespace 'alice'" in capsys.readouterr().err
    assert dump(destination, "alice") == dump(str(source), "alice")

    async def check() -> None:
        async with MemoryStore(destination, "alice") as store:
            assert [h.op for h in await store.blocks.history("human")] == ["append", "append", "seed"]
            await store.blocks.undo("human")
            assert (await store.blocks.get("human")).value == "Name: Ada"
            assert await store.passages.count_vectors(StaticEmbedder().model) == 2
            found = await store.conversations.search_text("tea", MessageFilter(), 5)
            assert [m.content for m in found] == ["Remember my tea preference"]

    anyio.run(check)
    assert main(argv) == 1  # the destination holds the namespace now: refused, unchanged
    assert "already holds memory" in capsys.readouterr().err
