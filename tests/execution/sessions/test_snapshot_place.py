"""Saved variables live beside a session's files, not in its working directory.

Real kernels (pool on and off: a warm kernel rebound to the session, and one started in its
home). ``.km-state`` used to show in the session's ``os.listdir()``; now the kernel writes the
snapshot in its runtime directory and the server keeps it at ``<session>/state/namespace.pkl``.
A session saved by an earlier version (snapshot in ``files/.km-state``) still gets its
variables back, and the folder leaves its working directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def _run(c: Client, code: str, sid: str) -> dict:
    return structured(await c.call_tool("run_code", {"code": code, "session_id": sid}))


@pytest.mark.parametrize("pool_size", [0, 1])
async def test_the_snapshot_is_kept_beside_the_files_and_not_listed(tmp_path: Path, pool_size: int) -> None:
    settings = make_settings(tmp_path, pool_size=pool_size)
    home = settings.sessions_dir / "local" / "s"
    async with Client(create_server(settings)) as c:
        await _run(c, "kept = {'a': 41}", "s")
    assert (home / "state" / "namespace.pkl").is_file()
    assert not (home / "files" / ".km-state").exists()
    async with Client(create_server(settings)) as c:
        out = await _run(c, "import os; (kept['a'] + 1, sorted(os.listdir('.')))", "s")
        assert out["results"][0]["text"] == "(42, [])", out  # restored, and nothing in the listing
        assert any("restored" in n for n in out["notes"]), out
    assert (home / "state" / "namespace.pkl").is_file()  # the loan is gone, the kept one stays


async def test_a_session_saved_by_an_earlier_version_gets_its_variables_back(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, pool_size=0)
    home = settings.sessions_dir / "local" / "old"
    async with Client(create_server(settings)) as c:
        await _run(c, "value = 'from before'", "old")
    # Lay it out as an earlier version did: the snapshot inside the working directory.
    (home / "files" / ".km-state").mkdir()
    shutil.move(home / "state" / "namespace.pkl", home / "files" / ".km-state" / "namespace.pkl")
    async with Client(create_server(settings)) as c:
        out = await _run(c, "import os; (value, os.path.exists('.km-state'))", "old")
        assert out["results"][0]["text"] == "('from before', False)", out
    assert (home / "state" / "namespace.pkl").is_file() and not (home / "files" / ".km-state").exists()
