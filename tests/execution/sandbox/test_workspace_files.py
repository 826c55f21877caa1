"""upload_file / download_file / list_files and the workspace:// resources."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import error_text, make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("python"), pytest.mark.slow]


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    async with Client(create_server(make_settings(tmp_path_factory.mktemp("ws"), pool_size=1))) as c:
        yield c


async def test_uploaded_file_is_visible_to_code_and_listed(client: Client) -> None:
    up = structured(
        await client.call_tool(
            "upload_file", {"path": "data/in.csv", "content": "a,b\n1,2\n", "session_id": "f1"}
        )
    )
    assert up == {"path": "data/in.csv", "size": 8, "session_id": "f1"}
    out = structured(
        await client.call_tool(
            "run_code", {"code": "open('data/in.csv').read().splitlines()", "session_id": "f1"}
        )
    )
    assert out["results"][0]["text"] == "['a,b', '1,2']"
    listed = structured(await client.call_tool("list_files", {"session_id": "f1"}))
    assert [(f["path"], f["size"], f["mime"]) for f in listed["files"]] == [("data/in.csv", 8, "text/csv")]


async def test_files_written_by_code_download_as_text_or_base64(client: Client) -> None:
    code = "open('out.txt','w').write('héllo')\nopen('out.bin','wb').write(bytes([0, 255, 1]))"
    out = structured(await client.call_tool("run_code", {"code": code, "session_id": "f2"}))
    assert sorted(f["path"] for f in out["files"]) == ["out.bin", "out.txt"]
    text = structured(await client.call_tool("download_file", {"path": "out.txt", "session_id": "f2"}))
    assert (text["encoding"], text["content"]) == ("utf-8", "héllo")
    binary = structured(await client.call_tool("download_file", {"path": "out.bin", "session_id": "f2"}))
    assert binary["encoding"] == "base64" and base64.b64decode(binary["content"]) == bytes([0, 255, 1])


async def test_missing_file_and_unknown_session_give_clear_errors(client: Client) -> None:
    await client.call_tool("run_code", {"code": "1", "session_id": "f3"})
    assert "list_files" in error_text(
        await client.call_tool("download_file", {"path": "nope.txt", "session_id": "f3"})
    )
    assert "no session named" in error_text(await client.call_tool("list_files", {"session_id": "ghost"}))
    bad = await client.call_tool(
        "upload_file", {"path": "x", "content": "%%%", "encoding": "base64", "session_id": "f3"}
    )
    assert "base64" in error_text(bad)


async def test_workspace_files_are_mcp_resources(client: Client) -> None:
    await client.call_tool("upload_file", {"path": "notes/r.md", "content": "# hi", "session_id": "f4"})
    templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
    assert {"workspace://{session_id}/{+path}", "workspace://{session_id}"} <= templates
    contents = (await client.read_resource("workspace://f4/notes/r.md")).contents
    assert contents[0].text == "# hi"
    listing = (await client.read_resource("workspace://f4")).contents[0].text
    assert '"notes/r.md"' in listing


async def test_files_need_no_kernel_until_python_runs(client: Client) -> None:
    """Uploading to a new session starts no interpreter; the first Python call finds the files."""
    await client.call_tool(
        "upload_file", {"path": "early.txt", "content": "before python", "session_id": "lazy"}
    )
    sessions = {
        s["session_id"]: s for s in structured(await client.call_tool("list_sessions", {}))["sessions"]
    }
    assert sessions["lazy"]["kernel_running"] is False
    assert sessions["lazy"]["workspace_files"] == 1
    out = structured(
        await client.call_tool("run_code", {"code": "open('early.txt').read()", "session_id": "lazy"})
    )
    assert out["results"][0]["text"] == "'before python'"
    sessions = {
        s["session_id"]: s for s in structured(await client.call_tool("list_sessions", {}))["sessions"]
    }
    assert sessions["lazy"]["kernel_running"] is True
