"""Launch of the real ``kernmind`` console script against the SDK-import floor, interleaved.

    python benchmarks/bench_launch.py [--launches 20] [--sandbox auto] [--compare SRC]

Each round launches, one after the other: the floor (``python -c "import mcp.server.mcpserver"``,
what every MCP server in Python pays), the installed console script (``kernmind serve``, as a
desktop client starts it) and, with ``--compare``, the same entry point from another source
tree (e.g. ``git worktree add /tmp/before HEAD~1``, then ``--compare /tmp/before/src``): the
arms see the same load. The client is raw JSON-RPC over pipes (no SDK client in the way):
``initialize``, ``notifications/initialized`` and ``tools/list`` are written at once, then one
``run_code`` ``1+1`` once the list is answered. Where ``build/server-memory`` holds the official
memory server (see bench_memory_servers.py), it is an arm too, for the handshake alone: what
a Node server a user might pick instead takes to start. Figures are medians; ratios are against the
floor's median in the same run. Every launch of an arm shares one data directory (as a user's
does; a first launch, not counted, makes it); both trees get their bytecode written first. Also printed: the server's CPU time (user +
system of the server process alone) by the time ``tools/list`` was answered.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HANDSHAKE = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
]
FIRST_CALL = {
    "jsonrpc": "2.0",
    "id": 3,
    "method": "tools/call",
    "params": {"name": "run_code", "arguments": {"code": "1+1", "session_id": "bench"}},
}


ROOT = Path(__file__).resolve().parents[1]
GRAPH = (
    ROOT / "build" / "server-memory" / "node_modules" / ".bin" / "mcp-server-memory"
)  # as bench_memory_servers


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KERNMIND_")}


def console_script() -> list[str]:
    script = Path(sys.executable).parent / "kernmind"
    if not script.exists():
        found = shutil.which("kernmind")
        if found is None:
            sys.exit("no kernmind console script beside this Python or on PATH: pip install -e . first")
        script = Path(found)
    return [str(script)]


def from_tree(src: str) -> list[str]:
    """What the console script does (``kernmind.cli:main``), with ``src`` first on the path."""
    code = f"import sys; sys.path.insert(0, {src!r}); from kernmind.cli import main; sys.exit(main())"
    return [sys.executable, "-c", code]


def compile_bytecode(compare: str | None) -> None:
    """Write every arm's bytecode first, as ``pip install`` does for a user. Without it a tree
    that was never imported (a fresh ``git worktree``), run where ``PYTHONDONTWRITEBYTECODE`` is
    set (this workplace sets it), compiles every module at every launch: ≈ 0.2 s a launch that
    no user pays, which inflated a 'before' arm once (benchmarks/README.md)."""
    import kernmind

    trees = [Path(kernmind.__file__).parent]
    if compare:
        trees.append(Path(compare) / "kernmind")
    for tree in trees:
        compileall.compile_dir(str(tree), quiet=1)


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def launch(argv: list[str], data: str, sandbox: str) -> dict[str, float]:
    """One launch: seconds to ``initialize`` and ``tools/list`` answered, the first call, CPU.
    The official memory server (``argv`` is ``[GRAPH]``) gets the handshake only: it runs no code."""
    graph = argv == [str(GRAPH)]
    args = argv if graph else [*argv, "serve", "--data-dir", data, "--sandbox", sandbox]
    env = {**clean_env(), "MEMORY_FILE_PATH": f"{data}.jsonl"} if graph else clean_env()
    start = time.perf_counter()
    proc = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    got: dict[str, float] = {}
    try:
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in HANDSHAKE))
        proc.stdin.flush()
        while "call" not in got and not (graph and "tools/list" in got):
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the server ended before answering: {args}")
            answer = json.loads(line)
            now = time.perf_counter()
            if answer.get("id") == 1:
                got["initialize"] = now - start
            elif answer.get("id") == 2:
                got["tools/list"] = now - start
                got["cpu"] = server_cpu(proc.pid)
                if graph:
                    continue
                sent = time.perf_counter()
                proc.stdin.write(json.dumps(FIRST_CALL).encode() + b"\n")
                proc.stdin.flush()
            elif answer.get("id") == 3:
                if answer.get("result", {}).get("isError"):
                    raise RuntimeError(f"run_code failed: {answer}")
                got["call"] = now - sent
                got["to call"] = now - start
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return got


def floor() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mcp.server.mcpserver"], check=True, env=clean_env())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--sandbox", default="auto")
    parser.add_argument("--compare", help="another tree's src/ to launch as a second arm")
    opts = parser.parse_args()

    arms = {"kernmind (console script)": console_script()}
    if opts.compare:
        arms[f"kernmind from {opts.compare}"] = from_tree(opts.compare)
    if GRAPH.exists():
        arms["server-memory (npm), the official memory server"] = [str(GRAPH)]
    compile_bytecode(opts.compare)
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.1f} at start, sandbox {opts.sandbox}")
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        data = {name: str(Path(tmp) / f"data{i}") for i, name in enumerate(arms)}
        for name, argv in arms.items():  # not counted: makes the data directory and its database
            launch(argv, data[name], opts.sandbox)
        floors: list[float] = []
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
        for _ in range(opts.launches):
            floors.append(floor())
            for name, argv in arms.items():
                runs[name].append(launch(argv, data[name], opts.sandbox))
    base = statistics.median(floors)
    print(f"\nmedians of {opts.launches} launches, interleaved")
    print(f"{'':44} {'seconds':>8} {'vs floor':>9}")
    print(f"{'python -c import mcp.server.mcpserver (floor)':44} {base:8.3f} {1:8.2f}x")
    for name, rows in runs.items():
        print(name)
        for key, label in (
            ("initialize", "launch -> initialize answered"),
            ("tools/list", "launch -> tools/list answered"),
            ("cpu", "server CPU by then"),
            ("call", "first run_code 1+1 after tools/list"),
            ("to call", "launch -> that answer"),
        ):
            if key not in rows[0]:
                continue
            value = statistics.median(r[key] for r in rows)
            print(f"  {label:42} {value:8.3f} {value / base:8.2f}x")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
