"""list_files pages within the output budget: long paths make shorter pages, and next_offset goes on exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import structured
from tests.execution.fakes import fake_client, fake_settings

pytestmark = [pytest.mark.anyio, pytest.mark.fast]  # (on fake kernels: no code runs)

BUDGET = 5000


async def test_long_paths_page_within_the_budget_and_every_file_is_listed_once(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, pool_size=0, max_output_chars=BUDGET)
    deep = "/".join(c * 200 for c in "abc")
    names = [f"{deep}/file-{i:03}.txt" for i in range(30)]
    async with fake_client(settings) as (client, _):
        for name in names:
            structured(
                await client.call_tool("upload_file", {"path": name, "content": "x", "session_id": "long"})
            )
        listed: list[str] = []
        offset: int | None = 0
        pages = 0
        while offset is not None:
            result = await client.call_tool(
                "list_files", {"session_id": "long", "offset": offset, "limit": 1000}
            )
            assert len(result.content[0].text) <= BUDGET, len(result.content[0].text)
            page = structured(result)
            assert page["total"] == 30 and page["files"]
            listed += [f["path"] for f in page["files"]]
            offset, pages = page["next_offset"], pages + 1
    assert pages > 1
    assert sorted(listed) == sorted(names)
    assert len(listed) == len(set(listed)) == 30


async def test_the_listing_resource_holds_what_fits_and_names_the_next_page(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, pool_size=0, max_output_chars=BUDGET)
    deep = "/".join(c * 200 for c in "abc")
    async with fake_client(settings) as (client, _):
        for i in range(30):
            structured(
                await client.call_tool(
                    "upload_file", {"path": f"{deep}/f{i:02}.txt", "content": "x", "session_id": "res"}
                )
            )
        structured(
            await client.call_tool("upload_file", {"path": "one.txt", "content": "x", "session_id": "few"})
        )
        body = (await client.read_resource("workspace://res")).contents[0].text  # type: ignore[union-attr]
        assert len(body) <= BUDGET, len(body)
        listing = json.loads(body)
        shown = len(listing["files"])
        assert 0 < shown < 30 and listing["total"] == 30 and listing["next_offset"] == shown
        assert f"list_files(session_id='res', offset={shown})" in listing["note"]
        few = json.loads((await client.read_resource("workspace://few")).contents[0].text)  # type: ignore[union-attr]
        assert [f["path"] for f in few["files"]] == ["one.txt"] and few["note"] is None


async def test_list_sessions_pages_within_the_budget_and_every_session_is_listed_once(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, pool_size=0, max_output_chars=BUDGET, max_sessions=64)
    async with fake_client(settings) as (client, _):
        for i in range(30):
            structured(
                await client.call_tool("upload_file", {"path": "x", "content": "x", "session_id": f"s{i:02}"})
            )
        seen: list[str] = []
        offset: int | None = 0
        pages = 0
        while offset is not None:
            result = await client.call_tool("list_sessions", {"offset": offset})
            assert len(result.content[0].text) <= BUDGET, len(result.content[0].text)
            page = structured(result)
            assert page["total"] == 30
            seen += [s["session_id"] for s in page["sessions"]]
            offset, pages = page.get("next_offset"), pages + 1
            if offset is not None:
                assert f"list_sessions(offset={offset})" in page["note"]
        assert pages > 1 and sorted(seen) == [f"s{i:02}" for i in range(30)]
