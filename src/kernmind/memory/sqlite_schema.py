"""The SQLite memory schema: its versioned migrations, as SQL and the Python steps after them.

Design: ``MIGRATIONS[n]`` brings a database from version ``n`` to ``n + 1`` (``PRAGMA user_version``),
then optionally a Python step (``AFTER_MIGRATION``, by the version produced); migrations are only
appended; sqlite.py runs the missing ones on open in one ``BEGIN IMMEDIATE``; postgres.py keeps the
same tables in its dialect. Error policy: a failing migration rolls back with its transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable

import aiosqlite

from kernmind.memory.fulltext import index_text
from kernmind.memory.passages import content_key

MIGRATIONS: list[str] = [
    # 1: blocks, history, namespaces, passages + FTS
    """
    CREATE TABLE namespaces (
        agent TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        archive_gen INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE blocks (
        agent TEXT NOT NULL,
        label TEXT NOT NULL,
        value TEXT NOT NULL DEFAULT '',
        description TEXT NOT NULL DEFAULT '',
        char_limit INTEGER NOT NULL,
        read_only INTEGER NOT NULL DEFAULT 0,
        version INTEGER NOT NULL DEFAULT 1,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (agent, label)
    );
    CREATE TABLE block_history (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        agent TEXT NOT NULL,
        label TEXT NOT NULL,
        version INTEGER NOT NULL,
        op TEXT NOT NULL,
        old_value TEXT,
        new_value TEXT,
        meta TEXT,
        at REAL NOT NULL,
        undone INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX block_history_by_label ON block_history (agent, label, id);
    CREATE TABLE passages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        agent TEXT NOT NULL,
        content TEXT NOT NULL,
        tags TEXT NOT NULL DEFAULT '[]',
        created_at REAL NOT NULL,
        embedding BLOB,
        embedding_model TEXT
    );
    CREATE INDEX passages_by_time ON passages (agent, created_at);
    CREATE INDEX passages_by_model ON passages (agent, embedding_model, id) WHERE embedding IS NOT NULL;
    CREATE TABLE passage_tags (
        passage_id INTEGER NOT NULL REFERENCES passages(id) ON DELETE CASCADE,
        agent TEXT NOT NULL,
        tag TEXT NOT NULL,
        PRIMARY KEY (passage_id, tag)
    );
    CREATE INDEX passage_tags_by_tag ON passage_tags (agent, tag, passage_id);
    CREATE VIRTUAL TABLE passages_fts USING fts5(
        content, content='passages', content_rowid='id', tokenize='porter unicode61'
    );
    CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN
        INSERT INTO passages_fts(rowid, content) VALUES (new.id, new.content);
    END;
    CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, content) VALUES ('delete', old.id, old.content);
        DELETE FROM passage_tags WHERE passage_id = old.id;
    END;
    """,
    # 2: the index reads coalesce(search_text, content): search_text adds CJK/Thai uni- and bigrams
    """
    ALTER TABLE passages ADD COLUMN search_text TEXT;
    DROP TRIGGER passages_ai;
    DROP TRIGGER passages_ad;
    DROP TABLE passages_fts;
    CREATE VIEW passages_search AS SELECT id, coalesce(search_text, content) AS body FROM passages;
    CREATE VIRTUAL TABLE passages_fts USING fts5(
        body, content='passages_search', content_rowid='id', tokenize='porter unicode61'
    );
    CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN
        INSERT INTO passages_fts(rowid, body) VALUES (new.id, coalesce(new.search_text, new.content));
    END;
    CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, body)
            VALUES ('delete', old.id, coalesce(old.search_text, old.content));
        DELETE FROM passage_tags WHERE passage_id = old.id;
    END;
    """,
    # 3: domain words: rows belong to a namespace (not an "agent"); history ops are verbs, not tool names
    """
    ALTER TABLE namespaces RENAME COLUMN agent TO namespace;
    ALTER TABLE blocks RENAME COLUMN agent TO namespace;
    ALTER TABLE block_history RENAME COLUMN agent TO namespace;
    ALTER TABLE passages RENAME COLUMN agent TO namespace;
    ALTER TABLE passage_tags RENAME COLUMN agent TO namespace;
    UPDATE block_history SET op = substr(op, 8) WHERE op LIKE 'memory\\_%' ESCAPE '\\';
    """,
    # 4: conversation memory: conversations and their messages, full text like passages
    """
    ALTER TABLE namespaces ADD COLUMN conversation_gen INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE conversations (
        id TEXT NOT NULL,
        namespace TEXT NOT NULL,
        started_at REAL NOT NULL,
        title TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (namespace, id)
    );
    CREATE INDEX conversations_by_namespace ON conversations (namespace, started_at);
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        meta TEXT,
        created_at REAL NOT NULL,
        search_text TEXT,
        embedding BLOB,
        embedding_model TEXT
    );
    CREATE INDEX messages_by_time ON messages (namespace, created_at);
    CREATE UNIQUE INDEX messages_in_order ON messages (namespace, conversation_id, seq);
    CREATE VIEW messages_search AS SELECT id, coalesce(search_text, content) AS body FROM messages;
    CREATE VIRTUAL TABLE messages_fts USING fts5(
        body, content='messages_search', content_rowid='id', tokenize='porter unicode61'
    );
    CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, body) VALUES (new.id, coalesce(new.search_text, new.content));
    END;
    CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, body)
            VALUES ('delete', old.id, coalesce(old.search_text, old.content));
    END;
    """,
    # 5: writes that do more than append (deletes, re-embedding) are counted apart (vector_index.py)
    """
    ALTER TABLE namespaces ADD COLUMN archive_rewrites INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE namespaces ADD COLUMN conversation_rewrites INTEGER NOT NULL DEFAULT 0;
    """,
    # 6: facts in time and facts that replace others (passages.py): when a passage's fact happened
    # (stored ones: when they were stored), the passage that superseded it, and the digest of its
    # normalised text for exact-duplicate look-ups (filled by _fill_content_keys). The full-text
    # index gets a second column, state, holding "hidden" while a passage is superseded, so
    # searches leave those out inside MATCH (fts5.py); it is rebuilt by _fill_content_keys.
    """
    ALTER TABLE passages ADD COLUMN occurred_at REAL;
    UPDATE passages SET occurred_at = created_at;
    ALTER TABLE passages ADD COLUMN superseded_by INTEGER REFERENCES passages(id) ON DELETE SET NULL;
    ALTER TABLE passages ADD COLUMN content_key TEXT;
    CREATE INDEX passages_by_occurrence ON passages (namespace, occurred_at);
    CREATE INDEX passages_by_content_key ON passages (namespace, content_key);
    CREATE INDEX passages_superseded ON passages (superseded_by) WHERE superseded_by IS NOT NULL;
    DROP TRIGGER passages_ai;
    DROP TRIGGER passages_ad;
    DROP TABLE passages_fts;
    DROP VIEW passages_search;
    CREATE VIEW passages_search AS SELECT id, coalesce(search_text, content) AS body,
        CASE WHEN superseded_by IS NULL THEN NULL ELSE 'hidden' END AS state FROM passages;
    CREATE VIRTUAL TABLE passages_fts USING fts5(
        body, state, content='passages_search', content_rowid='id', tokenize='porter unicode61'
    );
    CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN
        INSERT INTO passages_fts(rowid, body, state) VALUES (
            new.id, coalesce(new.search_text, new.content),
            CASE WHEN new.superseded_by IS NULL THEN NULL ELSE 'hidden' END
        );
    END;
    CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, body, state) VALUES (
            'delete', old.id, coalesce(old.search_text, old.content),
            CASE WHEN old.superseded_by IS NULL THEN NULL ELSE 'hidden' END
        );
        DELETE FROM passage_tags WHERE passage_id = old.id;
    END;
    CREATE TRIGGER passages_au AFTER UPDATE OF superseded_by ON passages
    WHEN (old.superseded_by IS NULL) <> (new.superseded_by IS NULL) BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, body, state) VALUES (
            'delete', old.id, coalesce(old.search_text, old.content),
            CASE WHEN old.superseded_by IS NULL THEN NULL ELSE 'hidden' END
        );
        INSERT INTO passages_fts(rowid, body, state) VALUES (
            new.id, coalesce(new.search_text, new.content),
            CASE WHEN new.superseded_by IS NULL THEN NULL ELSE 'hidden' END
        );
    END;
    """,
    # 7: threads (passages.py): the conversation, session or document a passage belongs to and its
    # position there; duplicates now also ignore format characters (zero-width, BOM), so every
    # passage's digest is computed again (_refill_content_keys)
    """
    ALTER TABLE passages ADD COLUMN thread TEXT;
    ALTER TABLE passages ADD COLUMN seq INTEGER;
    CREATE INDEX passages_in_thread ON passages (namespace, thread, seq) WHERE thread IS NOT NULL;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


async def _fill_search_text(db: aiosqlite.Connection) -> None:
    """After migration 2: compute search_text for stored passages, then rebuild the index."""
    async with db.execute("SELECT id, content FROM passages") as cur:
        rows = await cur.fetchall()
    updates = [(text, pid) for pid, content in rows if (text := index_text(content)) is not None]
    await db.executemany("UPDATE passages SET search_text = ? WHERE id = ?", updates)
    await db.execute("INSERT INTO passages_fts(passages_fts) VALUES ('rebuild')")


async def _fill_content_keys(db: aiosqlite.Connection) -> None:
    """After migration 6: the duplicate digest of every stored passage, then the index rebuilt."""
    async with db.execute("SELECT id, content FROM passages") as cur:
        rows = await cur.fetchall()
    await db.executemany(
        "UPDATE passages SET content_key = ? WHERE id = ?", [(content_key(c), i) for i, c in rows]
    )
    await db.execute("INSERT INTO passages_fts(passages_fts) VALUES ('rebuild')")


async def _refill_content_keys(db: aiosqlite.Connection) -> None:
    """After migration 7: the duplicate digest of every stored passage under the new rule (written
    only where it changed: texts holding format characters, a few if any)."""
    async with db.execute("SELECT id, content, content_key FROM passages") as cur:
        rows = await cur.fetchall()
    changed = [(key, i) for i, c, old in rows if (key := content_key(c)) != old]
    await db.executemany("UPDATE passages SET content_key = ? WHERE id = ?", changed)


# Python steps that run after a migration's SQL, by the version the migration produces.
AFTER_MIGRATION: dict[int, Callable[[aiosqlite.Connection], Awaitable[None]]] = {
    2: _fill_search_text,
    6: _fill_content_keys,
    7: _refill_content_keys,
}


def split_sql(script: str) -> list[str]:
    """Split a migration script into statements (triggers keep their inner semicolons)."""
    out: list[str] = []
    buf: list[str] = []
    for line in script.strip().splitlines():
        buf.append(line)
        joined = "\n".join(buf).strip()
        if joined.endswith(";") and sqlite3.complete_statement(joined):
            out.append(joined)
            buf = []
    if "\n".join(buf).strip():
        out.append("\n".join(buf).strip())
    return out
