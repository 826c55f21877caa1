"""Python on a kernel gateway vs local kernels, and sessions created per second with 1 and 2 replicas.

    python benchmarks/bench_gateway.py [--n 200] [--sessions 12] [--concurrency 4]

Starts a real ``jupyter-kernel-gateway`` (127.0.0.1, with a token) and a real PostgreSQL,
as the tests do. Rows, one run, snippet ``1+1`` (p50 / p99 ms):

- raw gateway WebSocket round trip: ``execute_request`` → idle + reply over the gateway's
  channels WebSocket (kernmind's ``gateway_client``, no MCP, no session logic): the floor
  of anything that goes through the gateway;
- raw local round trip: ``jupyter_client`` on a local kernel (the floor of local kernels);
- kernmind stateful through the gateway (in-process MCP client, sessions in PostgreSQL);
- kernmind stateful on local kernels (same client, ``--sandbox none`` like the gateway's kernels).

Then sessions created per second: ``--sessions`` new session ids, ``--concurrency`` at a
time, each one ``run_code`` ``1`` through real ``kernmind serve --transport http`` replicas
(round-robin) on the gateway and one database, with 1 and with 2 replicas.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

sys.path[:0] = [str(Path(__file__).parent.parent), str(Path(__file__).parent)]  # tests/, benchmarks/
from tests.execution.gateway_server import KernelGatewayServer  # noqa: E402
from tests.memory.postgres_server import PostgresServer  # noqa: E402
from tests.transport.procs import HttpServer, start_http  # noqa: E402

from bench_python import raw_kernel  # noqa: E402
from kernmind.config import Settings  # noqa: E402
from kernmind.execution.kernels.gateway.client import GatewayConfig, KernelGateway  # noqa: E402
from kernmind.server import create_server  # noqa: E402

SNIPPET = "1+1"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def raw_gateway(gateway: KernelGatewayServer, n: int) -> list[float]:
    client = KernelGateway(GatewayConfig(gateway.url, gateway.token))
    kernel_id = await client.start_kernel("python3", {})
    channels = await client.connect(kernel_id)

    async def once() -> None:
        msg_id = channels.execute(SNIPPET)
        idle = replied = False
        while not (idle and replied):
            msg = await channels.receive(30)
            assert msg is not None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            replied = replied or msg["msg_type"] == "execute_reply"
            idle = idle or (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle")

    try:
        return await timed(once, n)
    finally:
        channels.close()
        await client.delete(kernel_id)


async def raw_local(n: int) -> list[float]:
    async with raw_kernel() as (_, kc):

        async def once() -> None:
            await kc.execute_interactive(SNIPPET, output_hook=lambda _: None, timeout=30)

        return await timed(once, n)


async def through_kernmind(settings: Settings, n: int) -> list[float]:
    async with Client(create_server(settings)) as client:

        async def once() -> None:
            result = await client.call_tool("run_code", {"code": SNIPPET, "session_id": "bench"})
            assert result.structured_content and result.structured_content["status"] == "ok", result

        return await timed(once, n)


async def timed(once: Any, n: int, warmup: int = 10) -> list[float]:
    for _ in range(warmup):
        await once()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        await once()
        times.append((time.perf_counter() - t) * 1000)
    return times


async def sessions_per_second(replicas: list[HttpServer], sessions: int, concurrency: int) -> float:
    clients = [r.client() for r in replicas]
    names = iter(range(sessions))
    servers = itertools.cycle(range(len(replicas)))
    limiter = anyio.Semaphore(concurrency)

    async def create(client: Client, i: int) -> None:
        async with limiter:
            result = await client.call_tool("run_code", {"code": "1", "session_id": f"s{i}"})
            assert result.structured_content and result.structured_content["status"] == "ok", result

    async with contextlib.AsyncExitStack() as stack:  # clients close in reverse order (nested scopes)
        opened = [await stack.enter_async_context(c) for c in clients]
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in names:
                tg.start_soon(create, opened[next(servers)], i)
        return sessions / (time.perf_counter() - started)


def start_replicas(root: Path, count: int, gateway: KernelGatewayServer, db: str) -> list[HttpServer]:
    shared = root / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    servers = []
    for i in range(count):
        home = root / f"r{i}"
        home.mkdir()
        servers.append(
            start_http(
                home,
                *("--db", db, "--kernel-gateway", gateway.url, "--kernel-gateway-workspaces", str(shared)),
                *("--sandbox", "none", "--embedding-model", "none", "--max-sessions", "256"),
                env={"KERNMIND_KERNEL_GATEWAY_TOKEN": gateway.token},
            )
        )
    return servers


def row(name: str, times: list[float], base: list[float]) -> None:
    print(
        f"| {name} | {pct(times, 0.5):.2f} | {pct(times, 0.99):.2f} | {pct(times, 0.5) / pct(base, 0.5):.2f}× |"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    gateway = KernelGatewayServer().start()
    postgres = PostgresServer().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            common: dict[str, Any] = {"pool_size": 1, "sandbox": "none", "embedding_model": "none"}
            remote = Settings(
                data_dir=root / "gw",
                db=postgres.new_database(),
                kernel_gateway=gateway.url,
                kernel_gateway_token=gateway.token,
                **common,
            )
            local = Settings(data_dir=root / "local", **common)
            raw_gw = await raw_gateway(gateway, args.n)
            raw_lo = await raw_local(args.n)
            km_gw = await through_kernmind(remote, args.n)
            km_lo = await through_kernmind(local, args.n)
            print(f"stateful `{SNIPPET}`, n = {args.n} (p50 / p99 ms; ratio vs the raw gateway round trip)\n")
            print("| path | p50 | p99 | vs raw gateway |\n|---|---|---|---|")
            row("raw gateway WebSocket round trip (the floor through the gateway)", raw_gw, raw_gw)
            row("raw local `jupyter_client` round trip", raw_lo, raw_gw)
            row("**kernmind, kernel gateway** (in-process MCP client, sessions in PostgreSQL)", km_gw, raw_gw)
            row("kernmind, local kernels (same client, `--sandbox none`)", km_lo, raw_gw)
            print(
                f"\nkernmind over its floor: gateway {pct(km_gw, 0.5) / pct(raw_gw, 0.5):.2f}×, "
                f"local {pct(km_lo, 0.5) / pct(raw_lo, 0.5):.2f}×"
            )
            rates = {}
            for count in (1, 2):
                servers = start_replicas(root / f"rep{count}", count, gateway, postgres.new_database())
                try:
                    rates[count] = await sessions_per_second(servers, args.sessions, args.concurrency)
                finally:
                    for server in servers:
                        server.stop()
            print(f"\nsessions created per second ({args.sessions} sessions, {args.concurrency} at a time)\n")
            print("| replicas | sessions/s | vs 1 replica |\n|---|---|---|")
            for count, rate in rates.items():
                print(f"| {count} | {rate:.2f} | {rate / rates[1]:.2f}× |")
    finally:
        gateway.close()
        postgres.stop()


if __name__ == "__main__":
    anyio.run(main)
