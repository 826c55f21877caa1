"""The ``memory`` tool speaks Anthropic's memory-tool dialect over the block store: each command,
its refusals, folders, and the block rules (versions, undo, limits, read-only) applying as they do
for the block tools."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from kernmind.server import create_server

from .conftest import make_settings, ok, refused

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def memory(client: Client, **args: object) -> str:
    r = await client.call_tool("memory", args)
    assert not r.is_error, r.content[0].text
    return r.content[0].text


async def memory_refused(client: Client, **args: object) -> str:
    return await refused(client, "memory", **args)


async def test_schema_has_the_dialects_names(client: Client) -> None:
    """command, path, file_text, old_str, new_str, insert_line, insert_text, view_range, old_path, new_path."""
    tool = next(t for t in (await client.list_tools()).tools if t.name == "memory")
    props = tool.input_schema["properties"]
    assert set(props["command"]["enum"]) == {"view", "create", "str_replace", "insert", "delete", "rename"}
    for name in ("path", "file_text", "old_str", "new_str", "insert_line", "insert_text", "view_range"):
        assert name in props
    assert {"old_path", "new_path", "expected_version"} <= set(props)


async def test_view_lists_blocks_with_sizes_and_descriptions(client: Client) -> None:
    await ok(client, "memory_append", label="human", content="Name: Ada")
    text = await memory(client, command="view", path="/memories")
    lines = text.split("\n")
    assert lines[0].startswith("Here're the files and directories up to 2 levels deep in /memories")
    assert "9\t/memories/human\t# What you know about the person" in text
    assert "0\t/memories/persona\t# Who you are" in text


async def test_create_view_and_edit_a_file(client: Client) -> None:
    out = await memory(client, command="create", path="/memories/notes.md", file_text="alpha\nbeta\ngamma")
    assert out == "File created successfully at: /memories/notes.md"
    view = await memory(client, command="view", path="/memories/notes.md")
    assert view.startswith("Here's the content of /memories/notes.md with line numbers")
    assert view.endswith("     1\talpha\n     2\tbeta\n     3\tgamma")
    part = await memory(client, command="view", path="/memories/notes.md", view_range=[2, -1])
    assert part.endswith("     2\tbeta\n     3\tgamma") and "alpha" not in part

    out = await memory(
        client, command="str_replace", path="/memories/notes.md", old_str="beta", new_str="BETA"
    )
    assert out.startswith("The memory file has been edited.") and "     2\tBETA" in out
    out = await memory(
        client, command="insert", path="/memories/notes.md", insert_line=1, insert_text="one-and-a-half"
    )
    assert out.startswith("The file /memories/notes.md has been edited.") and "     2\tone-and-a-half" in out
    # the same block through the block tools
    block = await ok(client, "memory_read", label="notes.md")
    assert block["value"] == "alpha\none-and-a-half\nBETA\ngamma" and block["version"] == 3


async def test_create_over_an_existing_file_is_an_undoable_new_version(client: Client) -> None:
    await memory(client, command="create", path="/memories/plan", file_text="v1")
    out = await memory(client, command="create", path="/memories/plan", file_text="v2")
    assert "overwritten" in out and "memory_undo" in out
    assert (await ok(client, "memory_read", label="plan"))["version"] == 2
    u = await ok(client, "memory_undo", label="plan")
    assert u["block"]["value"] == "v1"


async def test_refusals_use_the_dialects_words_and_change_nothing(client: Client) -> None:
    await memory(client, command="create", path="/memories/notes", file_text="tea\ncoffee\ntea")
    before = await ok(client, "memory_read", label="notes")
    text = await memory_refused(
        client, command="str_replace", path="/memories/notes", old_str="tea", new_str="x"
    )
    assert "occurs 2 times" in text and "lines 1, 3" in text
    text = await memory_refused(
        client, command="str_replace", path="/memories/notes", old_str="milk", new_str="x"
    )
    assert "not found" in text and "with view" in text and "memory_read" not in text
    text = await memory_refused(
        client, command="insert", path="/memories/notes", insert_line=9, insert_text="x"
    )
    assert "out of range" in text and "3 lines" in text
    text = await memory_refused(
        client,
        command="str_replace",
        path="/memories/notes",
        old_str="coffee",
        new_str="x",
        expected_version=7,
    )
    assert "not expected_version 7" in text and "with view" in text
    text = await memory_refused(client, command="view", path="/memories/missing")
    assert "The path /memories/missing does not exist" in text
    text = await memory_refused(client, command="create", path="/memories/x")
    assert "create needs path, file_text; missing: file_text" in text
    assert await ok(client, "memory_read", label="notes") == before


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "/memories/../etc/passwd", "/memories/a/../../b", "memories/x", "/memories//x", "/memories/.hidden",
     "/memories/a/./b", "/memoriesx/y", "/memories/a\\b", "/memories/x\x00y"],
)  # fmt: skip
async def test_paths_outside_memories_are_refused(client: Client, path: str) -> None:
    text = await memory_refused(client, command="create", path=path, file_text="x")
    assert "/memories" in text
    labels = [b["label"] for b in (await ok(client, "memory_list"))["blocks"]]
    assert labels == ["persona", "human"]


async def test_folders(client: Client) -> None:
    await memory(client, command="create", path="/memories/projects/kernmind", file_text="memory work")
    await memory(client, command="create", path="/memories/projects/site/todo", file_text="deploy")
    text = await memory(client, command="view", path="/memories")
    assert "\t/memories/projects/\n" in text + "\n" and "/memories/projects/kernmind" in text
    assert "/memories/projects/site/todo" not in text  # two levels deep only
    text = await memory(client, command="view", path="/memories/projects")
    assert "/memories/projects/site/todo" in text
    text = await memory_refused(client, command="create", path="/memories/projects/kernmind/x", file_text="y")
    assert "is a file" in text
    text = await memory_refused(client, command="create", path="/memories/projects", file_text="y")
    assert "is a directory" in text

    out = await memory(client, command="rename", old_path="/memories/projects", new_path="/memories/work")
    assert out == "Successfully renamed /memories/projects to /memories/work"
    assert (await ok(client, "memory_read", label="work/site/todo"))["value"] == "deploy"
    out = await memory(client, command="delete", path="/memories/work")
    assert out == "Successfully deleted /memories/work"
    labels = [b["label"] for b in (await ok(client, "memory_list"))["blocks"]]
    assert labels == ["persona", "human"]
    # the block resource of a file in a folder
    await memory(client, command="create", path="/memories/a/b", file_text="in a folder")
    assert (await client.read_resource("memory://blocks/a/b")).contents[0].text == "in a folder"


async def test_rename_and_delete_are_undoable(client: Client) -> None:
    await memory(client, command="create", path="/memories/draft", file_text="text")
    await memory(client, command="rename", old_path="/memories/draft", new_path="/memories/final")
    text = await refused(client, "memory_undo", label="draft")
    assert "renamed to 'final'" in text
    await refused(client, "memory_read", label="draft")
    u = await ok(client, "memory_undo", label="final")
    assert u["block"]["label"] == "draft" and u["block"]["value"] == "text"
    await refused(client, "memory_read", label="final")
    await memory(client, command="delete", path="/memories/draft")
    assert (await ok(client, "memory_undo", label="draft"))["block"]["value"] == "text"
    text = await memory_refused(
        client, command="rename", old_path="/memories/draft", new_path="/memories/human"
    )
    assert "already exists" in text


async def test_read_only_and_limits_apply(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path))) as client:
        await ok(client, "memory_create", label="rules", value="be kind", read_only=True)
        for args in (
            {"command": "create", "path": "/memories/rules", "file_text": "x"},
            {"command": "str_replace", "path": "/memories/rules", "old_str": "kind", "new_str": "x"},
            {"command": "insert", "path": "/memories/rules", "insert_line": 0, "insert_text": "x"},
            {"command": "delete", "path": "/memories/rules"},
            {"command": "rename", "old_path": "/memories/rules", "new_path": "/memories/r2"},
        ):
            assert "read-only" in await memory_refused(client, **args), args
        assert (await ok(client, "memory_read", label="rules"))["value"] == "be kind"
        text = await memory_refused(client, command="create", path="/memories/big", file_text="y" * 100_001)
        assert "100001 characters" in text and "over the limit of 100000" in text  # the ceiling
        await memory(client, command="create", path="/memories/big", file_text="y" * 100_000)
        text = await memory_refused(
            client, command="insert", path="/memories/big", insert_line=-1, insert_text="z"
        )
        assert "over its limit of 100000" in text


async def test_a_long_file_is_viewed_within_the_budget(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, max_output_chars=1000))) as client:
        await memory(
            client,
            command="create",
            path="/memories/log",
            file_text="\n".join(f"entry {i}" for i in range(500)),
        )
        text = await memory(client, command="view", path="/memories/log")
        assert len(text) < 1200 and "view_range=[" in text
        nxt = int(text.rsplit("view_range=[", 1)[1].split(",")[0])
        more = await memory(client, command="view", path="/memories/log", view_range=[nxt, -1])
        assert f"{nxt:6d}\tentry {nxt - 1}" in more
