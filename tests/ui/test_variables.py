"""Listing a session's saved variables from its snapshot without loading them (ui/variables.py).

Fast: snapshots written here in the kernel's format (``KMSNAP2``, then per variable its name,
its serializer, its length and its pickle; a trailer). Nothing is ever unpickled: a pickle that
would run a command when loaded is listed by the name of what it calls, and the command does
not run. Links put where the snapshot should be are not followed.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest

from kernmind.ui.variables import MAGIC, saved_variables, type_of

pytestmark = pytest.mark.fast


def record(name: str, body: bytes, kind: bytes = b"p") -> bytes:
    key = name.encode()
    return struct.pack("<I", len(key)) + key + kind + struct.pack("<Q", len(body)) + body


def write_snapshot(files: Path, records: list[bytes], *, trailer: bool = True) -> Path:
    folder = files / ".km-state"
    folder.mkdir(parents=True, exist_ok=True)
    data = MAGIC + b"".join(records)
    if trailer:
        modules = json.dumps({"np": "numpy"}).encode()
        data += struct.pack("<I", 0) + b"m" + struct.pack("<Q", len(modules)) + modules
    path = folder / "namespace.pkl"
    path.write_bytes(data)
    return path


class Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch PWNED",))


def test_names_types_and_sizes(tmp_path: Path) -> None:
    values = {"n": 41, "s": "text", "xs": list(range(2000)), "pair": (1, 2), "d": {"k": 1}, "when": 1.5}
    bodies = {k: pickle.dumps(v, protocol=5) for k, v in values.items()}
    write_snapshot(tmp_path, [record(k, b) for k, b in bodies.items()] + [record("f", b"\x80\x05N.", b"d")])
    found = {v.name: v for v in saved_variables(tmp_path)}
    assert {k: v.type for k, v in found.items()} == {
        "n": "int",
        "s": "str",
        "xs": "list",
        "pair": "tuple",
        "d": "dict",
        "when": "float",
        "f": "NoneType",
    }
    assert found["xs"].bytes == len(bodies["xs"]) and found["f"].serializer == "dill"


def test_a_pickle_that_would_run_code_is_named_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    body = pickle.dumps(Boom(), protocol=5)
    write_snapshot(tmp_path, [record("boom", body)])
    (found,) = saved_variables(tmp_path)
    assert found.name == "boom" and found.type in ("posix.system", "os.system")
    assert not (tmp_path / "PWNED").exists()
    assert type_of(body) == found.type


def test_links_and_damage(tmp_path: Path) -> None:
    secret = tmp_path / "secret.pkl"
    secret.write_bytes(MAGIC + record("stolen", pickle.dumps(1)))
    linked = tmp_path / "a"
    (linked / ".km-state").mkdir(parents=True)
    (linked / ".km-state" / "namespace.pkl").symlink_to(secret)
    assert saved_variables(linked) == []
    folder_link = tmp_path / "b"
    folder_link.mkdir()
    (folder_link / ".km-state").symlink_to(secret.parent)
    assert saved_variables(folder_link) == []
    # cut short inside the second record: the first is listed
    damaged = tmp_path / "c"
    path = write_snapshot(damaged, [record("one", pickle.dumps(1)), record("two", pickle.dumps("x" * 100))])
    path.write_bytes(path.read_bytes()[: len(MAGIC) + 30])
    assert [v.name for v in saved_variables(damaged)] == ["one"]
    assert saved_variables(tmp_path / "nothing") == []
    (tmp_path / "d" / ".km-state").mkdir(parents=True)
    (tmp_path / "d" / ".km-state" / "namespace.pkl").write_bytes(b"not a snapshot")
    assert saved_variables(tmp_path / "d") == []
