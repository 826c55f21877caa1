"""The one place kernmind reads jupyter_client's insides: ``Session.deserialize`` without dates.

Design: ``read_message`` is ``Session.deserialize`` minus parsing the headers' dates, most of the
cost of unpacking a message (benchmarks/README.md, "the per-call path"); it calls the private
``Session._add_digest`` as upstream does, and ``test_jupyter_compat.py`` pins upstream's source.

Error policy: a bad message raises ``ValueError``/``TypeError``, as upstream does.
"""

from __future__ import annotations

import hmac
from typing import Any


def read_message(session: Any, frames: list[bytes]) -> dict[str, Any]:
    """A message from its ZeroMQ frames (identities included), its headers' dates left as strings."""
    from jupyter_client.adapter import adapt

    _, frames = session.feed_identities(frames)
    if session.auth is not None:
        signature = frames[0]
        if not signature:
            raise ValueError("Unsigned Message")
        if signature in session.digest_history:
            raise ValueError(f"Duplicate Signature: {signature!r}")
        session._add_digest(signature)
        if not hmac.compare_digest(signature, session.sign(frames[1:5])):
            raise ValueError(f"Invalid Signature: {signature!r}")
    if len(frames) < 5:
        raise TypeError("malformed message, must have at least 5 elements")
    header = session.unpack(frames[1])
    return adapt(
        {
            "header": header,
            "msg_id": header["msg_id"],
            "msg_type": header["msg_type"],
            "parent_header": session.unpack(frames[2]),
            "metadata": session.unpack(frames[3]),
            "content": session.unpack(frames[4]),
            "buffers": [memoryview(b) for b in frames[5:]],
        }
    )
