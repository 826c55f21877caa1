"""Code mode across a session's life: a session resumed after the server restarts finds the module
and the tool functions it kept in variables, and they reach the new kernel's channel."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.codemode.conftest import run_emitting
from tests.conftest import make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("codemode"), pytest.mark.slow]


async def test_a_session_resumed_after_a_restart_calls_tools_through_its_new_channel(tmp_path: Path) -> None:
    """The module and a tool function kept in a variable come back with the session's variables
    (by name), and reach the new kernel's channel."""
    settings = make_settings(tmp_path, embedding_model="none", preload=[])
    async with Client(create_server(settings)) as c:
        (first,) = await run_emitting(
            c,
            "import kernmind_tools as km\nremember = km.archival_memory_insert\n"
            "emit(remember(content='before the restart')['id'])",
            session_id="lasting",
        )
    async with Client(create_server(settings)) as c:
        (second, found) = await run_emitting(
            c,
            "emit(remember(content='after the restart')['id'])\n"
            "emit([r['id'] for r in km.archival_memory_search(query='the restart')['results']])",
            session_id="lasting",
        )
    assert second != first and sorted(found) == sorted([first, second])
