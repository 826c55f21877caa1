"""What a client pays to check a result against the tool's output schema, as published vs as the SDK
generates it, in one run.

    python benchmarks/bench_result_check.py [--rounds 300]

The MCP SDK's client checks every ``structuredContent`` against the tool's ``outputSchema`` with
jsonschema (``ClientSession.validate_tool_result``), and so do other clients. kernmind publishes
each optional field as a type list (``{"type": ["number", "null"]}``, tool_arguments.py) where the
SDK writes ``{"anyOf": [{"type": "number"}, {"type": "null"}]}``: the same instances are valid, but
jsonschema tries the alternatives one by one and builds an error for each that fails. Real results
come from a real server in process (``--sandbox none``, the default encoder): a ``run_code`` result
with a plot and a value, and an ``archival_memory_search`` over 60 facts. Each check is timed the
way the SDK makes it (``best_match(validator.iter_errors(result))``), the two schemas alternating.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from jsonschema import exceptions, validators
from mcp import Client

sys.path.insert(0, str(Path(__file__).parent))
from bench_memory_servers import facts
from kernmind.config import Settings
from kernmind.sdk_compat import registered_tool
from kernmind.server import create_server

CODE = (
    "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\n{'a': 1}"
)


def check_ms(schema: dict[str, Any], instance: Any, rounds: int) -> list[float]:
    validator = validators.validator_for(schema)(schema)
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        assert exceptions.best_match(validator.iter_errors(instance)) is None
        out.append((time.perf_counter() - t) * 1000)
    return out


async def results() -> dict[str, tuple[dict[str, Any], dict[str, Any], Any]]:
    """Per tool: (the schema as published, as the SDK generates it, a real result)."""
    with tempfile.TemporaryDirectory() as data:
        server = create_server(Settings(data_dir=Path(data), sandbox="none", pool_size=0, preload=[]))
        async with Client(server) as client:
            listed = {t.name: t.output_schema for t in (await client.list_tools()).tools}
            for fact, _ in facts(60):
                await client.call_tool("archival_memory_insert", {"content": fact})
            got = {
                "run_code": await client.call_tool("run_code", {"code": CODE}),
                "archival_memory_search": await client.call_tool(
                    "archival_memory_search", {"query": "Where does Ana live?"}
                ),
            }
            out = {}
            for name, result in got.items():
                tool = registered_tool(server, name)
                assert tool is not None and tool.output_schema is not None and not result.is_error
                out[name] = (listed[name], tool.output_schema, result.structured_content)
            return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args(argv)
    print("| result | as published p50 ms | as the SDK generates it p50 ms | ratio |\n|---|---|---|---|")
    for name, (published, generated, instance) in anyio.run(results).items():
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(10):  # alternating slices: load changes hit both alike
            ours += check_ms(published, instance, args.rounds // 10)
            theirs += check_ms(generated, instance, args.rounds // 10)
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.2f}× |")


if __name__ == "__main__":
    main()
