"""Fixtures for the agent tests: the scripted model server and agent builders."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from scripted_openai import ScriptedOpenAI


@pytest.fixture
def llm() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    try:
        yield server
    finally:
        server.stop()
