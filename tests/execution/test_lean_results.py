"""Lean structured results: what a client hands its model is not much larger than the text.

Some clients (pydantic-ai) give the model ``structuredContent`` rather than the text block, so
the structured result must not carry null fields or an HTML copy of what the text already
says. Driven through a real in-process server on real sandboxed kernels.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("python"), pytest.mark.slow]

# A table like the (a 50k-row CSV's ``df.head()``: a dozen columns, ≈ 1,250 characters).
DF = (
    "import numpy as np, pandas as pd\n"
    "rng = np.random.default_rng(7)\n"
    "n = 50_000\n"
    "df = pd.DataFrame({'order_id': np.arange(100_000, 100_000 + n), 'customer': rng.integers(1, 9_999, n),\n"
    "                   'city': rng.choice(['Oslo', 'Lima', 'Pune', 'Kyiv', 'Nice', 'Bern'], n),\n"
    "                   'date': pd.date_range('2024-01-01', periods=n, freq='h').date,\n"
    "                   'quantity': rng.integers(1, 20, n), 'unit_price': rng.uniform(1, 500, n).round(2),\n"
    "                   'discount': rng.uniform(0, 0.3, n).round(3), 'returned': rng.random(n) < 0.05,\n"
    "                   'channel': rng.choice(['web', 'store', 'phone'], n), 'rating': rng.integers(1, 6, n)})\n"
    "df['total'] = (df.quantity * df.unit_price * (1 - df.discount)).round(2)\n"
    "pd.set_option('display.width', 200)\n"
)
MAX_RATIO = 1.5  # structured result / text block, for a pandas table (issue 25)


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    settings = make_settings(tmp_path_factory.mktemp("lean"), pool_size=0)
    async with Client(create_server(settings)) as c:
        yield c


# The public contract's run_code keys, kept even when null (a client may read result["error"]).
CONTRACT_NULLS = {".session_id", ".execution_count", ".error"}


def _nulls(value: Any, where: str = "", allowed: frozenset[str] = frozenset()) -> list[str]:
    """Null fields of a structured result, but those the contract names (``allowed``)."""
    if value is None:
        return [] if where in allowed else [where or "(top)"]
    if isinstance(value, dict):
        return [n for k, v in value.items() for n in _nulls(v, f"{where}.{k}", allowed)]
    if isinstance(value, list):
        return [n for i, v in enumerate(value) for n in _nulls(v, f"{where}[{i}]", allowed)]
    return []


async def test_dataframe_head_travels_as_text_within_half_again_its_text_block(client: Client) -> None:
    result = await client.call_tool("run_code", {"code": DF + "df.head()", "session_id": "df"})
    out = structured(result)
    text_block = result.content[0].text
    shown = out["results"][-1]
    assert "order_id" in shown["text"] and "100004" in shown["text"]
    assert "html" not in shown, "the table's HTML says nothing its text form does not"
    assert _nulls(out, allowed=frozenset(CONTRACT_NULLS)) == []
    assert out["error"] is None  # the contract's keys stay
    size = len(json.dumps(out, ensure_ascii=False))
    assert size <= MAX_RATIO * len(text_block), (size, len(text_block), out)


async def test_html_that_shows_more_than_its_text_still_travels(client: Client) -> None:
    """Asked for explicitly (``display(HTML(...))``), with a link, with words its text form lacks,
    or behind a default repr (a pandas Styler), the HTML comes along."""
    code = DF + (
        "from IPython.display import HTML, display\n"
        "display(HTML(df.head(3).to_html()))\n"
        "display(HTML('<a href=\"https://example.org/report\">report</a>'))\n"
        "display({'text/plain': 'a summary', 'text/html': '<p>a summary of <i>twelve</i> rows</p>'}, raw=True)\n"
        "df.head(3).style.highlight_max(subset=['total'])"
    )
    out = structured(await client.call_tool("run_code", {"code": code, "session_id": "html"}))
    table, link, richer, styled = out["results"]
    assert "<table" in table["html"] and "100002" in table["html"] and "unit_price" in table["html"]
    assert "https://example.org/report" in link["html"]
    assert "twelve" in richer["html"]
    assert "<table" in styled["html"]  # a Styler's text is only its default repr
    assert _nulls(out, allowed=frozenset(CONTRACT_NULLS)) == []


async def test_job_answers_carry_no_null_fields(client: Client) -> None:
    started = structured(
        await client.call_tool("run_code", {"code": "1 + 1", "session_id": "job", "background": True})
    )
    assert _nulls(started, allowed=frozenset(CONTRACT_NULLS)) == []
    for _ in range(600):
        status = structured(await client.call_tool("job_status", {"job_id": started["job_id"]}))
        if status["state"] != "running":
            break
        await anyio.sleep(0.05)
    assert status["state"] == "done" and status["result"]["results"][0]["text"] == "2"
    assert _nulls(status, allowed=frozenset(".result" + k for k in CONTRACT_NULLS)) == []
    assert status["result"]["error"] is None
