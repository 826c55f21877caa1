"""Which small offline encoder: meaning-only recall on three kinds of input, and what it costs.

Run: ``python benchmarks/bench_encoders.py [--wheels DIR] [--only NAME ...] [--interleaved]``

For each encoder (encoder_candidates.py), in a fresh process of its own so load time and memory are
its alone: load it, embed every passage of the three families (encoder_sets.py: paraphrase,
exact names/ids/numbers, conversations) one text at a time, embed every question as a query, and
rank passages by cosine similarity. Reported per family: recall@1/5/10 (meaning only: no full
text, no fusion), then embed ms per text (p50 over the passages and over the questions), load
seconds, the process's peak RSS, and "recall@5 per ms" (mean recall@5 over the families divided by
the passage p50) — the trade the issue asks about. ``--interleaved`` only times the chosen encoders
against each other, loaded in one process and run in turn on the same texts (the first named is
the baseline), which keeps a busy machine's load from favouring one of them.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import encoder_sets
from encoder_candidates import candidates


def measure(name: str, wheels: Path | None) -> dict[str, object]:
    cand = candidates(wheels)[name]()
    t0 = time.perf_counter()
    cand.load()
    load_s = time.perf_counter() - t0
    row: dict[str, object] = {"name": cand.name, "wheel": cand.wheel, "load_s": load_s}
    passage_ms: list[float] = []
    query_ms: list[float] = []
    for fam in (encoder_sets.paraphrase(), encoder_sets.exact(), encoder_sets.conversation()):
        vecs = []
        for text in fam.passages:
            t = time.perf_counter()
            vecs.append(cand.passages([text])[0])
            passage_ms.append((time.perf_counter() - t) * 1000)
        matrix = np.asarray(vecs)
        hits = {1: 0, 5: 0, 10: 0}
        for question, answers in fam.questions:
            t = time.perf_counter()
            [q] = cand.queries([question])
            query_ms.append((time.perf_counter() - t) * 1000)
            top = np.argsort(-(matrix @ q), kind="stable")[:10].tolist()
            for k in hits:
                hits[k] += bool(answers & set(top[:k]))
        row[fam.name] = {k: v / len(fam.questions) for k, v in hits.items()}
    row["passage_ms_p50"] = statistics.median(passage_ms)
    row["query_ms_p50"] = statistics.median(query_ms)
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def interleaved(names: list[str], wheels: Path | None, rounds: int = 5) -> None:
    """Per-text embedding time of several encoders loaded in one process, timed in turn on the same
    texts (the paraphrase set's 48 notes and 48 questions), so the machine's load hits them alike."""
    cands = {name: candidates(wheels)[name]() for name in names}
    for cand in cands.values():
        cand.load()
    notes = [n for n, _ in encoder_sets.PAIRS]
    questions = [q for _, q in encoder_sets.PAIRS]
    times: dict[str, dict[str, list[float]]] = {n: {"note": [], "question": []} for n in cands}
    for _ in range(rounds):
        for note, question in zip(notes, questions, strict=True):
            for name, cand in cands.items():
                for kind, text, embed in (
                    ("note", note, cand.passages),
                    ("question", question, cand.queries),
                ):
                    t = time.perf_counter()
                    embed([text])
                    times[name][kind].append((time.perf_counter() - t) * 1000)
    base = statistics.median(times[names[0]]["note"])
    print("| encoder | note ms p50 | question ms p50 | note time vs the first |")
    print("|---|---|---|---|")
    for name, t in times.items():
        note = statistics.median(t["note"])
        print(
            f"| {cands[name].name} | {note:.2f} | {statistics.median(t['question']):.2f} | {note / base:.2f}× |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--wheels", type=Path, help="folder with the unpacked candidate wheels (encoder_candidates.py)"
    )
    ap.add_argument("--only", nargs="*", help="encoders to measure (default: all available)")
    ap.add_argument(
        "--interleaved", action="store_true", help="only time the --only encoders, in turn, in one process"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.interleaved:
        interleaved(args.only or ["minilm"], args.wheels)
        return 0
    if args.child:
        print(json.dumps(measure(args.child, args.wheels)))
        return 0
    names = args.only or list(candidates(args.wheels))
    rows = []
    for name in names:
        cmd = [sys.executable, __file__, "--child", name] + (
            ["--wheels", str(args.wheels)] if args.wheels else []
        )
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"{name}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"measured {name}", file=sys.stderr)
    fams = ("paraphrase", "exact", "conversation")
    print(
        "| encoder | "
        + " | ".join(f"{f} R@1/5/10" for f in fams)
        + " | passage ms p50 | query ms p50 | load s | peak RSS MB | R@5 per ms |"
    )
    print("|---" * 9 + "|")
    for r in rows:
        cells = [" / ".join(f"{100 * r[f][k]:.0f}" for k in ("1", "5", "10")) for f in fams]  # type: ignore[index]
        r5 = statistics.mean(r[f]["5"] for f in fams)  # type: ignore[index]
        print(
            f"| {r['name']} | "
            + " | ".join(cells)
            + f" | {r['passage_ms_p50']:.2f} | {r['query_ms_p50']:.2f} | {r['load_s']:.2f} | {r['peak_rss_mb']:.0f} | {r5 / r['passage_ms_p50']:.2f} |"  # type: ignore[operator]
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
