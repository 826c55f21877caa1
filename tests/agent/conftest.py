"""Fixtures for the agent tests: the scripted model server and agent builders."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .scripted_openai import ScriptedOpenAI


@pytest.fixture
def llm() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    try:
        yield server
    finally:
        server.stop()
