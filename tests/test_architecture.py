"""The shape of the package: which module may import which.

The import graph of ``src/kernmind`` is read from the source with ``ast`` (nothing is
imported): every ``import``/``from … import`` at any depth — inside functions too, since a
lazy import still ties two modules together, and under ``if TYPE_CHECKING:`` too, since a type
named across rooms is a coupling all the same. Importing ``a.b.c`` also runs ``a/__init__.py``
and ``a/b/__init__.py``, so those count as edges too (except a module's own enclosing packages,
which are already running).

The rules:
- no import cycle anywhere in ``src/`` (each one is listed, with a path through it);
- the top-level modules and rooms import downwards only, in the order of ``LAYERS``; inside
  ``execution/`` the rooms' order is ``tests/execution/test_layers.py``'s ``rank`` (sandbox,
  packages, kernels, sessions, runners, the call path, tools), checked here on this graph;
- ``memory`` and ``execution`` never import each other; the bundled ``agent`` imports
  neither (it talks to them over MCP like any other client), except the public entry points
  named in ``AGENT_ENTRY_POINTS`` (the conversation recorder);
- nothing in ``src`` imports ``tests``;
- ``sdk_compat.py`` is the only module that imports a private (``_``-prefixed) name of the
  ``mcp`` SDK.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

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


def imports_of(source: str, name: str, is_package: bool, type_checking: bool = True) -> Iterator[Import]:
    """Every import in ``source`` (module ``name``), at any depth; those under ``if TYPE_CHECKING:``
    only when ``type_checking``."""
    package = name if is_package else name.rpartition(".")[0]

    def walk(node: ast.AST) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.If) and _is_type_checking(child.test):
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


def import_graph(root: Path = PACKAGE, imports: Iterable[Import] | None = None) -> dict[str, set[str]]:
    """Module -> the modules of ours that importing it runs (see the module docstring)."""
    modules = source_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for imp in all_imports(root) if imports is None else imports:
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


@functools.cache
def package_imports() -> tuple[Import, ...]:
    """The real package's imports, read once per test run."""
    return tuple(all_imports())


@functools.cache
def package_graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(targets) for name, targets in import_graph(imports=package_imports()).items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected components of ``graph`` with more than one module (each one holds
    at least one cycle), found with Tarjan's algorithm (iteratively: the graph may be deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return sorted(found, key=sorted)


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
    graph = package_graph()
    assert "kernmind.server" in graph and "kernmind.execution.executor" in graph
    assert "kernmind.execution.executor" in graph["kernmind.server"]


def cycle_report(graph: Mapping[str, Iterable[str]], components: Iterable[frozenset[str]]) -> list[str]:
    """One line per component: its modules, and one path round it."""
    lines = []
    for component in components:
        inside = {m: [t for t in graph[m] if t in component] for m in component}
        path = find_cycle(inside) or []
        lines.append(f"{len(component)} modules {sorted(component)}: " + " -> ".join(path))
    return lines


def test_no_import_cycle() -> None:
    graph = package_graph()
    assert cycles(graph) == [], "import cycles (TYPE_CHECKING imports count):\n" + "\n".join(
        cycle_report(graph, cycles(graph))
    )


# The top-level modules and rooms, bottom to top (names under ``kernmind.``; "" is the package
# itself). A module imports its own layer or those below, never one above; a new module or room
# takes its place here (the test says so).
LAYERS: tuple[tuple[str, ...], ...] = (
    # vocabulary: nothing of ours below them
    ("", "sdk_compat", "refusals", "budget", "input_limits", "validation_text", "setting_meta"),
    ("supervise", "db_location"),
    # what every room shares: files, callers, arguments, the one boundary, settings
    (
        "diskio",
        "principals",
        "tool_arguments",
        "tokens_file",
        "boundary",
        "revocation",
        "config",
        "settings_cli",
    ),
    ("memory", "execution"),  # the two halves (never importing each other: see below)
    ("codemode", "ui", "agent", "doctor", "tokens_cli"),  # what uses the halves
    ("server",),  # wires them together
    ("transport", "settings_docs"),  # how clients reach the server
    ("cli", "ui_cli", "__main__"),  # the commands
)


def unit_of(module: str) -> str:
    """The top-level module or room ``module`` belongs to (``kernmind.execution.x`` -> ``execution``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_offences(
    graph: Mapping[str, Iterable[str]],
    layers: tuple[tuple[str, ...], ...] = LAYERS,
    inner: Callable[[str], int | None] | None = None,
) -> list[str]:
    """Imports that go up: between the units of ``layers``, and (by ``inner``'s rank) inside a room."""
    level = {unit: i for i, names in enumerate(layers) for unit in names}
    bad = [
        f"{m} is in no layer: give {unit_of(m) or 'kernmind'!r} a place in LAYERS"
        for m in graph
        if unit_of(m) not in level
    ]
    for importer, targets in graph.items():
        for target in targets:
            mine, theirs = level.get(unit_of(importer)), level.get(unit_of(target))
            if mine is not None and theirs is not None and theirs > mine:
                bad.append(f"{importer} -> {target} (layer {mine} imports layer {theirs})")
            elif (
                inner is not None
                and (a := inner(importer)) is not None
                and (b := inner(target)) is not None
                and b > a
            ):
                bad.append(f"{importer} -> {target} (room rank {a} imports rank {b})")
    return sorted(bad)


def execution_rank(module: str) -> int | None:
    """The rank of ``module``'s room inside ``execution/``: the one order, in test_layers.py."""
    from tests.execution.test_layers import rank  # (here: /work/coord/cycles.py imports this file alone)

    return rank(module)


def test_layers_are_imported_downwards_only() -> None:
    offences = layer_offences(package_graph(), inner=execution_rank)
    assert offences == [], "imports that go up a layer:\n" + "\n".join(offences)


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
        for c in crossings(package_graph(), source, forbidden)
        if not allowed_entry(c.split(" -> ")[1], entry_points)
    ]
    assert bad == []


def test_src_never_imports_tests() -> None:
    bad = [
        f"{i.importer}:{i.line} imports {i.target}" for i in package_imports() if in_room(i.target, "tests")
    ]
    assert bad == []


def private_sdk_imports(imports: Iterable[Import]) -> list[str]:
    return sorted(
        f"{i.importer}:{i.line} imports {i.target}"
        for i in imports
        if in_room(i.target, "mcp") and any(part.startswith("_") for part in i.target.split(".")[1:])
    )


def test_only_sdk_compat_imports_sdk_internals() -> None:
    bad = [
        line for line in private_sdk_imports(package_imports()) if not line.startswith("kernmind.sdk_compat:")
    ]
    assert bad == []


# --- the checks themselves can fail ---------------------------------------------------------
def test_find_cycle_on_synthetic_graphs() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": {"y"}}) == ["y", "z", "y"]


def test_graph_counts_lazy_and_type_checking_imports_and_packages(tmp_path: Path) -> None:
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
    # the lazy import counts, and so does the package __init__ it runs; so does TYPE_CHECKING
    assert graph["kernmind.execution.run"] == {
        "kernmind.memory.store",
        "kernmind.memory",
        "kernmind.memory.other",
    }
    source = (pkg / "execution" / "run.py").read_text()
    plain = {i.target for i in imports_of(source, "kernmind.execution.run", False, type_checking=False)}
    assert "kernmind.memory.other.x" not in plain and "kernmind.memory.store.Store" in plain
    # a module's own package importing it is no edge back
    assert "kernmind.memory" not in graph["kernmind.memory.other"]
    assert crossings(graph, "kernmind.execution", "kernmind.memory") == [
        "kernmind.execution.run -> kernmind.memory",
        "kernmind.execution.run -> kernmind.memory.other",
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


def test_cycles_lists_every_component() -> None:
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "x": {"y"}, "y": {"z"}, "z": {"x"}, "solo": {"solo"}}
    assert cycles(graph) == [frozenset({"a", "b"}), frozenset({"x", "y", "z"})]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycle_report(graph, cycles(graph)) == [
        "2 modules ['a', 'b']: a -> b -> a",
        "3 modules ['x', 'y', 'z']: x -> y -> z -> x",
    ]


def test_layer_offences_are_named() -> None:
    layers = (("", "refusals"), ("execution",), ("server",))
    graph = {
        "kernmind.refusals": {"kernmind.server"},  # up two layers
        "kernmind.server": {"kernmind.execution.kernels.pool", "kernmind.refusals"},
        "kernmind.execution.kernels.pool": {"kernmind.execution.sessions.registry"},  # up a room
        "kernmind.execution.sessions.registry": {"kernmind.execution.kernels.pool"},
        "kernmind.newcomer": set(),
    }
    assert layer_offences(graph, layers, inner=execution_rank) == [
        "kernmind.execution.kernels.pool -> kernmind.execution.sessions.registry (room rank 2 imports rank 3)",
        "kernmind.newcomer is in no layer: give 'newcomer' a place in LAYERS",
        "kernmind.refusals -> kernmind.server (layer 0 imports layer 2)",
    ]
    assert layer_offences({"kernmind.server": {"kernmind.refusals"}}, layers) == []


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
