"""Memory block tools through a real in-process server: every happy path and every refusal.

Each refusal is checked to leave the block exactly as it was (value and version).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kernmind.server import create_server

from .conftest import make_settings, ok, refused

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def snapshot(client: Client, label: str) -> dict[str, Any]:
    return await ok(client, "memory_read", label=label)


async def test_tool_surface_and_schemas(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    expected = {
        "memory_list",
        "memory_read",
        "memory_create",
        "memory_append",
        "memory_replace",
        "memory_insert",
        "memory_rethink",
        "memory_delete",
        "memory_history",
        "memory_undo",
        "archival_memory_insert",
        "archival_memory_search",
        "archival_memory_delete",
    }
    assert expected <= set(tools)
    for name in expected:
        assert tools[name].output_schema is not None, name
    props = tools["memory_create"].input_schema["properties"]
    assert {"label", "value", "description", "limit", "read_only"} <= set(props)
    assert tools["memory_insert"].input_schema["properties"]["insert_line"]["default"] == -1
    for name in ("memory_append", "memory_replace", "memory_insert", "memory_rethink", "memory_delete"):
        assert "expected_version" in tools[name].input_schema["properties"], name


async def test_fresh_namespace_has_default_blocks(client: Client) -> None:
    blocks = (await ok(client, "memory_list"))["blocks"]
    assert [b["label"] for b in blocks] == ["persona", "human"]
    for b in blocks:
        assert b["chars"] == 0 and b["version"] == 1 and not b["read_only"]
        assert b["description"]
        assert b["limit"] == 5000


async def test_default_blocks_configurable(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, memory_default_blocks={"notes": "scratch"}, memory_block_limit=300)
    async with Client(create_server(settings)) as client:
        blocks = (await ok(client, "memory_list"))["blocks"]
    assert [(b["label"], b["description"], b["limit"]) for b in blocks] == [("notes", "scratch", 300)]


async def test_deleted_default_block_is_not_reseeded(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    async with Client(create_server(settings)) as client:
        await ok(client, "memory_delete", label="persona")
    async with Client(create_server(settings)) as client:
        labels = [b["label"] for b in (await ok(client, "memory_list"))["blocks"]]
    assert labels == ["human"]


async def test_create_read_and_list(client: Client) -> None:
    w = await ok(
        client, "memory_create", label="project", value="uses Python", description="the project", limit=100
    )
    assert (w["version"], w["chars"], w["room_left"], w["value"]) == (1, 11, 89, "uses Python")
    r = await snapshot(client, "project")
    assert r["value"] == "uses Python" and r["description"] == "the project" and r["limit"] == 100
    listed = {b["label"]: b for b in (await ok(client, "memory_list"))["blocks"]}
    assert listed["project"]["chars"] == 11 and listed["project"]["version"] == 1


async def test_create_refusals(client: Client) -> None:
    before = await snapshot(client, "human")
    text = await refused(client, "memory_create", label="human", value="x")
    assert "already exists" in text
    assert await snapshot(client, "human") == before
    text = await refused(client, "memory_create", label="bad label/../x")
    assert "not a valid label" in text
    text = await refused(client, "memory_create", label="tiny", value="abcdef", limit=3)
    assert "3 over" in text
    labels = [b["label"] for b in (await ok(client, "memory_list"))["blocks"]]
    assert "tiny" not in labels and "bad label/../x" not in labels


async def test_append(client: Client) -> None:
    w1 = await ok(client, "memory_append", label="human", content="Name: Ada")
    assert w1["value"] == "Name: Ada" and w1["version"] == 2  # no leading newline on an empty block
    w2 = await ok(client, "memory_append", label="human", content="Likes tea", expected_version=2)
    assert w2["value"] == "Name: Ada\nLikes tea" and w2["version"] == 3


async def test_limit_refusal_gives_overage_and_room(client: Client) -> None:
    await ok(client, "memory_create", label="small", value="12345", limit=20)
    before = await snapshot(client, "small")
    text = await refused(client, "memory_append", label="small", content="x" * 20)
    # 5 + 1 (newline) + 20 = 26 chars: 6 over the limit of 20; 15 characters of room left.
    assert "6 over" in text and "limit of 20" in text and "room left now: 15" in text
    assert await snapshot(client, "small") == before
    for tool, args in [
        ("memory_rethink", {"new_memory": "y" * 21}),
        ("memory_replace", {"old_str": "12345", "new_str": "z" * 30}),
        ("memory_insert", {"new_str": "w" * 30}),
    ]:
        text = await refused(client, tool, label="small", **args)
        assert "over its limit of 20" in text, text
        assert await snapshot(client, "small") == before


async def test_read_only_block_refuses_every_edit(client: Client) -> None:
    await ok(client, "memory_create", label="policy", value="be kind", read_only=True)
    before = await snapshot(client, "policy")
    assert before["read_only"]
    for tool, args in [
        ("memory_append", {"content": "x"}),
        ("memory_replace", {"old_str": "kind", "new_str": "mean"}),
        ("memory_insert", {"new_str": "x"}),
        ("memory_rethink", {"new_memory": "x"}),
        ("memory_delete", {}),
        ("memory_undo", {}),
    ]:
        text = await refused(client, tool, label="policy", **args)
        assert "read-only" in text, (tool, text)
        assert await snapshot(client, "policy") == before


async def test_unknown_label_refusals(client: Client) -> None:
    for tool, args in [
        ("memory_read", {}),
        ("memory_append", {"content": "x"}),
        ("memory_replace", {"old_str": "a", "new_str": "b"}),
        ("memory_insert", {"new_str": "x"}),
        ("memory_rethink", {"new_memory": "x"}),
        ("memory_delete", {}),
        ("memory_history", {}),
        ("memory_undo", {}),
    ]:
        text = await refused(client, tool, label="nope", **args)
        assert "no memory block labelled 'nope'" in text and "'persona'" in text and "memory_create" in text
    labels = [b["label"] for b in (await ok(client, "memory_list"))["blocks"]]
    assert labels == ["persona", "human"]


async def test_replace(client: Client) -> None:
    await ok(client, "memory_rethink", label="human", new_memory="Name: Ada\nCity: Paris\nPet: cat")
    w = await ok(client, "memory_replace", label="human", old_str="City: Paris", new_str="City: Lyon")
    assert w["value"] == "Name: Ada\nCity: Lyon\nPet: cat"
    w = await ok(client, "memory_replace", label="human", old_str="\nPet: cat", new_str="")
    assert w["value"] == "Name: Ada\nCity: Lyon"


async def test_replace_refusals(client: Client) -> None:
    await ok(client, "memory_rethink", label="human", new_memory="likes tea\nlikes coffee\nhates tea")
    before = await snapshot(client, "human")
    text = await refused(client, "memory_replace", label="human", old_str="tea", new_str="milk")
    assert "occurs 2 times" in text and "lines 1, 3" in text
    text = await refused(client, "memory_replace", label="human", old_str="juice", new_str="milk")
    assert "not found" in text
    text = await refused(client, "memory_replace", label="human", old_str="", new_str="milk")
    assert "empty" in text
    text = await refused(client, "memory_replace", label="human", old_str="2→ likes coffee", new_str="x")
    assert "line-number prefix" in text
    text = await refused(
        client, "memory_replace", label="human", old_str="likes coffee", new_str="12→ likes milk"
    )
    assert "line-number prefix" in text
    assert await snapshot(client, "human") == before


async def test_line_prefix_refused_in_insert_and_rethink(client: Client) -> None:
    before = await snapshot(client, "human")
    text = await refused(client, "memory_insert", label="human", new_str="1→ Name: Ada")
    assert "line-number prefix" in text
    text = await refused(client, "memory_rethink", label="human", new_memory="Line 1: Name: Ada")
    assert "line-number prefix" in text
    assert await snapshot(client, "human") == before
    # An arrow in prose is fine.
    w = await ok(client, "memory_append", label="human", content="Prefers A → B diagrams")
    assert w["value"].endswith("A → B diagrams")


async def test_insert(client: Client) -> None:
    await ok(client, "memory_rethink", label="human", new_memory="one\ntwo\nthree")
    assert (await ok(client, "memory_insert", label="human", new_str="zero", insert_line=0))[
        "value"
    ] == "zero\none\ntwo\nthree"
    assert (await ok(client, "memory_insert", label="human", new_str="1.5", insert_line=2))[
        "value"
    ] == "zero\none\n1.5\ntwo\nthree"
    w = await ok(client, "memory_insert", label="human", new_str="four\nfive")
    assert w["value"] == "zero\none\n1.5\ntwo\nthree\nfour\nfive"
    w = await ok(client, "memory_insert", label="persona", new_str="first", insert_line=0)
    assert w["value"] == "first"


async def test_insert_out_of_range_refused(client: Client) -> None:
    await ok(client, "memory_rethink", label="human", new_memory="one\ntwo")
    before = await snapshot(client, "human")
    text = await refused(client, "memory_insert", label="human", new_str="x", insert_line=5)
    assert "out of range" in text and "2 lines" in text
    assert await snapshot(client, "human") == before


async def test_rethink(client: Client) -> None:
    w = await ok(client, "memory_rethink", label="persona", new_memory="I am helpful.")
    assert w["value"] == "I am helpful." and w["version"] == 2


async def test_versions_and_expected_version(client: Client) -> None:
    assert (await snapshot(client, "human"))["version"] == 1
    await ok(client, "memory_append", label="human", content="a", expected_version=1)
    await ok(client, "memory_replace", label="human", old_str="a", new_str="b", expected_version=2)
    await ok(client, "memory_insert", label="human", new_str="c", expected_version=3)
    await ok(client, "memory_rethink", label="human", new_memory="d", expected_version=4)
    before = await snapshot(client, "human")
    assert before["version"] == 5
    for tool, args in [
        ("memory_append", {"content": "x"}),
        ("memory_replace", {"old_str": "d", "new_str": "x"}),
        ("memory_insert", {"new_str": "x"}),
        ("memory_rethink", {"new_memory": "x"}),
        ("memory_delete", {}),
        ("memory_undo", {}),
    ]:
        text = await refused(client, tool, label="human", expected_version=3, **args)
        assert "at version 5, not expected_version 3" in text and "expected_version=5" in text
        assert await snapshot(client, "human") == before


async def test_delete_and_undo_delete(client: Client) -> None:
    await ok(client, "memory_create", label="tmp", value="keep me", description="d", limit=50)
    d = await ok(client, "memory_delete", label="tmp", expected_version=1)
    assert d["deleted"] and d["last_version"] == 1
    await refused(client, "memory_read", label="tmp")
    u = await ok(client, "memory_undo", label="tmp")
    assert u["reverted"]["op"] == "delete"
    assert u["block"]["value"] == "keep me" and u["block"]["limit"] == 50 and u["block"]["description"] == "d"
    assert (await snapshot(client, "tmp"))["value"] == "keep me"


async def test_history_and_undo(client: Client) -> None:
    await ok(client, "memory_append", label="human", content="v2")
    await ok(client, "memory_append", label="human", content="v3")
    await ok(client, "memory_replace", label="human", old_str="v3", new_str="v4")
    h = (await ok(client, "memory_history", label="human"))["entries"]
    assert [(e["op"], e["version"]) for e in h] == [
        ("replace", 4),
        ("append", 3),
        ("append", 2),
        ("seed", 1),
    ]
    assert h[0]["old"] == "v2\nv3" and h[0]["new"] == "v2\nv4" and h[0]["at"].endswith("Z")
    assert len((await ok(client, "memory_history", label="human", limit=2))["entries"]) == 2

    u = await ok(client, "memory_undo", label="human")
    assert u["block"]["value"] == "v2\nv3" and u["block"]["version"] == 5
    u = await ok(client, "memory_undo", label="human")  # goes further back
    assert u["block"]["value"] == "v2" and u["reverted"]["version"] == 3
    u = await ok(client, "memory_undo", label="human")
    assert u["block"]["value"] == ""
    text = await refused(client, "memory_undo", label="human")
    assert "nothing" in text.lower() or "no change left" in text
    h = (await ok(client, "memory_history", label="human"))["entries"]
    assert [e["op"] for e in h[:3]] == ["undo", "undo", "undo"]
    # a new write after undos is undoable again
    await ok(client, "memory_append", label="human", content="fresh")
    assert (await ok(client, "memory_undo", label="human"))["block"]["value"] == ""


async def test_undo_create_removes_block(client: Client) -> None:
    await ok(client, "memory_create", label="oops", value="x")
    u = await ok(client, "memory_undo", label="oops")
    assert u["block"] is None and u["reverted"]["op"] == "create"
    await refused(client, "memory_read", label="oops")
    # history survives deletion:
    h = (await ok(client, "memory_history", label="oops"))["entries"]
    assert [e["op"] for e in h] == ["undo", "create"]


async def test_namespaces_are_isolated(tmp_path: Path) -> None:
    a = make_settings(tmp_path, agent="alice")
    b = make_settings(tmp_path, agent="bob")
    async with Client(create_server(a)) as ca, Client(create_server(b)) as cb:
        await ok(ca, "memory_create", label="secret", value="alice only")
        await ok(ca, "memory_append", label="human", content="Alice")
        await refused(cb, "memory_read", label="secret")
        assert (await ok(cb, "memory_read", label="human"))["value"] == ""
        await ok(cb, "memory_create", label="secret", value="bob's")
        assert (await ok(ca, "memory_read", label="secret"))["value"] == "alice only"
        pa = await ok(ca, "archival_memory_insert", content="alice likes rowing")
        await ok(cb, "archival_memory_insert", content="bob likes rowing too")
        found = (await ok(cb, "archival_memory_search", query="rowing"))["results"]
        assert [r["content"] for r in found] == ["bob likes rowing too"]
        await refused(cb, "archival_memory_delete", id=pa["id"])
        assert len((await ok(ca, "archival_memory_search", query="rowing"))["results"]) == 1
