"""Choosing fusion parameters on the tuning half of the retrieval suite (``bench_retrieval.py --tune``).

Each tuning question is gathered once through the real ``Recall.gather`` (the full-text hits
with their words scores and term statistics, the texts nearest in meaning, every candidate's
cosines to the query as asked and to its focus), then ``fusion.fused_scores`` — the function searches use — ranks the candidates under
each parameter set (the model's ``floor``, where unrelated texts sit, is kept: it is the
embedder's ``min_similarity``, calibrated on unrelated pairs, not on recall). The objective, per family: the mean of recall@1, @5 and @10 over questions
with an answer, minus five times any shortfall against the better of words alone and meaning alone
on that family (the default must be at least as good as either); averaged over families. The
"no match" cut-offs are chosen last: ``cutoff``, among those that cost the suite at most
``CUTOFF_COST`` of that objective and leave no family's recall@1, @5 or @10 below the better of
words alone and meaning alone where it was not already, the lowest that answers the most
questions about things never said (``NEVER_SAID`` kinds: not those asking one speaker about
what the other did) with nothing; then ``cutoff_absent`` (for questions naming something no
text holds) the same way, within the same cost counted from the objective before either.

The candidates are drawn once, with the parameters the model has when tuning starts (the texts
nearest in meaning are nearest to the mix of the query and its focus that ``focus_weight``
sets); a tuned ``focus_weight`` far from it would draw other candidates, so run ``--tune`` again
until it stays.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, replace

import numpy as np

from kernmind.memory.fusion import Fusion, fused_scores, rare_shares
from kernmind.memory.recall import Gathered
from retrieval_suite import NEVER_SAID, Question

CUTOFF_COST = 0.01
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
    terms: list  # TermStat of the query (rare terms' ids are passage ids)
    words_order: list[int]  # corpus indices in full-text order
    sessions: list[int] | None
    fit: np.ndarray | None = None  # how well each candidate fits the time the question names
    names: set[str] | None = None
    focus: np.ndarray | None = None  # cosines to the question's focus (None: the question is its focus)
    absent: bool = False  # the question names something no text holds


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
        g.text.terms,
        [index_of[r.id] for r in g.text.rows],
        sessions,
        np.array([g.fit.get(i, 1.0) for i in ids]) if g.fit else None,
        g.names,
        None if g.focus is None else np.array([g.focus.get(i, np.nan) for i in ids]),
        bool(g.absent),
    )


def ranked(s: Sample, fusion: Fusion, top: int = 10) -> list[int]:
    """Corpus indices, best first, as a search with ``fusion`` would return them."""
    if not len(s.pid):
        return []
    rare_by_pid = rare_shares(s.terms, fusion, s.names or ())
    rare = np.array([rare_by_pid.get(int(p), 0.0) for p in s.pid])
    score, code = fused_scores(s.words, s.cosines, rare, fusion, s.fit, s.focus, s.absent)
    order = np.lexsort((-s.pid, -score))
    return [int(s.index[i]) for i in order if code[i] >= 0][:top]


def meaning_order(s: Sample, min_similarity: float | None, top: int = 10) -> list[int]:
    c = np.nan_to_num(s.cosines, nan=-2.0)
    order = np.argsort(-c, kind="stable")
    keep = [int(s.index[i]) for i in order if min_similarity is None or c[i] >= min_similarity]
    return keep[:top]


def recalls(samples: list[Sample], rank: callable) -> tuple[dict[tuple[str, int], float], float]:  # type: ignore[valid-type]
    """(recall@k per (family, k) on questions with an answer, share of never-said questions answered with nothing)."""
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
        for k in (1, 5, 10):
            found = wanted & set(got[:k])
            per.setdefault((s.family, k), []).append(
                len(found) / len(wanted) if q.need_all else float(bool(found))
            )
    return {fk: statistics.mean(v) for fk, v in per.items()}, (statistics.mean(empty) if empty else 0.0)


def quality(samples: list[Sample], rank: callable) -> tuple[dict[str, float], float]:  # type: ignore[valid-type]
    """(per family mean of recall@1/5/10 on questions with an answer, share of never-said questions
    answered with nothing)."""
    per, empty = recalls(samples, rank)
    families = dict.fromkeys(f for f, _ in per)
    return {f: statistics.mean(per[(f, k)] for k in (1, 5, 10)) for f in families}, empty


def objective(per: dict[str, float], floor: dict[str, float]) -> float:
    return statistics.mean(per[f] - SHORTFALL * max(0.0, floor[f] - per[f]) for f in per)


def tune(samples: list[Sample], start: Fusion, min_similarity: float | None, log: callable) -> Fusion:  # type: ignore[valid-type]
    """The parameters for the model (``start``: its current ones; its floor is kept)."""
    words, _ = quality(samples, lambda s: s.words_order[:10])
    meaning, _ = quality(samples, lambda s: meaning_order(s, min_similarity))
    floor = {f: max(words[f], meaning[f]) for f in words}
    singles = [
        recalls(samples, lambda s: s.words_order[:10])[0],
        recalls(samples, lambda s: meaning_order(s, min_similarity))[0],
    ]
    floor_at = {fk: max(r[fk] for r in singles) for fk in singles[0]}
    log("tuning half, mean of recall@1/5/10: words " + _fmt(words) + "; meaning " + _fmt(meaning))

    def score(f: Fusion) -> float:
        return objective(quality(samples, lambda s: ranked(s, f))[0], floor)

    best = replace(
        start, cutoff=0.0, cutoff_absent=None
    )  # the floor is the model's: where unrelated texts sit
    for _ in range(2):  # coordinate search: each group of parameters given the others
        grid = itertools.product(
            np.arange(0.2, 0.61, 0.05),
            (1.0, 2.0, 3.0),
            (0.5, 0.6, 0.7, 0.8),
            (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0),
        )
        best = max(
            (
                replace(best, words_weight=round(float(w), 2), words_power=p, ceiling=hi, focus_weight=fw)
                for w, p, hi, fw in grid
            ),
            key=score,
        )
        log(f"weights and calibration: {best} -> {score(best):.4f}")
        rare = ((d, r) for d in (1, 2, 3, 5) for r in (0.15, 0.25, 0.35, 0.5))
        best = max((replace(best, rare_docs=d, rare_share=r) for d, r in rare), key=score)
        log(f"rare terms: {best} -> {score(best):.4f}")
        best = max((replace(best, time_weight=t) for t in (0.0, 0.2, 0.4, 0.6, 0.8, 0.9)), key=score)
        log(f"time: {best} -> {score(best):.4f}")
    top = score(best)
    uncut = recalls(samples, lambda s: ranked(s, best))[0]
    below = {fk for fk, v in uncut.items() if v < floor_at[fk]}  # shortfalls the cut-off is not to blame for
    best_cut, best_empty = best, -1.0
    for name in (
        "cutoff",
        "cutoff_absent",
    ):  # the cut-offs that answer most never-said questions with nothing
        low = best_cut.cutoff
        for cut in np.arange(low, low + 0.41, 0.01):
            trial = replace(best_cut, **{name: round(float(cut), 2)})
            at, empty = recalls(samples, lambda s, f=trial: ranked(s, f))
            per = {
                f: statistics.mean(at[(f, k)] for k in (1, 5, 10)) for f in dict.fromkeys(f for f, _ in at)
            }
            kept = all(v >= floor_at[fk] for fk, v in at.items() if fk not in below)
            log(
                f"  {name} {cut:.2f}: objective {objective(per, floor):.4f}, never said answered with nothing {100 * empty:.0f} %"
                + ("" if kept else " (a family below a single ranking)")
            )
            if kept and objective(per, floor) >= top - CUTOFF_COST and empty > best_empty:
                best_cut, best_empty = trial, empty
        log(
            f"no-match {name}: {best_cut} -> answered with nothing on {100 * best_empty:.0f} % of never-said questions"
        )
    per, _ = quality(samples, lambda s: ranked(s, best_cut))
    log("tuned default on the tuning half: " + _fmt(per))
    return best_cut


def _fmt(per: dict[str, float]) -> str:
    return ", ".join(f"{f} {100 * v:.1f}" for f, v in per.items())
