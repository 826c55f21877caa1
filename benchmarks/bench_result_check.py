"""What a client pays to check a result against the tool's output schema, as published (optional
fields as ``anyOf [T, null]``, the SDK's form) vs with type lists (``{"type": [T, "null"]}``), in
one run.

    python benchmarks/bench_result_check.py [--rounds 300]

The MCP SDK's client checks every ``structuredContent`` against the tool's ``outputSchema`` with
jsonschema (``ClientSession.validate_tool_result``), and so do other clients; jsonschema tries
``anyOf`` alternatives one by one and builds an error for each that fails. Type lists accept the
same instances with one branch; they were tried and **not kept**: the MCP Inspector's ``--strict``
check warns that a ``type`` array is less portable (a single-``type`` dialect such as Gemini's
OpenAPI subset may reject the tool), and tests/transport/test_inspector.py wants no warning.
Real results come from a real server in process (``--sandbox none``, the default encoder): a
``run_code`` result with a plot and a value, and an ``archival_memory_search`` over 60 facts. Each
check is timed the way the SDK makes it (``best_match(validator.iter_errors(result))``), the two
schemas alternating.
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


# Keywords whose meaning is not limited to instances of one type: an option holding one is kept.
FOR_ANY_TYPE = frozenset({"const", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref"})
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "$comment"})


def type_lists(schema: Any) -> Any:
    """``schema`` with each ``{"anyOf": [X, {"type": "null"}]}`` written as X with ``"null"`` among
    its types (and in its ``enum``): the same instances valid."""
    if isinstance(schema, list):
        return [type_lists(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: type_lists(value) for key, value in schema.items()}
    options = out.get("anyOf")
    if not (isinstance(options, list) and len(options) == 2 and {"type": "null"} in options):
        return out
    other = options[0] if options[1] == {"type": "null"} else options[1]
    kinds = other.get("type") if isinstance(other, dict) else None
    if (
        not isinstance(kinds, str | list)
        or FOR_ANY_TYPE & set(other)
        or (set(other) - ANNOTATIONS) & set(out)
    ):
        return out
    merged = {**other, **{key: value for key, value in out.items() if key != "anyOf"}}
    merged["type"] = [*([kinds] if isinstance(kinds, str) else kinds), "null"]
    if isinstance(other.get("enum"), list):
        merged["enum"] = [*other["enum"], None]
    return merged


async def results() -> dict[str, tuple[dict[str, Any], Any]]:
    """Per tool: (the schema as published, a real result)."""
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
                schema = listed[name]
                assert schema is not None and not result.is_error
                out[name] = (schema, result.structured_content)
            return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args(argv)
    print("| result | with type lists p50 ms | as published (anyOf) p50 ms | ratio |\n|---|---|---|---|")
    for name, (published, instance) in anyio.run(results).items():
        lists: list[float] = []
        alternatives: list[float] = []
        for _ in range(10):  # alternating slices: load changes hit both alike
            lists += check_ms(type_lists(published), instance, args.rounds // 10)
            alternatives += check_ms(published, instance, args.rounds // 10)
        a, b = statistics.median(lists), statistics.median(alternatives)
        print(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.2f}× |")


if __name__ == "__main__":
    main()
