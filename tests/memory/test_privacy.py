"""Memory is private to the user running kernmind: new files are not readable by others."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.mark.sqlite_only("file permissions of the SQLite database")
async def test_new_data_dir_and_database_are_private(tmp_path: Path) -> None:
    data = tmp_path / "fresh" / "data"
    async with Client(create_server(make_settings(data, pool_size=0, sandbox="none"))) as client:
        structured(await client.call_tool("memory_append", {"label": "human", "content": "secret"}))
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "kernmind.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "workspaces").stat().st_mode) == 0o700
