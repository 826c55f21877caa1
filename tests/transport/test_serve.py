"""``kernmind serve``'s start: no garbage collection while it starts, then its heap frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmind.config import Settings
from kernmind.transport.serve import collections_paused, serve


@pytest.fixture(autouse=True)
def heap_as_it_was() -> Iterator[None]:
    """What a test froze goes back to the collector, and collection is on again afterwards."""
    yield
    gc.unfreeze()
    gc.enable()


def test_the_collector_is_off_while_the_server_starts_and_what_it_made_is_frozen() -> None:
    frozen_before = gc.get_freeze_count()
    with collections_paused():
        assert not gc.isenabled()
        made = [[] for _ in range(1000)]  # objects the start keeps, as its modules are
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + len(made)


def test_a_start_that_fails_turns_the_collector_back_on() -> None:
    with pytest.raises(RuntimeError, match="no sandbox"), collections_paused():
        raise RuntimeError("no sandbox")
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_embedding_program_stays_off() -> None:
    gc.disable()
    with collections_paused():
        pass
    assert not gc.isenabled()


def test_a_refused_configuration_leaves_the_collector_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(transport="http", host="0.0.0.0", data_dir=tmp_path, sandbox="none")
    assert serve(settings) == 2
    assert "refusing to listen on '0.0.0.0' without a token" in capsys.readouterr().err
    assert gc.isenabled()
