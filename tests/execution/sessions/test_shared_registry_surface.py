"""The gateway's shared registry is not built on ``SessionRegistry`` (issue 34: no class over
another's state; both are a ``LiveSessions``), so nothing inherited keeps the two in step: this
checks that it offers everything the executor and the jobs ask of a registry. Its behaviour is tested end to end with real
replicas, PostgreSQL and a kernel gateway in tests/execution/kernels/test_gateway_replicas.py."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from kernmind.execution import executor
from kernmind.execution.sessions import jobs
from kernmind.execution.sessions.live import LiveSessions
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


def offered(cls: type) -> set[str]:
    """Its methods and class attributes, and the attributes its (and its bases') ``__init__`` sets."""
    init: set[str] = set()
    for klass in cls.__mro__[:-1]:  # (not object)
        tree = ast.parse(inspect.getsource(klass))
        init |= {
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
    assert asked <= offered(SessionRegistry)
    assert asked - offered(SharedSessionRegistry) == set()


def test_the_two_share_only_the_bookkeeping_of_live_sessions() -> None:
    """Neither is built on the other: what they keep alike (live sessions, jobs' reservations,
    caps) is ``LiveSessions``'s, and each adds its own loading, holding, reaping and closing."""
    assert SharedSessionRegistry.__mro__ == (SharedSessionRegistry, LiveSessions, object)
    assert SessionRegistry.__mro__ == (SessionRegistry, LiveSessions, object)
