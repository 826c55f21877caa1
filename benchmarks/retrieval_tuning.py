"""Choosing fusion parameters on the tuning half of the retrieval suite (``bench_retrieval.py --tune``).

Each tuning question is gathered once through the real ``Recall.gather`` (the full-text hits
with their words scores, the texts nearest in meaning, every candidate's cosines to the query
as asked and to its focus, each one's thread and previous text), then ``fusion.fused_scores`` —
the function searches use — ranks the candidates under each parameter set. The objective, per
family: the mean of recall@1, recall@5 and (where sessions exist) the right session first over
questions with an answer, minus five times any shortfall against the better of words alone and
meaning alone on that family (the default must be at least as good as either); averaged over
families, the real family counted twice (it decides; the generated ones are regression checks).

Tuned: ``words_weight``, ``focus_weight`` and ``thread_weight``. ``floor`` and ``ceiling`` are the
model's calibration; ``neighbour`` changes the cosines gathered (the index reads each text with
its neighbour), so it is compared by running the benchmark with ``--fusion neighbour=…``.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, replace

import numpy as np

from kernmind.memory.fusion import Fusion, fused_scores
from kernmind.memory.recall import Gathered
from retrieval_suite import NEVER_SAID, Question

SHORTFALL = 5  # a point below the better single ranking on a family costs five points of the objective


@dataclass(slots=True)
class Sample:
    """One tuning question's candidates (corpus indices) and what is known of each."""

    family: str
    question: Question
    index: np.ndarray  # corpus index of each candidate
    pid: np.ndarray  # passage id (ties: newest first, as searches break them)
    words: np.ndarray
    cosines: np.ndarray
    words_order: list[int]  # corpus indices in full-text order
    sessions: list[int] | None
    fit: np.ndarray | None = None  # how well each candidate fits the time the question names
    focus: np.ndarray | None = None  # cosines to the question's focus (None: the question is its focus)
    before: np.ndarray | None = None  # words score of each candidate's previous text in its thread
    threads: np.ndarray | None = None  # each candidate's thread code (-1: none)


def sample(
    family: str, q: Question, g: Gathered, index_of: dict[int, int], sessions: list[int] | None
) -> Sample:
    words = {r.id: r.score or 0.0 for r in g.text.rows}
    ids = list(dict.fromkeys([*words, *g.cosines]))
    return Sample(
        family,
        q,
        np.array([index_of[i] for i in ids], dtype=np.int64),
        np.array(ids, dtype=np.int64),
        np.array([words.get(i, 0.0) for i in ids]),
        np.array([g.cosines.get(i, np.nan) for i in ids]),
        [index_of[r.id] for r in g.text.rows],
        sessions,
        np.array([g.fit.get(i, 1.0) for i in ids]) if g.fit else None,
        None if g.focus is None else np.array([g.focus.get(i, np.nan) for i in ids]),
        np.array([words.get(g.previous[i], 0.0) if i in g.previous else 0.0 for i in ids]),
        np.array([g.threads.get(i, -1) for i in ids]),
    )


def ranked(s: Sample, fusion: Fusion, top: int = 10) -> list[int]:
    """Corpus indices, best first, as a search with ``fusion`` would return them."""
    if not len(s.pid):
        return []
    score, code = fused_scores(s.words, s.cosines, fusion, s.fit, s.focus, s.before, s.threads)
    inside = s.fit >= 1.0 if s.fit is not None else np.zeros(len(score), dtype=bool)
    order = np.lexsort((-s.pid, -score, ~inside))
    return [int(s.index[i]) for i in order if code[i] >= 0][:top]


def meaning_order(s: Sample, min_similarity: float | None, top: int = 10) -> list[int]:
    c = np.nan_to_num(s.cosines, nan=-2.0)
    order = np.argsort(-c, kind="stable")
    keep = [int(s.index[i]) for i in order if min_similarity is None or c[i] >= min_similarity]
    return keep[:top]


def recalls(samples: list[Sample], rank: callable) -> tuple[dict[tuple[str, int], float], float]:  # type: ignore[valid-type]
    """(recall@k per (family, k) on questions with an answer — k = 0: the right session first —, share
    of never-said questions answered with nothing)."""
    per: dict[tuple[str, int], list[float]] = {}
    empty: list[float] = []
    for s in samples:
        got = rank(s)
        q = s.question
        if not q.evidence:
            if q.kind in NEVER_SAID:
                empty.append(float(not got))
            continue
        wanted = set(q.evidence)
        for k in (1, 5):
            found = wanted & set(got[:k])
            per.setdefault((s.family, k), []).append(
                len(found) / len(wanted) if q.need_all else float(bool(found))
            )
        if s.sessions is not None:  # k = 0: the right session first
            first = bool(got) and s.sessions[got[0]] in {s.sessions[e] for e in q.evidence}
            per.setdefault((s.family, 0), []).append(float(first))
    return {fk: statistics.mean(v) for fk, v in per.items()}, (statistics.mean(empty) if empty else 0.0)


def quality(samples: list[Sample], rank: callable) -> tuple[dict[str, float], float]:  # type: ignore[valid-type]
    """(per family mean of recall@1, @5 and the right session first on questions with an answer,
    share of never-said questions answered with nothing)."""
    per, empty = recalls(samples, rank)
    families = dict.fromkeys(f for f, _ in per)
    return {f: statistics.mean(v for (g, _), v in per.items() if g == f) for f in families}, empty


def objective(per: dict[str, float], floor: dict[str, float]) -> float:
    weight = {f: 2.0 if f == "real" else 1.0 for f in per}
    total = sum(weight[f] * (per[f] - SHORTFALL * max(0.0, floor[f] - per[f])) for f in per)
    return total / sum(weight.values())


def tune(samples: list[Sample], start: Fusion, min_similarity: float | None, log: callable) -> Fusion:  # type: ignore[valid-type]
    """The parameters for the model (``start``: its current ones; floor, ceiling and neighbour kept)."""
    words, _ = quality(samples, lambda s: s.words_order[:10])
    meaning, _ = quality(samples, lambda s: meaning_order(s, min_similarity))
    floor = {f: max(words[f], meaning[f]) for f in words}
    log(
        "tuning half, mean of recall@1/5 and session first: words "
        + _fmt(words)
        + "; meaning "
        + _fmt(meaning)
    )

    def score(f: Fusion) -> float:
        return objective(quality(samples, lambda s: ranked(s, f))[0], floor)

    grid = itertools.product(np.arange(0.2, 0.61, 0.1), (0.0, 0.2, 0.4, 0.6), (0.0, 0.3, 0.6, 1.0))
    best = max(
        (
            replace(start, words_weight=round(float(w), 2), focus_weight=fw, thread_weight=tw)
            for w, fw, tw in grid
        ),
        key=score,
    )
    log(f"chosen: {best} -> {score(best):.4f} (start {score(start):.4f})")
    per, _ = quality(samples, lambda s: ranked(s, best))
    log("tuned default on the tuning half: " + _fmt(per))
    return best


def _fmt(per: dict[str, float]) -> str:
    return ", ".join(f"{f} {100 * v:.1f}" for f, v in per.items())
