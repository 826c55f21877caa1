"""The shape of the package: which module may import which.

The import graph of ``src/kernmind`` is read from the source with ``ast`` (nothing is
imported): every ``import``/``from … import`` at any depth — inside functions too, since a
lazy import still ties two modules together — except those under ``if TYPE_CHECKING:``.
Importing ``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``, so those count as
edges too (except a module's own enclosing packages, which are already running).

The rules:
- no import cycle anywhere in ``src/``;
- ``memory`` and ``execution`` never import each other; the bundled ``agent`` imports
  neither (it talks to them over MCP like any other client), except the public entry points
  named in ``AGENT_ENTRY_POINTS`` (the conversation recorder);
- nothing in ``src`` imports ``tests``;
- ``sdk_compat.py`` is the only module that imports a private (``_``-prefixed) name of the
  ``mcp`` SDK.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kernmind"


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # the dotted name as written, resolved against relative levels
    line: int


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def imports_of(source: str, name: str, is_package: bool) -> Iterator[Import]:
    """Every import in ``source`` (module ``name``), at any depth, outside ``if TYPE_CHECKING:``."""
    package = name if is_package else name.rpartition(".")[0]

    def walk(node: ast.AST) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    yield from walk_one(stmt)
                continue
            yield from walk_one(child)

    def walk_one(node: ast.AST) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                yield Import(name, f"{base}.{alias.name}" if base else alias.name, node.lineno)
        yield from walk(node)

    yield from walk(ast.parse(source))


def source_modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def all_imports(root: Path = PACKAGE) -> list[Import]:
    found: list[Import] = []
    for name, path in source_modules(root).items():
        found.extend(imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py"))
    return found


def resolve(target: str, modules: Iterable[str]) -> str | None:
    """The module of ours that ``target`` names (``pkg.mod.Name`` -> ``pkg.mod``), or None."""
    known = set(modules)
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of ours that importing it runs (see the module docstring)."""
    modules = source_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for imp in all_imports(root):
        target = resolve(imp.target, modules)
        if target is None or target == imp.importer:
            continue
        graph[imp.importer].add(target)
        own = imp.importer.split(".")
        parent = target
        while "." in parent:
            parent = parent.rpartition(".")[0]
            if parent in modules and own[: parent.count(".") + 1] != parent.split("."):
                graph[imp.importer].add(parent)
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, …, a]``, or None when it has none."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        colour[start] = GREY
        path = [start]
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                stack.pop()
                continue
            state = colour.get(nxt, BLACK)  # names outside the graph end nowhere
            if state == GREY:
                return [*path[path.index(nxt) :], nxt]
            if state == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def in_room(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def crossings(graph: Mapping[str, Iterable[str]], source: str, forbidden: str) -> list[str]:
    return sorted(
        f"{importer} -> {target}"
        for importer, targets in graph.items()
        if in_room(importer, source)
        for target in targets
        if in_room(target, forbidden)
    )


# --- the rules, on the real package ---------------------------------------------------------
def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "kernmind.server" in graph and "kernmind.execution.executor" in graph
    assert "kernmind.execution.executor" in graph["kernmind.server"]


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# The public entry points the bundled agent may import (and, with them, their packages' __init__).
AGENT_ENTRY_POINTS = {"kernmind.memory.recorder"}  # recording its conversation into memory


def allowed_entry(target: str, entry_points: Iterable[str]) -> bool:
    return any(target == e or in_room(e, target) for e in entry_points)


@pytest.mark.parametrize(
    ("source", "forbidden", "entry_points"),
    [
        ("kernmind.memory", "kernmind.execution", set()),
        ("kernmind.execution", "kernmind.memory", set()),
        ("kernmind.agent", "kernmind.execution", set()),
        ("kernmind.agent", "kernmind.memory", AGENT_ENTRY_POINTS),
    ],
)
def test_dependency_direction(source: str, forbidden: str, entry_points: set[str]) -> None:
    bad = [
        c
        for c in crossings(import_graph(), source, forbidden)
        if not allowed_entry(c.split(" -> ")[1], entry_points)
    ]
    assert bad == []


def test_src_never_imports_tests() -> None:
    bad = [f"{i.importer}:{i.line} imports {i.target}" for i in all_imports() if in_room(i.target, "tests")]
    assert bad == []


def private_sdk_imports(imports: Iterable[Import]) -> list[str]:
    return sorted(
        f"{i.importer}:{i.line} imports {i.target}"
        for i in imports
        if in_room(i.target, "mcp") and any(part.startswith("_") for part in i.target.split(".")[1:])
    )


def test_only_sdk_compat_imports_sdk_internals() -> None:
    bad = [line for line in private_sdk_imports(all_imports()) if not line.startswith("kernmind.sdk_compat:")]
    assert bad == []


# --- the checks themselves can fail ---------------------------------------------------------
def test_find_cycle_on_synthetic_graphs() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": {"y"}}) == ["y", "z", "y"]


def test_graph_counts_lazy_imports_and_packages_but_not_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "kernmind"
    (pkg / "execution").mkdir(parents=True)
    (pkg / "memory").mkdir()
    for init in (pkg / "__init__.py", pkg / "execution" / "__init__.py"):
        init.write_text("")
    (pkg / "memory" / "__init__.py").write_text("from kernmind.memory.store import Store\n")
    (pkg / "memory" / "store.py").write_text("class Store: ...\n")
    (pkg / "memory" / "other.py").write_text("from kernmind.memory import store\n")
    (pkg / "execution" / "run.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kernmind.memory.other import x\n"
        "def f():\n    from kernmind.memory.store import Store\n    import tests.helpers\n"
        "    from mcp.server._private import thing\n"
    )
    (pkg / "execution" / "back.py").write_text("from kernmind.execution.run import f\n")
    (pkg / "execution" / "loop.py").write_text("from kernmind.execution import back\n")
    graph = import_graph(pkg)
    # the lazy import counts, and so does the package __init__ it runs; TYPE_CHECKING does not
    assert graph["kernmind.execution.run"] == {"kernmind.memory.store", "kernmind.memory"}
    # a module's own package importing it is no edge back
    assert "kernmind.memory" not in graph["kernmind.memory.other"]
    assert crossings(graph, "kernmind.execution", "kernmind.memory") == [
        "kernmind.execution.run -> kernmind.memory",
        "kernmind.execution.run -> kernmind.memory.store",
    ]
    assert find_cycle(graph) is None
    (pkg / "execution" / "run.py").write_text("from kernmind.execution.loop import back\n")
    assert find_cycle(import_graph(pkg)) == [
        "kernmind.execution.back",
        "kernmind.execution.run",
        "kernmind.execution.loop",
        "kernmind.execution.back",
    ]


def test_entry_points_let_through_only_themselves() -> None:
    assert allowed_entry("kernmind.memory.recorder", AGENT_ENTRY_POINTS)
    assert allowed_entry("kernmind.memory", AGENT_ENTRY_POINTS)  # its package's __init__ runs first
    assert not allowed_entry("kernmind.memory.store", AGENT_ENTRY_POINTS)
    assert not allowed_entry("kernmind.memory.recorder_extra", AGENT_ENTRY_POINTS)


def test_private_sdk_import_is_seen() -> None:
    found = list(imports_of("def f():\n    from mcp.server._x import y\n", "kernmind.agent.model", False))
    assert private_sdk_imports(found) == ["kernmind.agent.model:2 imports mcp.server._x.y"]
    found = list(imports_of("from mcp.server.mcpserver import _hidden\n", "kernmind.server", False))
    assert private_sdk_imports(found) == ["kernmind.server:1 imports mcp.server.mcpserver._hidden"]
    assert private_sdk_imports(imports_of("from mcp.types import Tool\n", "kernmind.server", False)) == []
