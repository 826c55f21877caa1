"""Shared fixtures: the anyio backend and helpers to run a real kernmind server in-process.

``anyio_backend`` is session-scoped so module-scoped async fixtures (one server shared
by a module's tests) work with anyio's pytest plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_types import CallToolResult

from kernmind.config import Settings
from kernmind.sdk_compat import skip_iri_syntax_checker
from tests.memory.postgres_server import PostgresServer

# a test past its time limit fails with its stacks and the run goes on (see the module)
pytest_plugins = ["tests.hang_guard", "tests.timings"]

skip_iri_syntax_checker()  # as the console script does: the tests' MCP clients check results the same way


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fast layer (``-m fast``: logic on fake kernels, milliseconds each) runs first, so a
    broken rule above kernels shows before the end-to-end tests start their kernels."""
    items.sort(key=lambda item: item.get_closest_marker("fast") is None)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (memory on PostgreSQL, sessions shared by replicas), one per worker."""
    try:
        server = PostgresServer().start()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        pytest.skip(f"cannot start PostgreSQL here: {detail}")
    try:
        yield server
    finally:
        server.stop()


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings for a test server: its own data dir and database, small pool, short limits."""
    base: dict[str, Any] = {
        "data_dir": data_dir,
        "db": data_dir / "kernmind.db",
        "pool_size": 1,
        "timeout": 30,
        "preload": [],  # see tests/transport/procs.py's TEST_PRELOAD
    }
    base.update(overrides)
    return Settings(**base)


def structured(result: CallToolResult) -> dict[str, Any]:
    """The structured content of a successful tool call (fails the test with the error text otherwise)."""
    assert not result.is_error, f"tool error: {result.content[0].text if result.content else result}"
    assert result.structured_content is not None
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    assert result.is_error, f"expected a tool error, got {json.dumps(result.structured_content)[:500]}"
    return " ".join(getattr(c, "text", "") for c in result.content)


def chaos_seed(fixed: int) -> int:
    """The chaos tests' seed: ``fixed`` (what CI runs), or ``KERNMIND_TEST_CHAOS_SEED`` to try others."""
    return int(os.environ.get("KERNMIND_TEST_CHAOS_SEED", fixed))
