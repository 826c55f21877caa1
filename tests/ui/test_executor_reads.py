"""The /ui pages read a serving server's executor through its public methods only (issue 34):
never through its parts (its session registry, job table or session store)."""

from __future__ import annotations

import ast
from pathlib import Path

import kernmind.ui

PARTS = {"sessions", "jobs", "store", "pool", "factory", "packages"}


def _executor(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "executor") or (
        isinstance(node, ast.Attribute) and node.attr == "executor"
    )


def reaches_into_executor(source: str) -> list[str]:
    """``executor.<part>`` uses in ``source`` (a part of the executor, not one of its methods)."""
    return [
        f"line {node.lineno}: executor.{node.attr}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and _executor(node.value) and node.attr in PARTS
    ]


def test_the_ui_uses_only_the_executors_public_methods() -> None:
    folder = Path(kernmind.ui.__file__).parent
    found = {p.name: reaches_into_executor(p.read_text()) for p in sorted(folder.glob("*.py"))}
    assert {name: uses for name, uses in found.items() if uses} == {}


def test_the_check_sees_a_reach_into_the_executor() -> None:
    assert reaches_into_executor("x = self.executor.sessions.live(sid, owner)") == [
        "line 1: executor.sessions"
    ]
    assert reaches_into_executor("executor.jobs.jobs") == ["line 1: executor.jobs"]
    assert reaches_into_executor("await self.executor.session_history(owner, sid)") == []
