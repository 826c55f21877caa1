"""Output cut from an answer is not lost: the whole of it is kept in a file in the session's
working directory, the result's notes name it, and ``download_file`` reads it in pages
(``execution/kept_output.py``; a Python kernel writes its own, ``kernels/setup.py``)."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from kernmind.execution.kept_output import KEPT_RE, OutputFile
from kernmind.execution.results import OutputCollector
from kernmind.server import create_server
from tests.conftest import make_settings, structured

BUDGET = 2000  # --max-output-chars
LINES = 20_000  # "line 0000000 xxx…\n": 1.06 MB of output, 500 times the answer (read back in ~700 pages)
LINE = "line {:07d} " + "x" * 40


def kept_path(data: dict) -> str:
    (note,) = [n for n in data["notes"] if "all of it is in the session's working directory" in n]
    return re.search(r"in (kernmind-output/\S+\.txt)", note).group(1)


async def read_all(client: Client, session: str, path: str) -> str:
    """The file, read in pages with download_file as a model would."""
    out, offset = bytearray(), 0
    while True:
        got = structured(
            await client.call_tool(
                "download_file",
                {"path": path, "session_id": session, "offset": offset, "length": 1_000_000},
            )
        )
        chunk = got["content"]
        data = base64.b64decode(chunk) if got.get("encoding") == "base64" else chunk.encode()
        if not data:
            return out.decode()
        out += data
        offset += len(data)


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    settings = make_settings(tmp_path_factory.mktemp("kept"), pool_size=1, max_output_chars=BUDGET)
    async with Client(create_server(settings)) as c:
        yield c


@pytest.mark.slow  # a real server and kernel
@pytest.mark.anyio
@pytest.mark.xdist_group("python")
async def test_a_megabyte_print_is_kept_whole_and_read_back_in_pages(client: Client) -> None:
    code = f"for i in range({LINES}):\n    print({LINE!r}.format(i))"
    data = structured(await client.call_tool("run_code", {"code": code, "session_id": "k1"}))
    assert data["truncated"] is True
    path = kept_path(data)
    assert path in [f["path"] for f in data["files"]]  # a file of the call, like any other
    text = await read_all(client, "k1", path)
    assert text == "".join(LINE.format(i) + "\n" for i in range(LINES))


@pytest.mark.slow  # a real server and kernel
@pytest.mark.anyio
@pytest.mark.xdist_group("python")
async def test_output_within_the_answer_leaves_no_file(client: Client) -> None:
    data = structured(await client.call_tool("run_code", {"code": "print('hi')", "session_id": "k2"}))
    assert data["truncated"] is False and data.get("notes", []) == [] and data["files"] == []


@pytest.mark.slow  # a real server and kernel
@pytest.mark.anyio
@pytest.mark.xdist_group("python")
async def test_both_streams_of_a_cut_cell_are_kept_after_a_chdir(client: Client) -> None:
    code = (
        "import os, sys\nos.makedirs('elsewhere', exist_ok=True); os.chdir('elsewhere')\n"
        "for i in range(3000):\n    print('out', i); print('err', i, file=sys.stderr)"
    )
    data = structured(await client.call_tool("run_code", {"code": code, "session_id": "k3"}))
    note = next(n for n in data["notes"] if "all of it" in n)
    paths = dict(re.findall(r"(stdout|stderr) \([\d,]+ characters\) in (kernmind-output/\S+\.txt)", note))
    assert set(paths) == {"stdout", "stderr"}
    assert await read_all(client, "k3", paths["stdout"]) == "".join(f"out {i}\n" for i in range(3000))
    assert await read_all(client, "k3", paths["stderr"]) == "".join(f"err {i}\n" for i in range(3000))


@pytest.mark.slow  # a real server and kernel
@pytest.mark.anyio
@pytest.mark.xdist_group("python")
async def test_a_bash_flood_is_kept_by_the_server(client: Client) -> None:
    data = structured(
        await client.call_tool("run_code", {"code": "seq 1 300000", "language": "bash", "session_id": "k4"})
    )
    assert data["truncated"] is True
    text = await read_all(client, "k4", kept_path(data))
    assert text == "".join(f"{i}\n" for i in range(1, 300001))


# --- the server's writer, without a kernel -----------------------------------------------------


def test_the_writer_keeps_nothing_below_the_head_and_everything_past_it(tmp_path: Path) -> None:
    out = OutputFile(tmp_path, keep_after=10, limit=1 << 20)
    out.add("stdout", "12345")
    assert out.close() == {} and not (tmp_path / "kernmind-output").exists()
    out = OutputFile(tmp_path, keep_after=10, limit=1 << 20)
    for part in ("12345", "67890", "abcde"):
        out.add("stdout", part)
    (kept,) = out.close().values()
    assert (tmp_path / kept.path).read_text() == "1234567890abcde" and kept.chars == 15


def test_a_planted_symlink_refuses_the_file_instead_of_redirecting_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "kernmind-output").symlink_to(outside)
    out = OutputFile(work, keep_after=1, limit=1 << 20)
    out.add("stdout", "secret" * 10)
    assert out.close() == {} and list(outside.iterdir()) == []
    assert out.why is not None


def test_the_writer_stops_at_the_room_left_and_says_so(tmp_path: Path) -> None:
    collector = OutputCollector(1000)
    collector.keeper = OutputFile(tmp_path, keep_after=750, limit=5000)
    for _ in range(100):
        collector.stream("stdout", "y" * 100)
    note = collector.kept_note()
    assert note is not None and "only the first part" in note and "quota" in note
    (kept,) = collector.kept.values()
    assert len((tmp_path / kept.path).read_text()) <= 5000


def test_the_kernels_marker_is_taken_out_of_the_output_and_named_in_the_note() -> None:
    collector = OutputCollector(1000)
    collector.stream(
        "stdout", "a\n… [kernmind kept 123 characters of this stdout in kernmind-output/x-stdout.txt] …\n"
    )
    assert collector.logs().stdout == ["a"]
    note = collector.kept_note()
    assert note is not None and "stdout (123 characters) in kernmind-output/x-stdout.txt" in note
    assert KEPT_RE.search("no marker here") is None
