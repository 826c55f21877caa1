"""Compile the servers' memory blocks into text for the system prompt, fresh before every step.

Design: per server the ``memory`` prompt, else the ``memory://blocks/{label}`` resources.
Error policy: best effort: a failure is logged at debug level and that server skipped.
"""

from __future__ import annotations

import json
import logging

import anyio
import mcp_types as types

from kernmind.agent.connections import Connection

log = logging.getLogger(__name__)

BLOCK_PREFIX = "memory://blocks/"


async def compile_memory(connections: list[Connection]) -> str:
    """All memory text from all servers, joined; empty when no server has memory."""
    parts: list[str] = []
    for conn in connections:
        try:
            text = await _server_memory(conn)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            log.debug("memory from %s unavailable: %s", conn.name, exc)
            continue
        if text.strip():
            parts.append(text.strip())
    return "\n\n".join(parts)


async def _server_memory(conn: Connection) -> str:
    caps = conn.client.server_capabilities
    if caps.prompts is not None:
        listing = await conn.client.list_prompts()
        if any(p.name == "memory" for p in listing.prompts):
            prompt = await conn.client.get_prompt("memory")
            return "\n".join(_content_text(m.content) for m in prompt.messages)
    if caps.resources is not None:
        return await _memory_from_resources(conn)
    return ""


async def _memory_from_resources(conn: Connection) -> str:
    """Blocks listed as ``memory://blocks/{label}`` resources, or named by the ``memory://blocks`` index."""
    listing = await conn.client.list_resources()
    wanted: dict[str, str] = {}  # uri -> description
    for res in listing.resources:
        uri = str(res.uri)
        if uri.startswith(BLOCK_PREFIX):
            wanted[uri] = res.description or ""
        elif uri == BLOCK_PREFIX.rstrip("/"):
            wanted.update(await _index_entries(conn, uri))
    blocks: list[str] = []
    for uri, description in wanted.items():
        label = uri.removeprefix(BLOCK_PREFIX)
        read = await conn.client.read_resource(uri, cache_mode="bypass")
        value = "\n".join(c.text for c in read.contents if isinstance(c, types.TextResourceContents))
        desc = f"<description>{description}</description>\n" if description else ""
        blocks.append(f"<{label}>\n{desc}{value}\n</{label}>")
    if not blocks:
        return ""
    return "<memory_blocks>\n" + "\n".join(blocks) + "\n</memory_blocks>"


async def _index_entries(conn: Connection, uri: str) -> dict[str, str]:
    """``{"blocks": [{"label", "description", "uri"?}, …]}`` → block URIs and descriptions."""
    read = await conn.client.read_resource(uri, cache_mode="bypass")
    text = "".join(c.text for c in read.contents if isinstance(c, types.TextResourceContents))
    data = json.loads(text)
    entries: dict[str, str] = {}
    for block in data.get("blocks", []) if isinstance(data, dict) else []:
        if isinstance(block, dict) and isinstance(block.get("label"), str):
            entries[block.get("uri") or BLOCK_PREFIX + block["label"]] = str(block.get("description") or "")
    return entries


def _content_text(content: object) -> str:
    if isinstance(content, types.TextContent):
        return content.text
    if isinstance(content, types.EmbeddedResource) and isinstance(
        content.resource, types.TextResourceContents
    ):
        return content.resource.text
    if isinstance(content, list):
        return "\n".join(_content_text(c) for c in content)
    return ""
