"""The rooms of ``execution/`` import one way, ``TYPE_CHECKING`` imports included.

From the bottom: the sandbox, packages, kernels, sessions, runners, then the call path at the
top of ``execution/`` (executor, supervisor, installs, remote, parts), then the tools. The
result model and the shared errors (``results``, ``errors``, ``kept_output``,
``plotly_result``) are the vocabulary every room may import. A module may import its own
room or any room below it, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

EXECUTION = Path(__file__).resolve().parents[2] / "src" / "kernmind" / "execution"
VOCABULARY = {"results", "errors", "kept_output", "plotly_result"}
ROOMS = {"sandbox": 0, "packages": 1, "kernels": 2, "sessions": 3, "runners": 4, "tools": 6}
TOP = 5  # the modules directly in execution/


def rank(module: str) -> int | None:
    """The layer of ``kernmind.execution.<...>`` (None: vocabulary, or not in execution/)."""
    parts = module.split(".")
    if parts[:2] != ["kernmind", "execution"] or len(parts) < 3:
        return None
    room = parts[2]
    if room in VOCABULARY:
        return None
    return ROOMS.get(room, TOP)


def imported(source: str, module: str, is_package: bool) -> set[str]:
    """Every module ``source`` imports, at any depth, ``if TYPE_CHECKING:`` blocks included."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def upward_imports(root: Path = EXECUTION) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if path.name == "__init__.py" else rel.parts)
        mine = rank(module)
        if mine is None:
            continue
        for target in imported(path.read_text(), module, path.name == "__init__.py"):
            theirs = rank(target)
            if theirs is not None and theirs > mine:
                found.append(f"{module} imports {target}")
    return sorted(set(found))


def test_execution_rooms_import_only_downwards() -> None:
    assert upward_imports() == []


def test_an_upward_import_is_found_even_under_type_checking(tmp_path: Path) -> None:
    execution = tmp_path / "kernmind" / "execution"
    (execution / "kernels").mkdir(parents=True)
    (execution / "sessions").mkdir()
    (execution / "kernels" / "pool.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from kernmind.execution.results import RunResult\n"
        "if TYPE_CHECKING:\n"
        "    from kernmind.execution.sessions.disk_store import rebind\n"
    )
    (execution / "sessions" / "registry.py").write_text("from ..kernels import pool\n")
    assert upward_imports(execution) == [
        "kernmind.execution.kernels.pool imports kernmind.execution.sessions.disk_store",
        "kernmind.execution.kernels.pool imports kernmind.execution.sessions.disk_store.rebind",
    ]
