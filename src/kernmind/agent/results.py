"""Turn an MCP ``CallToolResult`` into what a chat-completions model can read.

Design: one text (text blocks, or ``structuredContent`` as JSON), cut in the middle when overlong,
plus images as ``data:`` URLs. Error policy: pure functions; odd content is described, never raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types


@dataclass
class ToolOutput:
    text: str
    is_error: bool
    images: list[str] = field(default_factory=list)  # data: URLs


def convert_result(result: types.CallToolResult, *, max_chars: int) -> ToolOutput:
    lines: list[str] = []
    images: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            lines.append(block.text)
        elif isinstance(block, types.ImageContent):
            images.append(f"data:{block.mime_type};base64,{block.data}")
            lines.append(f"[image {len(images)}: {block.mime_type}, shown below]")
        elif isinstance(block, types.AudioContent):
            lines.append(f"[audio: {block.mime_type}, not shown]")
        elif isinstance(block, types.ResourceLink):
            lines.append(
                f"[resource link: {block.uri}{' — ' + block.description if block.description else ''}]"
            )
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            if isinstance(res, types.TextResourceContents):
                lines.append(f"[resource {res.uri}]\n{res.text}")
            else:
                lines.append(f"[binary resource {res.uri} ({res.mime_type or 'unknown type'})]")
        else:
            lines.append(f"[{getattr(block, 'type', 'unknown')} content]")
    has_text = any(isinstance(b, types.TextContent) for b in result.content)
    if not has_text and result.structured_content is not None:
        lines.insert(0, json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(lines) if lines else "(no output)"
    if result.is_error and not text.lower().startswith("error"):
        text = "Error: " + text
    return ToolOutput(text=truncate(text, max_chars), is_error=bool(result.is_error), images=images)


def truncate(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[… {cut} characters cut …]\n{text[-tail:]}"


def image_note(count: int, tool: str) -> str:
    """What a model without image input reads instead of the images."""
    noun = "image" if count == 1 else "images"
    return f"[{tool} returned {count} {noun}; this model cannot view images, so they are not shown]"


def images_as_notes(message: dict[str, Any]) -> dict[str, Any]:
    """A user message of tool images, as text for a model that takes none."""
    content = message.get("content")
    if not isinstance(content, list) or not any(p.get("type") == "image_url" for p in content):
        return message
    count = sum(1 for p in content if p.get("type") == "image_url")
    texts = [p["text"] for p in content if p.get("type") == "text"]
    note = f"[{count} image(s) not shown: this model cannot view images] " + " ".join(texts)
    return {**message, "content": note.strip()}


def elide_images(message: dict[str, Any]) -> dict[str, Any]:
    """A message with its images' data replaced by their length (for transcripts)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for p in content:
        if p.get("type") == "image_url":
            url = p["image_url"]["url"]
            head = url.split(",", 1)[0]
            parts.append({"type": "image_url", "image_url": {"url": f"{head},<{len(url)} chars elided>"}})
        else:
            parts.append(p)
    return {**message, "content": parts}
