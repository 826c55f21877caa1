"""The install guard's other routes: whatever gets past the magics and the shims fails at
once without the network, and the shims leave non-install commands alone. (The main routes,
``%pip``/``!pip``/bash ``pip install``, are in test_install_packages_tool.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("packages"), pytest.mark.slow]


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    async with Client(create_server(make_settings(tmp_path_factory.mktemp("guard"), pool_size=1))) as c:
        yield c


async def run(client: Client, code: str, **kw: object) -> dict:
    return structured(await client.call_tool("run_code", {"code": code, "session_id": "guard", **kw}))


@pytest.mark.parametrize(
    "code",
    ["%conda install numpy", "!python3 -m pip install x", "!cd /tmp && pip3 install -q x", "%pip download x"],
)
async def test_every_install_form_in_a_cell_is_refused(client: Client, code: str) -> None:
    out = await run(client, code)
    assert out["status"] == "error" and out["error"]["name"] == "InstallFromCodeRefused"


async def test_pip_in_a_subprocess_fails_at_once_without_the_network(client: Client) -> None:
    code = (
        "import subprocess, sys\n"
        "p = subprocess.run([sys.executable, '-m', 'pip', 'install', 'surely-not-installed-xyz'],"
        " capture_output=True, text=True)\n"
        "p.returncode, 'Could not find a version' in p.stderr or 'No module named pip' in p.stderr"
    )
    out = await run(client, code)
    assert out["status"] == "ok" and out["results"][0]["text"] == "(1, True)"


async def test_commands_that_do_not_install_still_work(client: Client) -> None:
    out = await run(
        client, "pip --version >/dev/null && npm --version >/dev/null && echo fine", language="bash"
    )
    assert out["status"] == "ok" and out["logs"]["stdout"] == ["fine\n"]
    out = await run(client, "%pip --version")
    assert out["status"] == "ok" and "pip" in "".join(out["logs"]["stdout"])
    out = await run(client, "!true")
    assert out["logs"]["stderr"] == []
