"""Launch time and per-call cost of each transport, against baselines measured in the same run.

    python benchmarks/bench_transport.py [--launches 5] [--n 200] [--sandbox auto]

(``--n 0``: the launch figures only.)

Launch (stdio, raw JSON-RPC over pipes, a fresh data directory each time, default pool):
launch → ``initialize`` answered, → ``tools/list`` answered, the first ``run_code`` ``1+1``
call right after, and launch → that answer. Baseline: ``python -c "import mcp.server.mcpserver"``
(the SDK import every launch pays) and ``python -c pass``.

Per call (one server per transport, started with the same settings, both warm): ``run_code``
``1+1`` in a named session and the no-op ``list_sessions``, through the SDK's client over
stdio and over Streamable HTTP (both protocol eras), and through a raw keep-alive HTTP
client (``httpx2``, sessionless POSTs). Calls are interleaved (stdio, HTTP, stdio, …) so
background load on the machine hits every transport alike. Ratios are HTTP / stdio p50.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

MODERN = "2026-07-28"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def serve_argv(data: str, sandbox: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kernmind", "serve", "--data-dir", data, "--sandbox", sandbox, *extra]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KERNMIND_")}


# --- launch -------------------------------------------------------------------------------------
def one_launch(sandbox: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as data:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            serve_argv(data, sandbox),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=clean_env(),
        )
        assert proc.stdin is not None and proc.stdout is not None
        buffer = b""

        def send(message: dict[str, Any]) -> None:
            proc.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]

        def answer(rid: int) -> dict[str, Any]:
            nonlocal buffer
            while True:
                while b"\n" not in buffer:
                    chunk = os.read(proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
                    if not chunk:
                        raise RuntimeError("the server exited during launch")
                    buffer += chunk
                line, _, buffer = buffer.partition(b"\n")
                message = json.loads(line)
                if message.get("id") == rid:
                    return message

        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        }
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        answer(1)
        t_init = time.perf_counter() - t0
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        answer(2)
        t_list = time.perf_counter() - t0
        cpu_list = process_cpu(proc.pid)
        send(
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "run_code", "arguments": {"code": "1+1"}},
            }
        )
        result = answer(3)["result"]
        t_run = time.perf_counter() - t0
        if result.get("isError") or result["structuredContent"]["results"][0]["text"] != "2":
            raise RuntimeError(f"first run_code failed: {result}")
        proc.stdin.close()
        proc.wait(60)
        return {
            "init": t_init,
            "list": t_list,
            "cpu_list": cpu_list,
            "first_run": t_run - t_list,
            "launch_to_run": t_run,
        }


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads, not children) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def import_floor(statement: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True, env=clean_env())
        out.append(time.perf_counter() - t0)
    return out


# --- per call -----------------------------------------------------------------------------------
def start_http(data: str, sandbox: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    log = Path(data) / "http.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            serve_argv(data, sandbox, "--transport", "http", "--port", "0", "--pool-size", "1"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=clean_env(),
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        match = re.search(r"serving MCP on (http://\S+)", log.read_text(errors="replace"))
        if match:
            return proc, match.group(1), log
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(log.read_text(errors="replace"))


Call = Callable[[], Awaitable[None]]


def sdk_calls(client: Client, session: str) -> dict[str, Call]:
    async def run_code() -> None:
        r = await client.call_tool("run_code", {"code": "1+1", "session_id": session})
        assert not r.is_error, r

    async def list_sessions() -> None:
        r = await client.call_tool("list_sessions", {})
        assert not r.is_error, r

    return {"run_code": run_code, "list_sessions": list_sessions}


def raw_calls(http: httpx2.AsyncClient, url: str) -> dict[str, Call]:
    def make(name: str, arguments: dict[str, Any]) -> Call:
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": name, "arguments": arguments, "_meta": MODERN_META},
            }
        )
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": name,
        }

        async def call() -> None:
            r = await http.post(url, content=body, headers=headers)
            assert r.status_code == 200 and '"isError":true' not in r.text, r.text

        return call

    return {
        "run_code": make("run_code", {"code": "1+1", "session_id": "raw"}),
        "list_sessions": make("list_sessions", {}),
    }


async def per_call(sandbox: str, n: int) -> dict[str, dict[str, list[float]]]:
    with tempfile.TemporaryDirectory() as stdio_data, tempfile.TemporaryDirectory() as http_data:
        http_proc, url, _ = start_http(http_data, sandbox)
        try:
            params = StdioServerParameters(
                command=sys.executable,
                args=serve_argv(stdio_data, sandbox, "--pool-size", "1")[1:],
                env=clean_env(),
            )
            async with (
                Client(params) as stdio,
                Client(streamable_http_client(url), mode="legacy") as legacy,
                Client(streamable_http_client(url), mode="auto") as modern,
                httpx2.AsyncClient(timeout=60) as raw,
            ):
                clients = {
                    "stdio (SDK client)": sdk_calls(stdio, "bench"),
                    "HTTP 2025-11-25 (SDK client)": sdk_calls(legacy, "bench-legacy"),
                    "HTTP 2026-07-28 (SDK client)": sdk_calls(modern, "bench-modern"),
                    "HTTP 2026-07-28 (raw httpx2, keep-alive)": raw_calls(raw, url),
                }
                times: dict[str, dict[str, list[float]]] = {
                    c: {"run_code": [], "list_sessions": []} for c in clients
                }
                for calls in clients.values():  # warm: sessions exist, kernels answered
                    for _ in range(10):
                        await calls["run_code"]()
                        await calls["list_sessions"]()
                for _ in range(n):
                    for tool in ("run_code", "list_sessions"):
                        for name, calls in clients.items():
                            t0 = time.perf_counter()
                            await calls[tool]()
                            times[name][tool].append(time.perf_counter() - t0)
                return times
        finally:
            http_proc.terminate()
            http_proc.wait(60)


# --- report -------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--sandbox", default="auto", choices=["auto", "bwrap", "none"])
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.1f} at start, sandbox {args.sandbox}\n")

    floor_mcp = statistics.median(import_floor("import mcp.server.mcpserver", args.launches))
    floor_py = statistics.median(import_floor("pass", args.launches))
    launches = [one_launch(args.sandbox) for _ in range(args.launches)]
    med = {k: statistics.median(x[k] for x in launches) for k in launches[0]}
    print(f"launch (stdio, median of {args.launches})                      seconds   vs import floor")
    print(f"  python -c pass                                             {floor_py:7.3f}")
    print(f"  python -c 'import mcp.server.mcpserver' (the floor)        {floor_mcp:7.3f}     1.00x")
    for key, label in [
        ("init", "launch -> initialize answered"),
        ("list", "launch -> tools/list answered"),
        ("cpu_list", "  server CPU used by then (user + system)"),
        ("first_run", "first run_code 1+1 call (after tools/list)"),
        ("launch_to_run", "launch -> first run_code answered"),
    ]:
        print(f"  {label:57s}{med[key]:7.3f}     {med[key] / floor_mcp:4.2f}x")

    if args.n <= 0:  # launch figures only
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
        return
    times = anyio.run(per_call, args.sandbox, args.n)
    base = times["stdio (SDK client)"]
    print(
        f"\nper call, p50 / p99 ms (n={args.n}, interleaved)      run_code 1+1           list_sessions (no-op)"
    )
    for name, t in times.items():
        cells = []
        for tool in ("run_code", "list_sessions"):
            p50, p99 = pct(t[tool], 0.5) * 1000, pct(t[tool], 0.99) * 1000
            ratio = p50 / (pct(base[tool], 0.5) * 1000)
            cells.append(f"{p50:6.2f} / {p99:6.2f} ({ratio:4.2f}x)")
        print(f"  {name:44s}{cells[0]}   {cells[1]}")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
