"""The gateway's shared registry is its own class (issue 34: no subclass over another's state), so
nothing inherited keeps it in step with ``SessionRegistry``: this checks that it offers everything
the executor and the jobs ask of a registry. Its behaviour is tested end to end with real
replicas, PostgreSQL and a kernel gateway in tests/execution/kernels/test_gateway_replicas.py."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from kernmind.execution import executor
from kernmind.execution.sessions import jobs, registry, shared
from kernmind.execution.sessions.registry import SessionRegistry
from kernmind.execution.sessions.shared import SharedSessionRegistry


def asked_of(module: object, *chain: str) -> set[str]:
    """The names used as ``<chain>.<name>`` in ``module``'s source (``self.sessions.hold`` -> hold)."""

    def is_chain(node: ast.expr, names: tuple[str, ...]) -> bool:
        if len(names) == 1:
            return isinstance(node, ast.Name) and node.id == names[0]
        return isinstance(node, ast.Attribute) and node.attr == names[-1] and is_chain(node.value, names[:-1])

    tree = ast.parse(Path(inspect.getfile(module)).read_text())  # type: ignore[arg-type]
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and is_chain(n.value, chain)}


def offered(cls: type, module: object) -> set[str]:
    """Its methods and class attributes, and the attributes its ``__init__`` sets."""
    tree = ast.parse(Path(inspect.getfile(module)).read_text())  # type: ignore[arg-type]
    init = {
        t.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "__init__"
        for a in ast.walk(n)
        if isinstance(a, (ast.Assign, ast.AnnAssign))
        for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
        if isinstance(t, ast.Attribute)
    }
    return set(dir(cls)) | init


def test_the_shared_registry_offers_what_the_executor_and_the_jobs_ask_of_a_registry() -> None:
    asked = asked_of(executor, "self", "sessions") | asked_of(jobs, "sessions")
    assert {"hold", "load", "close", "end_owner", "run_reaper", "unload_all", "reserve"} <= asked
    assert asked <= offered(SessionRegistry, registry)
    assert asked - offered(SharedSessionRegistry, shared) == set()


def test_it_is_its_own_class() -> None:
    assert SharedSessionRegistry.__mro__ == (SharedSessionRegistry, object)
