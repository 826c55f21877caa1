"""The tokens file (principals.py): data keys, revocation records, adoption, and old files.

The rules: a principal's data lives under its key; a revoked name's key is kept in the
file's ``revoked`` list and never given to a later principal of that name unless it adopts
it; a file written before keys existed still works, each principal keeping its name as key;
data that no entry records (revoked before revocations were recorded) is not inherited.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernmind.principals import TokenFile, TokenFileError


def principal(file: TokenFile, token: str) -> tuple[str, str]:
    found = file.principal_for(token)
    assert found is not None
    return found.name, found.owner


def test_a_file_from_before_data_keys_keeps_every_principals_data(tmp_path: Path) -> None:
    old = TokenFile(tmp_path / "tokens.json")
    token = old.add("bob", [])
    doc = json.loads(old.path.read_text())
    assert "owner" not in doc["tokens"][0] and "revoked" not in doc  # the old format, unchanged
    assert principal(TokenFile(old.path), token) == ("bob", "bob")


def test_revoke_then_add_gives_a_fresh_key_and_adopt_gives_the_old_one(tmp_path: Path) -> None:
    file = TokenFile(tmp_path / "tokens.json")
    first = file.add("bob", [])
    record = file.revoke("bob")
    assert record["owner"] == "bob" and record["revoked"]
    assert file.principal_for(first) is None
    second = file.add("bob", [])
    assert principal(file, second) == ("bob", "bob~2")
    file.revoke("bob")
    assert [r["owner"] for r in file.revoked()] == ["bob", "bob~2"]
    third = file.add("bob", [], adopt="bob")  # the latest revoked bob
    assert principal(file, third) == ("bob", "bob~2")
    file.revoke("bob")
    fourth = file.add("robert", [], adopt="bob")  # another name may adopt too (by name, latest)
    assert principal(file, fourth) == ("robert", "bob~2")
    fifth = file.add("bob", [])
    assert principal(file, fifth) == ("bob", "bob~3")  # keys are never reused
    with pytest.raises(TokenFileError, match="nothing to adopt"):
        file.add("carol", [], adopt="carol")


def test_data_that_no_entry_records_is_not_inherited(tmp_path: Path) -> None:
    file = TokenFile(tmp_path / "tokens.json")
    token = file.add("carl", [], data_under=lambda key: key == "carl")
    assert principal(file, token) == ("carl", "carl~2")
    assert [(r["name"], r["owner"], r["revoked"]) for r in file.revoked()] == [("carl", "carl", None)]
    file.revoke("carl")
    adopted = file.add("carl", [], adopt="carl")  # the latest revoked carl: carl~2
    assert principal(file, adopted)[1] == "carl~2"


@pytest.mark.parametrize(
    "doc",
    [
        {"tokens": [], "revoked": "bob"},
        {"tokens": [], "revoked": [{"name": "bob", "owner": "../etc"}]},
        {
            "tokens": [
                {"name": "a", "sha256": "0" * 64, "owner": "x"},
                {"name": "b", "sha256": "1" * 64, "owner": "x"},
            ]
        },
    ],
    ids=["revoked-not-a-list", "bad-key", "shared-key"],
)
def test_malformed_keys_and_records_are_refused(tmp_path: Path, doc: dict[str, object]) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenFileError):
        TokenFile(path).refresh(strict=True)
