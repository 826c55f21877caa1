"""A stored session's history file: bounded, appended without rereading it each call."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from kernmind.execution.results import DisplayResult, RunResult
from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions import books as books_mod
from kernmind.execution.sessions import history
from kernmind.execution.sessions.books import Books
from kernmind.execution.sessions.disk_store import SessionHome
from kernmind.execution.sessions.session import Session
from kernmind.execution.tools.run_content import run_result_content


def result(n: int) -> RunResult:
    return RunResult(status="ok", language="python", session_id="s", execution_count=n)


def test_history_keeps_at_most_max_entries_newest_first_kept(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    for n in range(history.MAX_ENTRIES + 10):
        history.record(path, f"x = {n}", result(n))
    entries = history.read(path)
    assert len(entries) <= history.MAX_ENTRIES
    assert entries[-1]["code"] == f"x = {history.MAX_ENTRIES + 9}"  # the newest survive
    assert [e["code"] for e in entries] == sorted((e["code"] for e in entries), key=lambda c: int(c[4:]))


def test_history_counts_right_when_the_file_changed_behind_its_back(tmp_path: Path) -> None:
    """The line count carried from the last write is used only while the file is as that write
    left it; a file replaced meanwhile (another server held the session) is counted afresh."""
    path = tmp_path / "history.jsonl"
    history.record(path, "first", result(1))
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines * (history.MAX_ENTRIES + 5)) + "\n")  # someone else wrote
    history.record(path, "last", result(2))
    entries = history.read(path)
    assert len(entries) <= history.MAX_ENTRIES and entries[-1]["code"] == "last"


# --- written after the answer (books.py) -------------------------------------------------------


def held_session(tmp_path: Path) -> Session:
    home = SessionHome(tmp_path / "home", "alice", "s")
    home.root.mkdir(parents=True)
    return Session("s", lambda: Workspace(tmp_path / "ws"), owner="alice", home=home)


@pytest.mark.anyio
async def test_lines_written_after_the_answer_keep_call_order_and_the_result_as_it_ended(
    tmp_path: Path,
) -> None:
    books, session = Books(None), held_session(tmp_path)
    assert session.home is not None
    async with anyio.create_task_group() as tg:
        for n in range(5):
            ran = RunResult(status="ok", language="python", session_id="s", execution_count=n)
            ran.results.append(DisplayResult(text="fig", png="iVBO"))
            assert books.record_later(session, f"x = {n}", ran, tg)
            blocks, structured = run_result_content(ran)  # what the tool answers meanwhile
            assert (
                structured["results"][0]["image"]["content_index"] == 1
                and "png" not in structured["results"][0]
            )
            assert blocks[1].data == "iVBO"
        await books.flush(session)
        entries = history.read(session.home.history)
    assert [e["code"] for e in entries] == [f"x = {n}" for n in range(5)]
    assert all(e["result"]["results"][0]["png"] == "iVBO" for e in entries)
    assert session.pending_notes == []


@pytest.mark.anyio
async def test_a_line_that_cannot_be_written_later_is_said_in_the_next_call(tmp_path: Path) -> None:
    books, session = Books(None), held_session(tmp_path)
    assert session.home is not None
    session.home.history.mkdir()  # not a file: every append fails
    async with anyio.create_task_group() as tg:
        assert books.record_later(session, "x = 1", result(1), tg)
        await books.flush(session)
    assert len(session.pending_notes) == 1
    assert "previous call could not be recorded in the session's history" in session.pending_notes[0]


@pytest.mark.anyio
async def test_on_a_disk_nearly_full_the_line_is_written_before_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = os.statvfs(tmp_path)
    monkeypatch.setattr(books_mod, "HISTORY_ROOM", free.f_bavail * free.f_frsize + 2**30)
    books, session = Books(None), held_session(tmp_path)
    async with anyio.create_task_group() as tg:
        assert not books.record_later(session, "x = 1", result(1), tg)  # the caller writes it now


@pytest.mark.anyio
async def test_lines_are_appended_on_the_event_loop_until_a_disk_is_once_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line of a call is written on the event loop (no thread that would hold the
    interpreter lock while the next call runs); once a disk took longer than ``SLOW_WRITE``,
    later lines go to a worker thread, so a blocking disk holds the loop at most once."""
    import threading
    import time

    threads: list[threading.Thread] = []
    record = history.record

    def slow_first(path: Path, code: str, ran: RunResult) -> OSError | None:
        threads.append(threading.current_thread())
        if len(threads) == 2:
            time.sleep(books_mod.SLOW_WRITE * 1.5)
        return record(path, code, ran)

    monkeypatch.setattr(history, "record", slow_first)
    books, session = Books(None), held_session(tmp_path)
    assert session.home is not None
    async with anyio.create_task_group() as tg:
        for n in range(3):
            assert books.record_later(session, f"x = {n}", result(n), tg)
            await books.flush(session)
    main = threading.main_thread()
    assert [thread is main for thread in threads] == [True, True, False]
    assert books.lines_off_loop
    assert [e["code"] for e in history.read(session.home.history)] == ["x = 0", "x = 1", "x = 2"]
