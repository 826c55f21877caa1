"""A stored session's history file: bounded, appended without rereading it each call."""

from __future__ import annotations

from pathlib import Path

from kernmind.execution.results import RunResult
from kernmind.execution.sessions import history


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
