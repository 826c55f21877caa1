"""``read_message`` agrees with jupyter_client's ``Session.deserialize``, and fails when upstream changes.

``kernels/jupyter_compat.py`` is a copy of ``Session.deserialize`` without date parsing that
calls the private ``Session._add_digest``. These tests compare both on real frames (valid,
unsigned, replayed, forged, short) and pin upstream's source: a jupyter_client whose
``deserialize`` or ``_add_digest`` changed fails here until the copy is checked against it.
"""

from __future__ import annotations

import hashlib
import inspect

import pytest
from jupyter_client.jsonutil import extract_dates
from jupyter_client.session import Session

from kernmind.execution.kernels.jupyter_compat import read_message

# sha256 of the source of Session.deserialize + Session._add_digest (jupyter_client 8.10.0).
UPSTREAM = "0d8f8d5723da54f45c3dee39512376c5aec67d3e3066e7b3e8f1a38f3ac9319a"


def test_upstream_unchanged() -> None:
    source = inspect.getsource(Session.deserialize) + inspect.getsource(Session._add_digest)
    assert hashlib.sha256(source.encode()).hexdigest() == UPSTREAM, (
        "jupyter_client's Session.deserialize or _add_digest changed: compare read_message in "
        "kernels/jupyter_compat.py with it, then update UPSTREAM"
    )


def _frames(sender: Session) -> list[bytes]:
    msg = sender.msg(
        "stream", content={"name": "stdout", "text": "hi\n"}, parent=sender.msg_header("execute_request")
    )
    return sender.serialize(msg, ident=b"kernel")


def _both(frames: list[bytes]) -> tuple[object, object]:
    """What upstream and the copy make of the same frames, each with a fresh session."""
    outcomes: list[object] = []
    for read in (lambda s, f: s.deserialize(s.feed_identities(f)[1]), read_message):
        session = Session(key=b"secret")
        try:
            outcomes.append(read(session, list(frames)))
        except (ValueError, TypeError) as exc:
            outcomes.append((type(exc), str(exc)))
    return outcomes[0], outcomes[1]


def test_valid_message_same_but_dates() -> None:
    upstream, ours = _both(_frames(Session(key=b"secret")))
    assert isinstance(ours, dict) and isinstance(upstream, dict)
    assert isinstance(ours["header"]["date"], str)
    ours = {
        **ours,
        "header": extract_dates(ours["header"]),
        "parent_header": extract_dates(ours["parent_header"]),
    }
    assert ours == upstream


@pytest.mark.parametrize(
    "forge",
    [
        lambda f: [f[0], f[1], b"", *f[3:]],  # unsigned
        lambda f: [f[0], f[1], b"0" * 64, *f[3:]],  # a forged signature
        lambda f: f[:5],  # too few frames
    ],
    ids=["unsigned", "forged", "short"],
)
def test_bad_messages_refused_alike(forge) -> None:
    upstream, ours = _both(forge(_frames(Session(key=b"secret"))))
    assert isinstance(ours, tuple) and ours == upstream


def test_replay_refused() -> None:
    session = Session(key=b"secret")
    frames = _frames(Session(key=b"secret"))
    read_message(session, list(frames))
    with pytest.raises(ValueError, match="Duplicate Signature"):
        read_message(session, list(frames))
