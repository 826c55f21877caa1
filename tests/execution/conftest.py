"""Fixtures for execution tests: a real Jupyter Kernel Gateway (one per worker, shared).

``gateway_settings(data_dir, gateway, postgres)`` are the settings of a kernmind whose Python
runs on that gateway with sessions in PostgreSQL: the full shape of a deployment on a
cluster, on one machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernmind.config import Settings
from tests.conftest import make_settings
from tests.memory.postgres_server import PostgresServer

from .gateway_server import KernelGatewayServer


@pytest.fixture(scope="session")
def kernel_gateway() -> Iterator[KernelGatewayServer]:
    try:
        server = KernelGatewayServer().start()
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"cannot start jupyter-kernel-gateway here (pip install jupyter-kernel-gateway): {exc}")
    try:
        yield server
    finally:
        server.close()


def gateway_settings(
    data_dir: Path, gateway: KernelGatewayServer, postgres: PostgresServer | None, **overrides: Any
) -> Settings:
    """A kernmind on ``gateway``, with its sessions (and memory) in a fresh database on ``postgres``."""
    extra: dict[str, Any] = {
        "kernel_gateway": gateway.url,
        "kernel_gateway_token": gateway.token,
    }
    if postgres is not None:
        extra["db"] = postgres.new_database()
    return make_settings(data_dir, **{**extra, **overrides})
