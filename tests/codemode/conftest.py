"""Helpers for code-mode tests: run code in a session and read back what it printed as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
from mcp import Client

from tests.conftest import structured

MARK = "@@json@@"


def emitting(code: str) -> str:
    """``code`` with ``emit(value)`` defined: it prints ``value`` as one marked JSON line."""
    return (
        "import json as _json\n"
        f"def emit(value):\n    print({MARK!r} + _json.dumps(value, default=str), flush=True)\n" + code
    )


async def run(client: Client, code: str, **arguments: Any) -> dict[str, Any]:
    return structured(await client.call_tool("run_code", {"code": code, "timeout": 120, **arguments}))


def emitted(result: dict[str, Any]) -> list[Any]:
    """Every value the code ``emit``-ted, in order (fails with the code's error if it raised)."""
    assert result["status"] == "ok", result.get("error") or result
    text = "".join(result["logs"]["stdout"])
    return [json.loads(line[len(MARK) :]) for line in text.splitlines() if line.startswith(MARK)]


async def run_emitting(client: Client, code: str, **arguments: Any) -> list[Any]:
    return emitted(await run(client, emitting(code), **arguments))


async def eventually(predicate: Callable[[], bool], seconds: float = 30.0) -> bool:
    """Whether ``predicate()`` becomes true within ``seconds`` (polled; background clean-up)."""
    for _ in range(int(seconds * 10)):
        if predicate():
            return True
        await anyio.sleep(0.1)
    return predicate()
