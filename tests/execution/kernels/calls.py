"""Running code on a real kernel in a test: the output, or the JSON its last line printed."""

from __future__ import annotations

import json
import time
from typing import Any

from kernmind.execution.kernels.local_kernel import Kernel
from kernmind.execution.results import OutputCollector


async def run(kernel: Kernel, code: str) -> OutputCollector:
    collector = OutputCollector(100_000)
    outcome = await kernel.execute(code, collector, deadline=time.monotonic() + 60)
    assert outcome.kind in ("ok", "error"), outcome
    return collector


async def run_json(kernel: Kernel, code: str) -> Any:
    """What the code's last printed line says, read as JSON (the code must not fail)."""
    collector = await run(kernel, code)
    assert collector.error is None, collector.error
    return json.loads("".join(collector.logs().stdout).strip().splitlines()[-1])
