"""The sentences both transports refuse bad messages with (fast; the listeners are tested over
real HTTP and stdio in test_chaos.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kernmind.transport.bad_messages import decode, form_problem, head_id, reply_id, shape_problem

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"[" * 200_000, "nested too deeply"),
        (b'{"a":' * 100_000, "nested too deeply"),
        (b'{"id": 1, "x": "\xff"}', "not valid UTF-8"),
        (b'{"id": 1,', "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"id": ' + b"9" * 5000 + b"}", "not valid JSON"),  # past Python's digit limit
    ],
)
def test_decode_never_raises_and_says_why(body: bytes, why: str) -> None:
    message, problem = decode(body)
    assert message is None and problem is not None and why in problem


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ([{"jsonrpc": "2.0", "id": 1, "method": "x"}], "batch requests are not supported"),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "x"}, "id is an object"),
        ({"jsonrpc": "2.0", "id": True, "method": "x"}, "id is a boolean"),
        ({"jsonrpc": "2.0", "id": None, "method": "x"}, "id is null"),
        ({"jsonrpc": "1.0", "id": 1, "method": "x"}, '"jsonrpc" member must be the string "2.0"'),
        ({"jsonrpc": "2.0", "id": 1, "method": 5}, '"method" must be a string'),
        ({"jsonrpc": "2.0", "id": 1, "method": "x", "params": [1]}, '"params" must be an object'),
        ({"jsonrpc": "2.0", "id": 1}, 'has no "method"'),
        (42, "it is a number, not an object"),
        (None, "it is null, not an object"),
    ],
)
def test_form_problem_names_the_mistake(message: Any, said: str) -> None:
    sentence = form_problem(message)
    assert said in sentence and "Nothing was done" in sentence


def test_a_good_id_is_no_problem_and_is_echoed() -> None:
    for rid in (1, "req-1", 2.0):
        assert shape_problem({"jsonrpc": "2.0", "id": rid, "method": "x"}) is None
    assert reply_id({"id": 7}) == 7 and reply_id({"id": "a"}) == "a"
    assert reply_id({"id": "\ud800"}) is None  # cannot be written back as UTF-8
    assert reply_id({"id": True}) is None and reply_id([1]) is None


@pytest.mark.parametrize(
    ("head", "rid"),
    [
        (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"x":"aaaa', 5),
        (b'{"jsonrpc": "2.0", "id": "req-9", "method"', "req-9"),
        (b'  {"id": -3, "jsonrpc"', -3),
        (b'{"method":"tools/call","params":{"id":5', None),  # an id further in may be anyone's
        (b'{"jsonrpc":"2.0","id":{"a":1}', None),
        (b"[[[[", None),
    ],
)
def test_head_id_reads_only_an_id_written_first(head: bytes, rid: Any) -> None:
    assert head_id(head) == rid
