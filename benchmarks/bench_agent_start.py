"""How fast ``kernmind agent`` fails and starts, and ``kernmind memory search`` answers, as a
user runs them (subprocesses, the scripted model server of the agent tests on 127.0.0.1).

    python benchmarks/bench_agent_start.py [--before SRC] [--runs 3] [--cap 20]

Rows, each the median of ``--runs`` runs:
- ``floor``: ``kernmind agent --help`` (interpreter, package and parser: what any run pays);
- ``no API key``: ``kernmind agent -p hi`` without a key or ``--base-url``, until it exits;
- ``closed port``: ``--base-url`` at a port nothing listens on, until it exits;
- ``silent endpoint``: ``--base-url`` at a port whose listen queue is full (connections neither
  accepted nor refused, like a firewalled host), until it exits (killed at ``--cap`` seconds);
- ``launch → first model request`` and ``connected → first model request`` (from the agent's
  "connected to kernmind" log line, ``--log-level DEBUG``), and ``launch → exit`` for a one-shot
  answer with the default server (``--pool-size 0``);
- ``memory search``: ``kernmind memory search`` on an empty namespace, default model (after one
  run that may fill the model cache) and ``--embedding-model none`` (its floor).

With ``--before SRC`` (another checkout's ``src``, e.g. from ``git archive <commit> src``) every
row is measured for that code too (``PYTHONPATH=SRC``), interleaved run by run with this
checkout's, and the ratio after/before is printed: both sides see the same machine load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.agent.scripted_openai import ScriptedOpenAI, reply  # noqa: E402

CLEAN = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNMIND_AGENT_API_KEY", "KERNMIND_AGENT_BASE_URL")
CONNECTED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) DEBUG kernmind\.agent\.connections: connected to"
)


def env_for(src: str | None, key: str | None = "k") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN and not k.startswith("KERNMIND_")}
    if src:
        env["PYTHONPATH"] = src
    if key:
        env["OPENAI_API_KEY"] = key
    return env


def timed(
    cmd: list[str], env: dict[str, str], cap: float
) -> tuple[float, subprocess.CompletedProcess[str] | None]:
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=cap)
    except subprocess.TimeoutExpired:
        return cap, None
    return time.monotonic() - started, proc


def kernmind(*args: str) -> list[str]:
    return [sys.executable, "-m", "kernmind", *args]


@contextmanager
def silent_port() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):
        client = socket.socket()
        client.setblocking(False)
        try:
            client.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(client)
    try:
        yield port
    finally:
        for s in [*fillers, server]:
            s.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_shot(src: str | None, cap: float) -> dict[str, float]:
    """Launch → first chat request, connected → first chat request, launch → exit."""
    llm = ScriptedOpenAI()
    posts: list[float] = []
    handler = llm._httpd.RequestHandlerClass
    original = handler.do_POST

    def do_post(self: object) -> None:
        posts.append(time.time())
        original(self)  # type: ignore[arg-type]

    handler.do_POST = do_post  # type: ignore[method-assign]
    llm.start()
    llm.add(reply("hello"))
    data = tempfile.mkdtemp(prefix="bench-agent-")
    cmd = kernmind("agent", "--model", "scripted", "--base-url", llm.url, "-p", "hi", "--data-dir", data)
    cmd += ["--pool-size", "0", "--log-level", "DEBUG"]
    try:
        started = time.time()
        took, proc = timed(cmd, env_for(src), cap)
    finally:
        llm.stop()
    out = {"launch → exit": took}
    if proc is None or proc.returncode != 0 or not posts:
        return out
    out["launch → first model request"] = posts[0] - started
    for line in proc.stderr.splitlines():
        if m := CONNECTED.match(line):
            connected = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out["connected → first model request"] = posts[0] - connected
            break
    return out


def scenarios(cap: float) -> dict[str, Callable[[str | None], dict[str, float]]]:
    empty = tempfile.mkdtemp(prefix="bench-memory-")

    def floor(src: str | None) -> dict[str, float]:
        return {"floor (kernmind agent --help)": timed(kernmind("agent", "--help"), env_for(src), cap)[0]}

    def no_key(src: str | None) -> dict[str, float]:
        data = tempfile.mkdtemp(prefix="bench-agent-")
        return {
            "no API key → exit": timed(
                kernmind("agent", "-p", "hi", "--data-dir", data), env_for(src, None), cap
            )[0]
        }

    def closed(src: str | None) -> dict[str, float]:
        data = tempfile.mkdtemp(prefix="bench-agent-")
        url = f"http://127.0.0.1:{closed_port()}/v1"
        cmd = kernmind("agent", "-p", "hi", "--base-url", url, "--data-dir", data)
        return {"closed port → exit": timed(cmd, env_for(src), cap)[0]}

    def silent(src: str | None) -> dict[str, float]:
        data = tempfile.mkdtemp(prefix="bench-agent-")
        with silent_port() as port:
            cmd = kernmind(
                "agent", "-p", "hi", "--base-url", f"http://127.0.0.1:{port}/v1", "--data-dir", data
            )
            return {"silent endpoint → exit": timed(cmd, env_for(src), cap)[0]}

    def search(src: str | None) -> dict[str, float]:
        base = kernmind(
            "memory", "search", "what did we decide about the staging database", "--data-dir", empty
        )
        timed(base, env_for(src), cap)  # fills the model cache where there is one
        return {
            "memory search (default model)": timed(base, env_for(src), cap)[0],
            "memory search (--embedding-model none)": timed(
                [*base, "--embedding-model", "none"], env_for(src), cap
            )[0],
        }

    return {
        "floor": floor,
        "no key": no_key,
        "closed": closed,
        "silent": silent,
        "one shot": lambda src: one_shot(src, cap),
        "search": search,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="another checkout's src directory, measured the same way")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cap", type=float, default=20.0, help="seconds after which a run is killed")
    args = parser.parse_args()
    sides: dict[str, str | None] = {"after": None}
    if args.before:
        sides = {"before": str(Path(args.before).resolve()), "after": None}
    results: dict[tuple[str, str], list[float]] = {}
    load = os.getloadavg()[0]
    for name, run in scenarios(args.cap).items():
        for i in range(args.runs):
            for side, src in sides.items():
                for row, value in run(src).items():
                    results.setdefault((row, side), []).append(value)
            print(f"  {name}: run {i + 1}/{args.runs} done", file=sys.stderr)
    rows = list(dict.fromkeys(row for row, _ in results))
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, load average {load:.1f} → {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores, median of {args.runs}")  # fmt: skip
    head = " | ".join(sides)
    print(f"\n| row | {head} |" + (" after / before |" if len(sides) > 1 else ""))
    print("|---|" + "---|" * (len(sides) + (len(sides) > 1)))
    for row in rows:
        cells, medians = [], []
        for side in sides:
            values = results.get((row, side), [])
            med = statistics.median(values) if values else None
            medians.append(med)
            capped = med is not None and med >= args.cap
            cells.append("—" if med is None else (f"> {args.cap:g} s (killed)" if capped else f"{med:.2f} s"))
        ratio = ""
        if len(sides) > 1:
            b, a = medians
            ratio = f" {a / b:.2f} |" if a is not None and b else " — |"
        print(f"| {row} | " + " | ".join(cells) + " |" + ratio)


if __name__ == "__main__":
    main()
