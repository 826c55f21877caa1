"""``--kernel-gateway``: what is particular to kernels on a gateway (the run_code behaviour they
share with local kernels is tested by running test_python_run_code.py on both).

A real ``jupyter-kernel-gateway`` and a real PostgreSQL, started by the tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import error_text, structured
from tests.execution.conftest import gateway_settings
from tests.execution.gateway_server import KernelGatewayServer
from tests.memory.postgres_server import PostgresServer
from tests.transport.procs import run_cli

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("gateway"), pytest.mark.slow]


async def run(client: Client, code: str, **args: object) -> dict:
    return structured(await client.call_tool("run_code", {"code": code, **args}))


async def test_a_gateway_restart_gives_a_clear_error_then_recovers(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    gateway = KernelGatewayServer().start()
    try:
        settings = gateway_settings(tmp_path, gateway, postgres_server, pool_size=0)
        async with Client(create_server(settings)) as client:
            await run(client, "x = 1\nopen('kept.txt', 'w').write('kept')", session_id="g")
            results: dict[str, dict] = {}

            async def running() -> None:
                code = "import time\nopen('started', 'w').close()\ntime.sleep(8)"
                results["cut"] = await run(client, code, session_id="g")

            (workspace,) = {p.parent for p in tmp_path.rglob("kept.txt")}
            async with anyio.create_task_group() as tg:
                tg.start_soon(running)
                with anyio.fail_after(60):  # the kernel is inside the call
                    while not (workspace / "started").exists():  # noqa: ASYNC110 - a file the kernel writes
                        await anyio.sleep(0.02)
                await anyio.to_thread.run_sync(gateway.stop)
            cut = results["cut"]
            assert cut["status"] == "error" and cut["error"]["name"] == "KernelDied"
            assert "kernel gateway" in cut["error"]["value"] and cut["state_preserved"] is False

            down = error_text(await client.call_tool("run_code", {"code": "1", "session_id": "g"}))
            assert gateway.url in down and "unreachable" in down

            await anyio.to_thread.run_sync(gateway.start)
            back = await run(client, "open('kept.txt').read(), 'x' in globals()", session_id="g")
            assert back["results"][0]["text"] == "('kept', False)"
            fresh = await run(client, "2 + 2", session_id="new-after-restart")
            assert fresh["results"][0]["text"] == "4"
    finally:
        gateway.close()


async def test_a_wrong_token_is_refused_in_words(tmp_path: Path, kernel_gateway: KernelGatewayServer) -> None:
    settings = gateway_settings(tmp_path, kernel_gateway, None, pool_size=0, kernel_gateway_token="wrong")
    async with Client(create_server(settings)) as client:
        msg = error_text(await client.call_tool("run_code", {"code": "1"}))
        assert "401" in msg and "--kernel-gateway-token" in msg


async def test_kernels_that_cannot_see_the_shared_directory_are_refused_in_words(
    tmp_path: Path, kernel_gateway: KernelGatewayServer
) -> None:
    settings = gateway_settings(
        tmp_path, kernel_gateway, None, pool_size=0, kernel_gateway_kernel_workspaces="/nonexistent/volume"
    )
    async with Client(create_server(settings)) as client:
        msg = error_text(await client.call_tool("run_code", {"code": "1"}))
        assert "cannot see its working directory" in msg and "--kernel-gateway-kernel-workspaces" in msg


async def test_files_are_shared_with_the_gateway_kernel_and_local_languages(
    tmp_path: Path, kernel_gateway: KernelGatewayServer
) -> None:
    """Uploads land where the remote kernel works; bash, run here, sees the same directory."""
    settings = gateway_settings(tmp_path, kernel_gateway, None, pool_size=0, sandbox="none")
    async with Client(create_server(settings)) as client:
        structured(
            await client.call_tool("upload_file", {"path": "d/in.txt", "content": "hello", "session_id": "f"})
        )
        out = await run(client, "import os\nprint(open('d/in.txt').read(), os.getcwd())", session_id="f")
        content, cwd = "".join(out["logs"]["stdout"]).split()
        assert content == "hello" and Path(cwd).parent == settings.gateway_workspaces_dir
        made = await run(client, "open('out.bin', 'wb').write(bytes(range(256)))", session_id="f")
        assert made["files"] == [{"path": "out.bin", "size": 256, "mime": "application/octet-stream"}]
        got = structured(await client.call_tool("download_file", {"path": "out.bin", "session_id": "f"}))
        assert got["encoding"] == "base64" and got["size"] == 256
        listed = await run(client, "ls out.bin d", language="bash", session_id="f")
        assert {"out.bin", "in.txt"} <= set("".join(listed["logs"]["stdout"]).split())


def test_doctor_says_python_runs_in_the_gateways_sandbox(
    tmp_path: Path, kernel_gateway: KernelGatewayServer
) -> None:
    out = run_cli(
        ["doctor", "--json", "--data-dir", str(tmp_path / "data"), "--kernel-gateway", kernel_gateway.url],
        tmp_path,
        timeout=120,
        KERNMIND_KERNEL_GATEWAY_TOKEN=kernel_gateway.token,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["kernel_gateway"]["sandbox"].startswith("the gateway's")
    assert report["languages"]["python"]["runtime"] == "kernel gateway"
    assert report["live_test"]["ok"] is True and report["live_test"]["value"] == "2"
    text = run_cli(
        ["doctor", "--data-dir", str(tmp_path / "data"), "--kernel-gateway", kernel_gateway.url],
        tmp_path,
        timeout=120,
        KERNMIND_KERNEL_GATEWAY_TOKEN=kernel_gateway.token,
    ).stdout
    assert "python runs in the gateway's" in text and "live test" in text


async def test_malformed_kernel_messages_through_the_gateway_end_in_a_clear_result(
    tmp_path: Path, kernel_gateway: KernelGatewayServer
) -> None:
    """What the gateway relays is read like a local kernel's messages (fields of the wrong type
    are skipped). Most malformed messages stop the gateway's own relay of that kernel's output
    (jupyter_server cannot decode them): the call then ends at its time limit with a clear
    result, the interpreter is replaced, and the server goes on."""
    from .test_kernel_messages import FORGE

    relayed = [line for line in FORGE.splitlines() if not line.startswith(("raw(", "k.iopub"))]
    relayed += ['raw({"msg_id": "m2", "msg_type": "display_data"}, {"data": "not a bundle"})']
    relayed += [
        'raw({"msg_id": "m3", "msg_type": "execute_result"}, {"data": {"text/plain": 5}, "execution_count": "x"})'
    ]
    settings = gateway_settings(tmp_path, kernel_gateway, None, pool_size=0, sandbox="none")
    async with Client(create_server(settings)) as client:
        out = await run(client, "\n".join(relayed), session_id="forger")
        assert out["status"] == "ok", out
        assert "".join(out["logs"]["stdout"]).startswith("before\n") and "after" in "".join(
            out["logs"]["stdout"]
        )
        assert (await run(client, "marker + 1", session_id="forger"))["results"][0]["text"] == "42"

        cut = await run(client, FORGE, session_id="forger", timeout=5)
        assert cut["status"] == "timeout" and "time limit of 5s reached" in " ".join(cut["notes"]), cut
        assert (await run(client, "6 * 7", session_id="forger"))["results"][0]["text"] == "42"
