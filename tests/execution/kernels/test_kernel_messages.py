"""What a kernel sends cannot break a call: malformed Jupyter messages and unencodable text.

Code in a session can write anything to its kernel's iopub socket (the kernel holds the
signing key): messages without an id or a type, with a list where the content belongs,
a display whose data is not a MIME bundle, unsigned or garbage frames. Through a real MCP
server (in-process, real kernels), the call still returns its own output, with a note
saying what was ignored, and the next call works on the same interpreter. A string Python
can hold but UTF-8 cannot (a lone surrogate) comes back as an escape, with the output
around it, and no traceback with the server's paths.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

FORGE = r"""
import json
k = get_ipython().kernel
parent = json.dumps(k.get_parent("shell")["header"], default=str).encode()

def raw(header, content, par=parent):
    frames = [json.dumps(header).encode(), par, b"{}", json.dumps(content).encode()]
    k.iopub_socket.send_multipart([b"<IDS|MSG>", k.session.sign(frames), *frames])

print("before", flush=True)
raw({"msg_id": "m1", "msg_type": "stream"}, [1, 2])                        # content is a list
raw({"msg_id": "m2", "msg_type": "display_data"}, {"data": "not a bundle"})
raw({"msg_id": "m3", "msg_type": "execute_result"}, {"data": {"text/plain": 5}, "execution_count": "x"})
raw({"msg_type": "stream"}, {"name": "stdout", "text": "no msg_id"})        # KeyError: 'msg_id'
raw({"msg_id": "m4", "msg_type": "stream"}, {"name": "stdout", "text": "x"}, b"[1]")  # parent is a list
raw({"msg_id": "m5", "msg_type": 7}, {})
k.iopub_socket.send_multipart([b"<IDS|MSG>", b"bad signature", b"{}", b"{}", b"{}", b"{}"])
k.iopub_socket.send_multipart([b"no delimiter at all"])
marker = 41
print("after", flush=True)
"""


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    data = tmp_path_factory.mktemp("kernel-messages")
    async with Client(create_server(make_settings(data, pool_size=0))) as c:
        yield c


async def test_malformed_messages_are_ignored_with_a_note_and_the_kernel_keeps_serving(
    client: Client,
) -> None:
    out = structured(await client.call_tool("run_code", {"code": FORGE, "session_id": "forger"}))
    assert out["status"] == "ok", out
    assert "".join(out["logs"]["stdout"]) == "before\nafter\n"
    notes = " ".join(out["notes"])
    assert "malformed Jupyter messages during this call" in notes and "they were ignored" in notes, notes
    nxt = structured(await client.call_tool("run_code", {"code": "marker + 1", "session_id": "forger"}))
    assert nxt["results"][0]["text"] == "42"  # the same interpreter, not a restarted one
    assert not nxt["notes"]


async def test_lone_surrogates_come_back_as_escapes_with_the_rest_of_the_output(client: Client) -> None:
    out = structured(
        await client.call_tool("run_code", {"code": "print('before'); print('\\ud800'); print('after')"})
    )
    assert "".join(out["logs"]["stdout"]) == "before\n\\ud800\nafter\n", out
    assert not out["logs"]["stderr"]
    out = structured(
        await client.call_tool(
            "run_code",
            {"code": "import sys; sys.stderr.write('bad byte: \\udcff\\n'); 'x\\ud83dy'"},
        )
    )
    assert out["logs"]["stderr"] == ["bad byte: \\xff\n"], out
    assert out["results"][0]["text"] == "'x\\ud83dy'"
    out = structured(await client.call_tool("run_code", {"code": "raise ValueError('v\\udfff')"}))
    assert out["status"] == "error" and out["error"]["value"] == "v\\udfff", out
    for text in (str(out), *out["logs"]["stderr"]):
        assert sys.prefix not in text and "site-packages" not in text
