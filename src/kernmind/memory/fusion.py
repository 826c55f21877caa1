"""How a search fuses its two rankings, words and meaning, into one score a model can read.

Design: the rule and what each part gains: docs/tools.md ("One score", "Threads", "The query's
focus", "Nothing for what was never said", "When") and benchmarks/README.md. :data:`FUSION` holds the
parameters per model (the model enters only through ``floor`` and ``ceiling``); :data:`DEFAULT` is for
models not measured.

Error policy: pure functions over numbers; nothing here raises for any input.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

Match = Literal["words", "meaning", "both"]
MATCHES: tuple[Match, Match, Match] = ("words", "meaning", "both")


@dataclass(frozen=True, slots=True)
class Fusion:
    floor: float  # cosine at or below which a text is unrelated in meaning (meaning score 0)
    ceiling: float  # cosine at or above which a text means the same (meaning score 1)
    words_weight: float = 0.4  # the words score's share of the fused score; meaning has the rest
    focus_weight: float = 0.4  # the focus's share of meaning (the query as asked has the rest)
    neighbour: float = 0.3  # share of the previous text of its thread read with a text
    thread_weight: float = 0.6  # how much a thread's best score lifts its other texts
    cutoff: float = 0.08  # texts scoring below this with meaning from the query's focus alone are no match


# Chosen on the tuning half of benchmarks/bench_retrieval.py (the real family decides; the
# generated families are regression checks): benchmarks/README.md.
FUSION: dict[str, Fusion] = {
    "sentence-transformers/all-MiniLM-L6-v2": Fusion(0.2, 0.7),
    "wordllama/l2_supercat_256": Fusion(0.12, 0.5),
}
DEFAULT = Fusion(0.2, 0.7)


def fusion_for(model: str) -> Fusion:
    return FUSION.get(model, DEFAULT)


@dataclass(frozen=True, slots=True)
class Scored:
    id: int
    score: float
    match: Match


def meaning_scores(cosines: np.ndarray, fusion: Fusion) -> np.ndarray:
    span = max(fusion.ceiling - fusion.floor, 1e-6)
    return np.clip((cosines - fusion.floor) / span, 0.0, 1.0)


def fused_scores(
    words: np.ndarray,
    cosines: np.ndarray,
    fusion: Fusion,
    fit: np.ndarray | None = None,
    focus: np.ndarray | None = None,
    before: np.ndarray | None = None,
    threads: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(score, match code) per candidate, from parallel arrays: words scores, cosines to the query as
    asked and to its focus (NaN: no vector; ``focus`` None: the same; both already read with the
    previous text of a thread), the words score of the previous text of each one's thread
    (``before``; 0: none), each one's thread (``threads``; -1: none) and how well each fits a time
    the query names (1: in it; None: the query names none). Match codes index :data:`MATCHES`;
    -1 is no match (left out)."""
    if before is not None:
        words = np.minimum(1.0, words + fusion.neighbour * before)
    asked = np.nan_to_num(cosines, nan=-1.0)
    focused = asked if focus is None else np.nan_to_num(focus, nan=-1.0)
    meaning = meaning_scores((1 - fusion.focus_weight) * asked + fusion.focus_weight * focused, fusion)
    score = fusion.words_weight * words + (1 - fusion.words_weight) * meaning
    evidence = fusion.words_weight * words + (1 - fusion.words_weight) * meaning_scores(focused, fusion)
    code = np.where(words > 0, np.where(meaning > 0, 2, 0), np.where(meaning > 0, 1, -1))
    code = np.where(evidence < fusion.cutoff, -1, code)
    inside = None if fit is None else fit >= 1.0
    if inside is not None:  # the time asked for is a match in itself (reported as a match in meaning)
        code = np.where(inside & (code < 0), 1, code)
    if threads is not None and fusion.thread_weight and (threads >= 0).any():
        score = _thread_prior(score, threads, code >= 0, fusion.thread_weight)
    if inside is not None and fit is not None:  # every kept candidate inside above every one outside
        kept_inside = inside & (code >= 0)
        low = float(score[kept_inside].min()) if kept_inside.any() else 1.0
        score = np.where(inside, score, np.minimum(score, low) * fit * (1 - 1e-3))
    return score, code


def _thread_prior(score: np.ndarray, threads: np.ndarray, kept: np.ndarray, weight: float) -> np.ndarray:
    """Each threaded score lifted toward the best kept score of its thread (see the module docstring)."""
    threaded = (threads >= 0) & kept
    if not threaded.any():
        return score
    codes, where = np.unique(threads[threaded], return_inverse=True)
    best = np.zeros(len(codes))
    np.maximum.at(best, where, score[threaded])
    out = score.copy()
    out[threaded] = (score[threaded] + weight * best[where]) / (1 + weight)
    return out


def fuse(
    words: Mapping[int, float],
    cosines: Mapping[int, float],
    fusion: Fusion,
    fit: Mapping[int, float] | None = None,
    focus: Mapping[int, float] | None = None,
    before: Mapping[int, float] | None = None,
    threads: Mapping[int, Hashable] | None = None,
) -> list[Scored]:
    """Candidates best first with their fused score and what matched; no-matches left out.
    ``words``: words score per full-text hit; ``cosines``: similarity to the query as asked, per
    candidate with a vector; ``focus``: similarity to the query's focus (None: the same);
    ``before``: the words score of the text before each one in its thread; ``threads``: each
    candidate's thread (absent: none); ``fit``: how well each fits the time the query names (when
    it names one)."""
    ids = list(dict.fromkeys([*words, *cosines]))
    if not ids:
        return []
    n = len(ids)

    def column(values: Mapping[int, float], missing: float) -> np.ndarray:
        return np.fromiter((values.get(i, missing) for i in ids), dtype=np.float64, count=n)

    f = column(fit, 1.0) if fit else None
    o = None if focus is None else column(focus, np.nan)
    b = column(before, 0.0) if before else None
    t = None
    if threads:
        labels: dict[Hashable, int] = {}
        t = np.fromiter(
            (labels.setdefault(threads[i], len(labels)) if i in threads else -1 for i in ids), np.int64, n
        )
    score, code = fused_scores(column(words, 0.0), column(cosines, np.nan), fusion, f, o, b, t)
    keep = np.flatnonzero(code >= 0)
    inside = f[keep] >= 1.0 if f is not None else np.zeros(len(keep), dtype=bool)  # inside first, even at 0
    order = keep[np.lexsort((-np.asarray(ids)[keep], -score[keep], ~inside))]
    rounded = np.round(score[order], 4).tolist()
    return [
        Scored(ids[i], s, MATCHES[c])
        for i, s, c in zip(order.tolist(), rounded, code[order].tolist(), strict=True)
    ]
