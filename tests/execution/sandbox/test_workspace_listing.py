"""Listing a workspace's files: a page of one directory walks only that directory, and a path
through a symlink lists nothing (the listing never leaves the workspace)."""

from __future__ import annotations

import os
from pathlib import Path

from kernmind.execution.sandbox.workspace import Workspace


def make(tmp_path: Path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    ws.create()
    for rel in ["top.txt", "data/a.csv", "data/b.csv", "data/deep/c.csv", "other/d.csv"]:
        (ws.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws.root / rel).write_text(rel)
    return ws


def test_a_directory_lists_its_files_with_their_full_paths(tmp_path: Path) -> None:
    ws = make(tmp_path)
    entries, total = ws.list(prefix="data")
    assert [e.path for e in entries] == ["data/a.csv", "data/b.csv", "data/deep/c.csv"] and total == 3
    entries, total = ws.list(prefix="data/deep/", pattern="*.csv")
    assert [e.path for e in entries] == ["data/deep/c.csv"] and total == 1
    entries, total = ws.list(prefix="data", offset=1, limit=1)
    assert [e.path for e in entries] == ["data/b.csv"] and total == 3


def test_only_the_directory_asked_about_is_walked(tmp_path: Path) -> None:
    """Files elsewhere cannot be listed under it, even when a sibling holds many files."""
    ws = make(tmp_path)
    (ws.root / "other" / "many").mkdir()
    for i in range(300):
        (ws.root / "other" / "many" / f"f{i}").write_text("x")
    entries, total = ws.list(prefix="data")
    assert total == 3 and all(e.path.startswith("data/") for e in entries)
    assert ws.list()[1] == 305


def test_a_path_through_a_symlink_or_to_a_file_lists_nothing(tmp_path: Path) -> None:
    ws = make(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not yours")
    os.symlink(outside, ws.root / "link")
    assert ws.list(prefix="link") == ([], 0)
    assert ws.list(prefix="top.txt") == ([], 0)
    assert ws.list(prefix="missing/dir") == ([], 0)
