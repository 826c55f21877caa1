"""Fixtures for memory tests: a real kernmind server in-process, helpers, and a tiny embeddings server.

The embeddings server is a real OpenAI-compatible HTTP endpoint on 127.0.0.1 (stdlib
``http.server`` in a thread), so the ``openai`` client, the network path and the fallback
when it goes down are exercised for real. Its vectors come from :func:`concept_vector`: words
of one concept group (car/automobile/vehicle …) share a dimension, so it ranks by "meaning"
in a way full-text search cannot.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kernmind.config import Settings
from kernmind.memory.store import open_database
from kernmind.server import create_server
from tests.agent.conftest import llm  # noqa: F401 - the scripted model server, for conversation tests

DIM = 64
CONCEPTS = [
    {"car", "automobile", "vehicle", "sedan", "drive", "driving"},
    {"dog", "puppy", "canine", "hound"},
    {"weather", "sunny", "rain", "forecast"},
    {"food", "meal", "dinner", "lunch", "pasta"},
]


def concept_vector(text: str) -> list[float]:
    v = [0.0] * DIM
    for word in re.findall(r"\w+", text.lower()):
        for i, group in enumerate(CONCEPTS):
            if word in group:
                v[i] += 3.0
                break
        else:
            h = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little")
            v[len(CONCEPTS) + h % (DIM - len(CONCEPTS))] += 1.0
    return v


class EmbeddingServer:
    """OpenAI-compatible ``POST /v1/embeddings`` on 127.0.0.1; ``requests`` counts calls."""

    def __init__(self, port: int = 0) -> None:
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                data = []
                for i, text in enumerate(inputs):
                    vec = concept_vector(text)
                    emb: Any = vec
                    if body.get("encoding_format") == "base64":
                        emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
                    data.append({"object": "embedding", "index": i, "embedding": emb})
                out = json.dumps(
                    {
                        "object": "list",
                        "data": data,
                        "model": body["model"],
                        "usage": {"prompt_tokens": 0, "total_tokens": 0},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def embedding_server() -> Iterator[EmbeddingServer]:
    srv = EmbeddingServer()
    try:
        yield srv
    finally:
        srv.stop()


# The memory suite runs once per backend: the autouse ``memory_backend`` fixture sets where the
# test's memory lives (a SQLite file under tmp_path, or a fresh database on a real PostgreSQL
# server started for this test session: ``postgres_server`` in tests/conftest.py), and every helper below uses it.
_BACKEND: dict[str, Any] = {"name": "sqlite", "url": None, "server": None}


@pytest.fixture(autouse=True, params=["sqlite", "postgresql"])
def memory_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "postgresql":
        if request.node.get_closest_marker("sqlite_only"):
            pytest.skip(f"SQLite only: {request.node.get_closest_marker('sqlite_only').args[0]}")
        server = request.getfixturevalue("postgres_server")
        _BACKEND.update(name="postgresql", url=server.new_database(), server=server)
    try:
        yield request.param
    finally:
        _BACKEND.update(name="sqlite", url=None, server=None)


def on_postgres() -> bool:
    return _BACKEND["name"] == "postgresql"


def db_location(tmp_path: Path, name: str = "m.db") -> str:
    """Where this test's memory lives: the PostgreSQL database, or a SQLite file in tmp_path."""
    return _BACKEND["url"] or str(tmp_path / name)


async def run_sql(settings: Settings, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run one statement on the test's memory database, whichever backend (``?`` placeholders)."""
    db = open_database(settings.db_location)
    await db.open()
    try:
        async with db.write() as tx:
            return (
                await tx.all(sql, params)
                if sql.lstrip().upper().startswith("SELECT")
                else [(await tx.run(sql, params),)]
            )
    finally:
        await db.close()


def another_db_location(tmp_path: Path, name: str) -> str:
    """A second, empty memory database on the same backend (another file, or another database)."""
    return _BACKEND["server"].new_database() if on_postgres() else str(tmp_path / name)


def make_settings(tmp_path: Path, **extra: Any) -> Settings:
    """A server for memory's tests: no warm kernels and no fork-server template (≈ 1.5 s of CPU each
    that no memory test uses)."""
    extra.setdefault("db", db_location(tmp_path))
    extra.setdefault("fork_server", False)
    return Settings(data_dir=tmp_path, pool_size=0, sandbox="none", **extra)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    async with Client(create_server(settings)) as c:
        yield c


async def ok(client: Client, name: str, **args: Any) -> dict[str, Any]:
    """Call a tool that must succeed; its structured result."""
    r = await client.call_tool(name, args)
    assert not r.is_error, f"{name} failed: {r.content[0].text if r.content else r}"
    assert r.structured_content is not None
    return r.structured_content


async def refused(client: Client, name: str, **args: Any) -> str:
    """Call a tool that must be refused; the error text."""
    r = await client.call_tool(name, args)
    assert r.is_error, f"{name} should have been refused: {r.structured_content}"
    text = r.content[0].text
    assert "database is locked" not in text
    return text
