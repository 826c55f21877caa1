"""``kernmind memory export|import`` through the real command line (``kernmind.cli.main``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from kernmind.cli import main
from kernmind.memory import query_cache
from kernmind.memory.archival import Archive
from kernmind.memory.database import PassageFilter
from kernmind.memory.embeddings import StaticEmbedder
from kernmind.memory.recall import Recall
from kernmind.memory.records import MessageFilter, PassageIn
from kernmind.memory.store import MemoryStore

from .conftest import another_db_location, db_location

pytestmark = pytest.mark.slow  # the CLI as a user runs it, on SQLite and on a real PostgreSQL


@pytest.fixture(autouse=True)
def query_vectors_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``memory search`` keeps query vectors in the user's cache: the tests keep theirs apart."""
    monkeypatch.setattr(query_cache, "default_path", lambda: tmp_path / "query-vectors.sqlite")


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
            assert len(await store.passages.vector_ids(StaticEmbedder().model)) == 2
            found = await store.conversations.search_text("tea", MessageFilter(), 5)
            assert [m.content for m in found] == ["Remember my tea preference"]

    anyio.run(check)
    assert main(argv) == 1  # the destination holds the namespace now: refused, unchanged
    assert "already holds memory" in capsys.readouterr().err


def seed_history(db: str, agent: str) -> dict[str, int]:
    """Passages with occurred_at and a supersede chain (lyon <- porto <- oslo) beside a live one."""

    async def go() -> dict[str, int]:
        async with MemoryStore(db, agent) as store:
            ids = {}
            for name, text, when, replaces in [
                ("lyon", "Ana lives in Lyon", 1_600_000_000.0, []),
                ("porto", "Ana moved to Porto", 1_650_000_000.0, ["lyon"]),
                ("oslo", "Ana moved to Oslo", 1_700_000_000.0, ["porto"]),
                ("tea", "Ana likes tea", 1_610_000_000.0, []),
            ]:
                stored = await store.passages.store(
                    PassageIn(text, ["ana"], occurred_at=when), [ids[r] for r in replaces]
                )
                ids[name] = stored.id
            return ids

    return anyio.run(go)


def facts(db: str, agent: str) -> list[tuple[str, float, str | None]]:
    """(content, occurred_at, content of the passage that superseded it) for every passage."""

    async def go() -> list[tuple[str, float, str | None]]:
        async with MemoryStore(db, agent) as store:
            rows = await store.passages.all()
        by_id = {r.id: r.content for r in rows}
        return sorted((r.content, r.occurred_at, by_id.get(r.superseded_by or 0)) for r in rows)

    return anyio.run(go)


def test_export_import_and_migrate_carry_when_and_what_replaced_what(tmp_path: Path) -> None:
    db = db_location(tmp_path)
    seed_history(db, "alice")
    expected = [
        ("Ana likes tea", 1_610_000_000.0, None),
        ("Ana lives in Lyon", 1_600_000_000.0, "Ana moved to Porto"),
        ("Ana moved to Oslo", 1_700_000_000.0, None),
        ("Ana moved to Porto", 1_650_000_000.0, "Ana moved to Oslo"),
    ]
    assert facts(db, "alice") == expected
    out = tmp_path / "alice.json"
    assert main(["memory", "export", "--db", db, "--agent", "alice", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["format_version"] == 3
    lyon = next(p for p in doc["passages"] if p["content"] == "Ana lives in Lyon")
    assert lyon["occurred_at"] == "2020-09-13T12:26:40.000000Z" and isinstance(lyon["superseded_by"], int)

    db2 = another_db_location(tmp_path, "other.db")
    seed_history(db2, "bob")  # ids in the second database differ from the export's
    assert main(["memory", "import", str(out), "--db", db2, "--agent", "carol"]) == 0
    assert facts(db2, "carol") == expected
    assert main(["memory", "import", str(out), "--db", db2, "--agent", "carol", "--replace"]) == 0
    assert facts(db2, "carol") == expected  # a second import adds nothing and links nothing new
    assert facts(db2, "bob") == expected  # the other namespace is untouched

    dest = another_db_location(tmp_path, "dest.db")
    argv = ["memory", "migrate", "--from", db, "--to", dest, "--agent", "alice"]
    assert main(argv) == 0
    assert facts(dest, "alice") == expected

    # the moved passages behave: exact duplicates are found by their recomputed digests
    async def duplicate() -> int | None:
        async with MemoryStore(dest, "alice") as store:
            return (await store.passages.store(PassageIn("ANA LIKES TEA"))).duplicate_of

    assert anyio.run(duplicate) is not None


def test_a_version_one_export_imports_with_occurred_at_from_created_at(tmp_path: Path) -> None:
    doc = {
        "format": "kernmind-memory",
        "format_version": 1,
        "blocks": [],
        "passages": [
            {"content": "met Ada in Paris", "tags": ["travel"], "created_at": "2024-03-10T12:00:00Z"}
        ],
    }
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc))
    db = db_location(tmp_path)
    assert main(["memory", "import", str(path), "--db", db]) == 0
    assert facts(db, "default") == [("met Ada in Paris", 1710072000.0, None)]


def test_an_export_whose_supersede_links_loop_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {
        "format": "kernmind-memory",
        "passages": [
            {"id": 1, "content": "a", "created_at": "2024-03-10T12:00:00Z", "superseded_by": 2},
            {"id": 2, "content": "b", "created_at": "2024-03-10T12:00:00Z", "superseded_by": 1},
        ],
    }
    path = tmp_path / "loop.json"
    path.write_text(json.dumps(doc))
    db = db_location(tmp_path)
    assert main(["memory", "import", str(path), "--db", db]) == 1
    assert "loop" in capsys.readouterr().err
    assert facts(db, "default") == []
    doc["passages"][1]["id"] = 1
    path.write_text(json.dumps(doc))
    assert main(["memory", "import", str(path), "--db", db]) == 1
    assert "more than once" in capsys.readouterr().err


def test_search_from_the_shell_shows_superseded_passages_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location(tmp_path)
    ids = seed_history(db, "default")
    capsys.readouterr()
    assert main(["memory", "search", "Ana moved", "--db", db, "--embedding-model", "none"]) == 0
    out = capsys.readouterr().out
    assert "Ana moved to Oslo" in out and "Porto" not in out
    assert (
        main(
            ["memory", "search", "Ana moved", "--include-superseded", "--db", db, "--embedding-model", "none"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"superseded by #{ids['oslo']}" in out and "2022-04-15T" in out


def test_search_from_the_shell_reads_a_thread_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location(tmp_path)

    async def fill() -> None:
        async with MemoryStore(db) as store:
            archive = Archive(store.passages)
            for turn in ["Ana: hello", "Ben: hi there", "Ana: bye"]:
                await archive.insert(turn, thread="call-7")
            await archive.insert("Ana: hello from elsewhere", thread="call-8")

    anyio.run(fill)
    capsys.readouterr()
    assert main(["memory", "search", "", "--thread", "call-7", "--db", db, "--embedding-model", "none"]) == 0
    out = capsys.readouterr().out
    assert "ranked by time" in out and "elsewhere" not in out
    assert out.index("Ana: hello") < out.index("Ben: hi there") < out.index("Ana: bye")
    assert "thread call-7 #2" in out
