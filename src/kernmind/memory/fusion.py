"""How a search fuses its two rankings, words and meaning, into one score a model can read.

Design
------
* Every candidate — a full-text hit or one of the texts nearest in meaning — comes with all of
  its scores (recall.py gathers them: the vector index scores the full-text hits too, and a text
  nearest in meaning that matched no word has a words score of 0):
  - ``words`` in [0, 1]: the share of the query's weight (the idf of its terms, stop words aside)
    the text matches (fts5.py, postgres.py);
  - two cosine similarities: to the query as asked, and to its *focus* — the query without its
    widespread terms (a speaker's name in every turn: fulltext.py), which say nothing about what
    is asked yet, with a sentence encoder, make every text holding them look close. Where the
    query has none, both are the same.
  Meaning is their weighted mean (``focus_weight``: the focus's share), mapped to [0, 1] by the
  model's calibration — ``floor`` is where unrelated texts sit (0 at or below it), ``ceiling``
  where a paraphrase sits (1 at or above it).
* The score is ``words_weight · words^words_power + (1 − words_weight) · meaning``: score-level
  fusion of normalised scores, which keeps how strong each match is (reciprocal-rank fusion, used
  before, only kept the order, so the first meaning hit outranked the only exact full-text
  match). The power discounts partial word matches — one incidental shared word of four — much
  more than full ones.
* No match: a candidate is left out when the same score with meaning taken from the focus alone
  is below ``cutoff`` — a question about something never said still finds texts that share its
  speaker or its topic words; their similarity to the focus is what shows (as well as this
  model can) that none is about it. The candidates' ranking keeps the question as asked too:
  who said a turn is often what ties it to the question.
  When the query names something (a word written like a name, id or number: fulltext.py) that no
  stored text holds ("What's for dinner on Mars?"), the bar is ``cutoff_absent``: only a text
  whose meaning is clearly about the question (the note about the car's winter tyres for "When
  is the Volvo getting winter tyres?") still counts. Scores are absolute, not relative to the query's best hit, so a search about
  nothing finds only weak candidates, and those are left out.
* Each result says what matched: ``words`` (its words, nothing close in meaning), ``meaning``
  (no word of the query) or ``both``.
* Time: when the query names a time ("in May 2023", "last week", "before the move": when.py), a
  text loses up to ``time_weight`` of its score the farther its time is from it (recall.py draws
  candidates from inside that time too, and says how well each fits).
* Rare terms: a text holding a query term that occurs in at most ``rare_docs`` texts, carries at
  least ``rare_share`` of the query's weight and is written like a name, id or number (a surname,
  ``INC-48213``, an invoice number: fulltext.py) or is most of the query (``RARE_ALONE``:
  "axolotl") is an exact match the user is asking for: it is never left out, and it ranks above
  every text that holds no such term — unless meaning says it is unrelated (cosine at or below
  ``floor``) and the term is not most of the query. Rare but incidental words ("avoids" in "Who
  avoids planes?", "housing" matching "house") must not push a note about meat or a garden above
  the one about a fear of flying or a rent increase.
* The parameters depend on the model (its cosine scale): :data:`FUSION` holds those chosen on the
  tuning half of the retrieval benchmark (``python benchmarks/bench_retrieval.py --tune`` prints
  them; ``floor`` is the model's ``min_similarity``, calibrated on unrelated pairs), :data:`DEFAULT`
  is for models not measured there (an endpoint's).

Error policy
------------
Pure functions over numbers; nothing here raises for any input.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kernmind.memory.database import TermStat

Match = Literal["words", "meaning", "both"]
MATCHES: tuple[Match, Match, Match] = ("words", "meaning", "both")


@dataclass(frozen=True, slots=True)
class Fusion:
    words_weight: float  # the words score's share of the fused score; meaning has the rest
    words_power: float  # the words score is raised to this power (> 1: partial matches count less)
    floor: float  # cosine at or below which a text is unrelated in meaning (meaning score 0)
    ceiling: float  # cosine at or above which a text means the same (meaning score 1)
    cutoff: float  # texts scoring below this with meaning from the query's focus are no match
    rare_docs: int  # a term in at most this many texts is rare ...
    rare_share: float  # ... and protects the texts holding it when it carries this share of the query
    time_weight: float = 0.5  # how much of its score a text loses for being far from a time the query names
    focus_weight: float = 0.0  # the focus's share of meaning (the query as asked has the rest)
    cutoff_absent: float | None = (
        None  # the cut-off when the query names something no text holds (None: cutoff)
    )


# Chosen on the tuning half of benchmarks/bench_retrieval.py, per model (benchmarks/README.md).
FUSION: dict[str, Fusion] = {
    "sentence-transformers/all-MiniLM-L6-v2": Fusion(0.2, 3.0, 0.2, 0.7, 0.1, 5, 0.25, 0.9, 0.4, 0.29),
    "wordllama/l2_supercat_256": Fusion(0.2, 3.0, 0.12, 0.5, 0.09, 5, 0.15, 0.8, 0.8),
}
DEFAULT = Fusion(0.2, 3.0, 0.2, 0.7, 0.09, 5, 0.25, 0.9, 0.4)
RARE_ALONE = 0.5  # a rare term carrying this share of the query protects its texts whatever their meaning


def fusion_for(model: str) -> Fusion:
    return FUSION.get(model, DEFAULT)


@dataclass(frozen=True, slots=True)
class Scored:
    id: int
    score: float
    match: Match


def rare_shares(terms: Sequence[TermStat], fusion: Fusion, names: Collection[str] = ()) -> dict[int, float]:
    """Per text holding a rare term of the query — one written like a name, id or number (``names``),
    or one carrying at least ``RARE_ALONE`` of the query — the share of the query's weight its rare
    terms carry."""
    out: dict[int, float] = {}
    for t in terms:
        if t.ids is not None and t.docs <= fusion.rare_docs and (t.term in names or t.share >= RARE_ALONE):
            for pid in t.ids:
                out[pid] = out.get(pid, 0.0) + t.share
    return out


def meaning_scores(cosines: np.ndarray, fusion: Fusion) -> np.ndarray:
    span = max(fusion.ceiling - fusion.floor, 1e-6)
    return np.clip((cosines - fusion.floor) / span, 0.0, 1.0)


def fused_scores(
    words: np.ndarray,
    cosines: np.ndarray,
    rare: np.ndarray,
    fusion: Fusion,
    fit: np.ndarray | None = None,
    focus: np.ndarray | None = None,
    absent: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(score, match code) per candidate, from parallel arrays: words scores, cosines to the query as
    asked and to its focus (NaN: no vector; ``focus`` None: the same), the share of the query's weight
    carried by rare terms each holds, and how well each fits a time the query names (1: in it; None:
    the query names none); ``absent``: the query names something no text holds. Match codes index
    :data:`MATCHES`; -1 is no match (left out)."""
    asked = np.nan_to_num(cosines, nan=-1.0)
    focused = asked if focus is None else np.nan_to_num(focus, nan=-1.0)
    meaning = meaning_scores((1 - fusion.focus_weight) * asked + fusion.focus_weight * focused, fusion)
    weighed = fusion.words_weight * words**fusion.words_power
    score = weighed + (1 - fusion.words_weight) * meaning
    evidence = (
        score if focus is None else weighed + (1 - fusion.words_weight) * meaning_scores(focused, fusion)
    )
    cutoff = fusion.cutoff if not absent or fusion.cutoff_absent is None else fusion.cutoff_absent
    code = np.where(words > 0, np.where(meaning > 0, 2, 0), np.where(meaning > 0, 1, -1))
    protected = (rare >= fusion.rare_share) & (words > 0) & ((meaning > 0) | (rare >= RARE_ALONE))
    if protected.any():
        others = score[~protected]
        above = max(float(others.max()) if len(others) else 0.0, fusion.cutoff)
        score = np.where(protected, np.maximum(score, np.minimum(1.0, above + 1e-3)), score)
    code = np.where((evidence < cutoff) & ~protected, -1, code)
    if fit is not None:  # a match at another time is still a match, ranked lower
        score = score * (1 - fusion.time_weight * (1 - fit))
    return score, code


def fuse(
    words: Mapping[int, float],
    cosines: Mapping[int, float],
    rare: Mapping[int, float],
    fusion: Fusion,
    fit: Mapping[int, float] | None = None,
    focus: Mapping[int, float] | None = None,
    absent: bool = False,
) -> list[Scored]:
    """Candidates best first with their fused score and what matched; no-matches left out.
    ``words``: words score per full-text hit; ``cosines``: similarity to the query as asked, per
    candidate with a vector; ``focus``: similarity to the query's focus (None: the same); ``rare``:
    share of the query's weight in rare terms, per text holding one; ``fit``: how well each fits the
    time the query names (when it names one); ``absent``: the query names something no text holds."""
    ids = list(dict.fromkeys([*words, *cosines]))
    if not ids:
        return []
    w = np.array([words.get(i, 0.0) for i in ids], dtype=np.float64)
    c = np.array([cosines.get(i, np.nan) for i in ids], dtype=np.float64)
    r = np.array([rare.get(i, 0.0) for i in ids], dtype=np.float64)
    f = np.array([fit.get(i, 1.0) for i in ids], dtype=np.float64) if fit else None
    o = None if focus is None else np.array([focus.get(i, np.nan) for i in ids], dtype=np.float64)
    score, code = fused_scores(w, c, r, fusion, f, o, absent)
    order = sorted((i for i in range(len(ids)) if code[i] >= 0), key=lambda i: (-score[i], -ids[i]))
    return [Scored(ids[i], round(float(score[i]), 4), MATCHES[code[i]]) for i in order]
