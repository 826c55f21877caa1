"""The tokens file (principals.py): data keys, revocation records, adoption, and old files.

The rules: a principal's data lives under its key; a revoked name's key is kept in the
file's ``revoked`` list and never given to a later principal of that name unless it adopts
it; a file written before keys existed still works, each principal keeping its name as key;
data that no entry records (revoked before revocations were recorded) is not inherited.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from kernmind.principals import LOCAL, SHARED_TOKEN, Principal
from kernmind.revocation import (
    in_force,
    revoked,
    revoked_sentence,
    still_valid,
    watch_revocations,
)
from kernmind.tokens_file import Authenticator, TokenFile, TokenFileError, default_tokens_file


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


# --- changes while a server runs: added tokens, revocation --------------------------------------
def test_a_server_with_only_a_token_reads_the_tokens_file_made_later(tmp_path: Path) -> None:
    """``--token`` and no tokens file at start: ``kernmind tokens add`` makes the default file, and
    its principal is known at its first request (before, the file was never looked at: 401)."""
    auth = Authenticator.of("owner-secret", None, tmp_path)
    assert auth.required and auth.principal_for(b"owner-secret") == SHARED_TOKEN
    token = TokenFile(default_tokens_file(tmp_path)).add("alice", [])
    found = auth.principal_for(token.encode())
    assert found is not None and found.name == "alice"


def test_a_file_that_turns_malformed_after_start_keeps_the_last_good_contents(tmp_path: Path) -> None:
    """A request's check never raises once the file was read (a 500 for everyone would follow)."""
    auth = Authenticator.of("owner-secret", None, tmp_path)  # no file yet: read as empty
    default_tokens_file(tmp_path).write_text("{not json")
    assert auth.principal_for(b"anything") is None
    assert auth.principal_for(b"owner-secret") == SHARED_TOKEN


def test_revoked_says_why_while_a_file_is_in_force(tmp_path: Path) -> None:
    file = TokenFile(tmp_path / "tokens.json")
    file.add("alice", [])
    file.add("bob", [])
    alice = Principal("alice")
    assert revoked(alice) is None  # no tokens file in force: nothing is revoked
    with in_force(TokenFile(file.path)):
        assert revoked(alice) is None and still_valid(alice)
        file.revoke("alice")
        assert revoked(alice) == revoked_sentence("alice")  # at once, not at the watch's next turn
        assert revoked("alice") is not None and revoked("bob") is None and not still_valid(alice)
        assert revoked(LOCAL) is None and revoked(SHARED_TOKEN) is None
        file.add("carol", [], adopt="alice")  # the key is live again, under another name
        assert revoked(alice) is None
    assert revoked(Principal("nobody")) is None


@pytest.mark.anyio
async def test_the_watch_ends_a_revoked_key_without_a_request(tmp_path: Path) -> None:
    file = TokenFile(tmp_path / "tokens.json")
    file.add("alice", [])
    file.add("bob", [])
    ended: list[tuple[str, str]] = []
    done = anyio.Event()

    async def on_revoked(owner: str, why: str) -> None:
        ended.append((owner, why))
        done.set()
        raise RuntimeError("a failure here does not stop the watch")

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: watch_revocations(file.path, on_revoked, period=0.05))
        await anyio.wait_all_tasks_blocked()
        file.revoke("alice")
        with anyio.fail_after(10):
            await done.wait()
        file.revoke("bob")  # the watch survived the failure above
        with anyio.fail_after(10):
            while len(ended) < 2:  # noqa: ASYNC110 (the watch's next turn)
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert ended == [("alice", revoked_sentence("alice")), ("bob", revoked_sentence("bob"))]


def test_a_key_no_file_ever_named_is_not_revoked(tmp_path: Path) -> None:
    """A principal made in-process (tests, the server's own callers) is not refused because a
    tokens file is in force: only a key the file records as revoked, or one the watch saw go."""
    file = TokenFile(tmp_path / "tokens.json")
    file.add("alice", [])
    with in_force(TokenFile(file.path)) as tokens:
        assert revoked(Principal("stranger")) is None
        tokens.ended.add("stranger")  # (what the watch does when a live key disappears)
        assert revoked(Principal("stranger")) == revoked_sentence("stranger")
