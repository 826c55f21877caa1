"""README's "Code mode" examples run as written, in a real session, and do what the text says."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from kernmind.principals import LOCAL, SHARED_TOKEN, Principal, principal_keeping
from kernmind.server import create_server
from tests.codemode.conftest import run
from tests.conftest import make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("codemode"), pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"


def code_mode_examples() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Code mode") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    async with Client(create_server(make_settings(tmp_path, embedding_model="none", preload=[]))) as c:
        yield c


async def test_the_readme_examples_store_findings_and_search_in_a_loop(client: Client) -> None:
    store, search = code_mode_examples()
    rows = ["region,resolution_hours"] + [f"{r},{h}" for r in ("north", "south", "east") for h in (5, 9, 40)]
    structured(
        await client.call_tool(
            "upload_file", {"path": "tickets.csv", "content": "\n".join(rows), "session_id": "r"}
        )
    )
    stored = await run(client, store, session_id="r")
    assert stored["status"] == "ok", stored["error"]
    found = structured(
        await client.call_tool("archival_memory_search", {"query": "resolve", "tags": ["finding"]})
    )
    assert len(found["results"]) == 3
    assert all("(tickets.csv, 9 rows)" in r["content"] for r in found["results"])
    human = structured(await client.call_tool("memory_read", {"label": "human"}))
    assert "support resolution times" in human["value"]

    structured(
        await client.call_tool(
            "archival_memory_insert", {"content": "Acme's contract renewal is due in June"}
        )
    )
    searched = await run(client, search, session_id="r")
    assert searched["status"] == "ok", searched["error"]
    out = "".join(searched["logs"]["stdout"])
    lines = out.splitlines()
    assert lines[0].startswith("Acme ") and lines[0].endswith("Acme's contract renewal is due in June")
    assert {line.split()[0] for line in lines} == {"Acme", "Globex", "Initech"}  # one look-up per customer


def test_the_principal_a_session_owner_key_names() -> None:
    assert principal_keeping("local") is LOCAL
    assert principal_keeping("default") is SHARED_TOKEN
    assert principal_keeping("bob") == Principal("bob", (), "")
    again = principal_keeping("bob~2")  # a name added again after a revocation keeps apart from the old data
    assert again.name == "bob" and again.owner == "bob~2" and not again.admin
