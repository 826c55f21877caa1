"""Changed means changed: the first call after a resume lists only what that call changed.

A stored session resumes in a new server (same data directory): its kernel takes the files
over (chowned to the kernel's uid when the server is root, variables restored), which touches
every file's change time. ``files`` must still list only what the call's code created or
modified. Real in-process servers on real sandboxed kernels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("python"), pytest.mark.slow]

WRITE = (
    "import pathlib\n"
    "pathlib.Path('data').mkdir(exist_ok=True)\n"
    "for i in range(30):\n"
    "    pathlib.Path(f'data/part-{i}.csv').write_text(f'{i}\\n')\n"
    "pathlib.Path('notes.txt').write_text('first')\n"
    "kept = 30"
)


async def test_first_call_after_a_resume_lists_only_its_own_changes(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, pool_size=0))) as first:
        out = structured(await first.call_tool("run_code", {"code": WRITE, "session_id": "s"}))
        assert len(out["files"]) == 31
    async with Client(create_server(make_settings(tmp_path, pool_size=0))) as second:
        code = "open('notes.txt', 'a').write(' and more')\nopen('new.txt', 'w').write('x')\nkept"
        out = structured(await second.call_tool("run_code", {"code": code, "session_id": "s"}))
        assert out["results"][0]["text"] == "30"  # the variables came back: this was a resume
        assert any("resumed" in note for note in out["notes"])
        assert sorted(f["path"] for f in out["files"]) == ["new.txt", "notes.txt"]
        again = structured(await second.call_tool("run_code", {"code": "kept + 1", "session_id": "s"}))
        assert again["files"] == []
