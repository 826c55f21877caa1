"""Blocks as MCP resources, update notifications (both protocol eras), and the ``memory`` prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated

from kernmind.server import create_server

from .conftest import make_settings, ok

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_block_resources(client: Client) -> None:
    await ok(client, "memory_append", label="human", content="Name: Ada")
    r = await client.read_resource("memory://blocks/human")
    assert r.contents[0].text == "Name: Ada"
    listing = json.loads((await client.read_resource("memory://blocks")).contents[0].text)
    assert [(b["label"], b["uri"]) for b in listing["blocks"]] == [
        ("persona", "memory://blocks/persona"),
        ("human", "memory://blocks/human"),
    ]
    templates = (await client.list_resource_templates()).resource_templates
    # RFC 6570 reserved expansion, so labels with "/" (folders of the memory tool) resolve too
    assert any(t.uri_template == "memory://blocks/{+label}" for t in templates)
    # a read after a write is never served stale
    await ok(client, "memory_rethink", label="human", new_memory="Name: Grace")
    assert (await client.read_resource("memory://blocks/human")).contents[0].text == "Name: Grace"


async def test_unknown_block_resource_is_an_error(client: Client) -> None:
    with pytest.raises(Exception, match="nope"):
        await client.read_resource("memory://blocks/nope")


async def test_memory_prompt_letta_layout(client: Client) -> None:
    await ok(client, "memory_append", label="human", content="Name: Ada")
    await ok(
        client, "memory_create", label="rules", value="be brief", description="house rules", read_only=True
    )
    prompts = {p.name for p in (await client.list_prompts()).prompts}
    assert "memory" in prompts
    text = (await client.get_prompt("memory")).messages[0].content.text
    assert text.startswith("<memory_blocks>\n") and text.endswith("</memory_blocks>")
    assert (
        "<human>\n<description>\nWhat you know about the person you are talking with: name, preferences, "
        "context.\n</description>\n<metadata>\n- chars_current=9\n- chars_limit=5000\n</metadata>\n"
        "<value>\nName: Ada\n</value>\n</human>"
    ) in text
    assert "<rules>" in text and "- read_only=true" in text
    assert text.index("<persona>") < text.index("<human>") < text.index("<rules>")


async def test_listen_notifications_modern(client: Client) -> None:
    assert client.protocol_version >= "2026"
    events: list[Any] = []
    three = anyio.Event()
    async with client.listen(resource_subscriptions=["memory://blocks/human", "memory://blocks"]) as sub:

        async def collect() -> None:
            async for event in sub:
                events.append(event)
                if len(events) >= 3:
                    three.set()
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            await ok(client, "memory_append", label="human", content="x")  # human
            await ok(client, "memory_append", label="persona", content="y")  # not subscribed
            await ok(client, "memory_create", label="extra")  # listing
            await ok(client, "memory_rethink", label="human", new_memory="z")  # human
            with anyio.fail_after(60):
                await three.wait()
            tg.cancel_scope.cancel()
    uris = [e.uri for e in events if isinstance(e, ResourceUpdated)]
    assert uris == ["memory://blocks/human", "memory://blocks", "memory://blocks/human"]


@pytest.mark.filterwarnings("ignore:resources/subscribe is removed")
async def test_subscribe_notifications_legacy(tmp_path: Path) -> None:
    received: list[str] = []
    arrived = anyio.Event()

    async def handler(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated":
            received.append(str(root.params.uri))
            arrived.set()

    server = create_server(make_settings(tmp_path))
    async with Client(server, mode="legacy", message_handler=handler) as client:
        assert client.protocol_version < "2026"
        resources = client.server_capabilities.resources
        assert resources is not None and resources.subscribe is True
        await client.subscribe_resource("memory://blocks/human")
        await ok(client, "memory_append", label="human", content="x")
        await ok(client, "memory_append", label="persona", content="y")
        with anyio.fail_after(60):
            await arrived.wait()
        await client.unsubscribe_resource("memory://blocks/human")
        arrived = anyio.Event()
        await client.subscribe_resource("memory://blocks/persona")
        await ok(client, "memory_append", label="human", content="again")
        # Notifications keep their order: one for human would arrive before this one for persona.
        await ok(client, "memory_append", label="persona", content="and")
        with anyio.fail_after(60):
            await arrived.wait()
    assert received == ["memory://blocks/human", "memory://blocks/persona"]
