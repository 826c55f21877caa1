"""Sessions that last: checkpoint and restore cost, and a stored session's first call after a
restart against a new session's first call, over a real stdio MCP client.

    python benchmarks/bench_sessions.py [--rounds 3] [--mb 100] [--files 10000] [--sandbox bwrap]

Each round, on one data dir:

1. A server; session ``big`` gets a ``--mb`` MB DataFrame and a fitted scikit-learn model,
   session ``small`` gets ``x = 1``, session ``many`` gets ``--files`` small files (in 100
   folders, made by Python there). The client closes (stdin EOF): the server saves each
   session's variables and exits. Stop time is measured with and without the big session
   (a second data dir holding only ``small``): the difference is the checkpoint.
2. A new server on the same data dir (the warm pool full): the first call of each stored
   session (``big``: restore of the DataFrame and model, then ``df.shape``; ``many``: its
   directory moved under a warm kernel and handed to its uid) and of a brand-new session,
   all ``1+1``-sized calls.

Also, in this process, the serializers on the same namespace: dill (what kernmind uses),
cloudpickle and pickle, dump and load of the DataFrame and the model.

Timing is wall clock on whatever else the machine does: read the ratios.
"""

from __future__ import annotations

import argparse
import io
import pickle
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

BIG = """\
import numpy as np, pandas as pd
from sklearn.ensemble import RandomForestClassifier
rng = np.random.default_rng(0)
df = pd.DataFrame(rng.normal(size=({rows}, 10)), columns=[f"c{{i}}" for i in range(10)])
model = RandomForestClassifier(n_estimators=50, random_state=0).fit(df.iloc[:5000, :9], df.c9.iloc[:5000] > 0)
int(df.memory_usage().sum() / 1e6)
"""
MANY = """\
import os
for d in range({dirs}):
    os.makedirs(f"d{{d}}", exist_ok=True)
    for i in range({per_dir}):
        open(f"d{{d}}/f{{i}}.txt", "w").write("x")
"""


def params(data_dir: str, sandbox: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "kernmind",
            "serve",
            "--data-dir",
            data_dir,
            "--sandbox",
            sandbox,
            "--log-level",
            "WARNING",
        ],
    )


async def call(client: Client, code: str, session_id: str) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    result = await client.call_tool("run_code", {"code": code, "session_id": session_id, "timeout": 600})
    elapsed = time.perf_counter() - t
    out = result.structured_content
    assert out is not None and out["status"] == "ok", result
    return elapsed, out


async def warm(client: Client) -> None:
    for _ in range(600):
        listed = (await client.call_tool("list_sessions", {})).structured_content or {}
        if listed.get("warm_kernels", 0) >= 2:
            return
        await anyio.sleep(0.1)


async def stop_time(data_dir: str, sandbox: str, sessions: dict[str, str]) -> float:
    """Fill ``sessions`` (id -> code), then how long the clean stop takes (checkpoints included)."""
    client = Client(params(data_dir, sandbox))
    await client.__aenter__()
    for sid, code in sessions.items():
        await call(client, code, sid)
    t = time.perf_counter()
    await client.__aexit__(None, None, None)
    return time.perf_counter() - t


async def first_calls(data_dir: str, sandbox: str, round_no: int) -> dict[str, float]:
    async with Client(params(data_dir, sandbox)) as client:
        await warm(client)
        times = {}
        times["new session"], _ = await call(client, "1+1", f"fresh{round_no}")
        await warm(client)
        times["stored: small (x = 1)"], _ = await call(client, "x", "small")
        await warm(client)
        times["stored: big DataFrame + model"], out = await call(client, "df.shape", "big")
        assert out["results"][0]["text"].startswith("("), out
        await warm(client)
        times["stored: many files"], _ = await call(client, "len(os.listdir())", "many")
    return times


def serializers(rows: int) -> list[tuple[str, float, float, int]]:
    import cloudpickle
    import dill
    import numpy as np
    import pandas as pd
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(rows, 10)))
    model = RandomForestClassifier(n_estimators=50, random_state=0).fit(
        df.iloc[:5000, :9], df[9].iloc[:5000] > 0
    )
    out = []
    for name, mod in (("dill", dill), ("cloudpickle", cloudpickle), ("pickle", pickle)):
        buf = io.BytesIO()
        t = time.perf_counter()
        mod.dump(df, buf, protocol=5)
        mod.dump(model, buf, protocol=5)
        dump = time.perf_counter() - t
        buf.seek(0)
        t = time.perf_counter()
        mod.load(buf)
        mod.load(buf)
        out.append((name, dump, time.perf_counter() - t, buf.tell()))
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--sandbox", default="auto")
    args = ap.parse_args()
    rows = args.mb * 1_000_000 // 80  # ten float64 columns
    dirs = 100
    big = BIG.format(rows=rows)
    many = MANY.format(dirs=dirs, per_dir=max(1, args.files // dirs))
    stops: dict[str, list[float]] = {"with big session": [], "without": []}
    firsts: dict[str, list[float]] = {}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            stops["with big session"].append(
                await stop_time(a, args.sandbox, {"big": big, "small": "x = 1", "many": many})
            )
            stops["without"].append(await stop_time(b, args.sandbox, {"small": "x = 1"}))
            for name, value in (await first_calls(a, args.sandbox, r)).items():
                firsts.setdefault(name, []).append(value)
            snap = Path(a) / "sessions" / "local" / "big" / "files" / ".km-state" / "namespace.pkl"
            snap_mb = snap.stat().st_size / 1e6
    print(
        f"\n{args.rounds} rounds, {args.mb} MB DataFrame (+ a 50-tree random forest), {args.files} files; medians"
    )
    print(f"snapshot of the big session: {snap_mb:.0f} MB")
    with_big, without = median(stops["with big session"]), median(stops["without"])
    print(f"clean stop (stdin EOF -> exit): {with_big:.2f} s with the big session, {without:.2f} s without")
    print(f"  -> checkpoint of the big session ≈ {with_big - without:.2f} s")
    base = median(firsts["new session"])
    print("first call after a restart               median s   vs new session")
    for name, values in firsts.items():
        print(f"  {name:38} {median(values):8.3f}   {median(values) / base:5.2f}x")
    print("\nserializers on the DataFrame + model (in this process)")
    print("  name          dump s   load s   MB")
    for name, dump, load, size in serializers(rows):
        print(f"  {name:12} {dump:7.3f}  {load:7.3f}  {size / 1e6:6.0f}")


if __name__ == "__main__":
    anyio.run(main)
