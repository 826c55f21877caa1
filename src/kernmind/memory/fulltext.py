"""How text becomes full-text search terms, the same way for what is stored and what is asked
(docs/tools.md, "Archival memory", words).

Design: spaced scripts are left to the index's stemming tokenizer; runs of CJK, Thai, Lao, Khmer,
Myanmar and Korean are also indexed as character unigrams and bigrams (:func:`index_text`), and a
query's run becomes its bigrams. Stop words leave a query unless nothing else is left. :func:`idf` is
bm25's; a term in ``WIDESPREAD_SHARE`` of the texts is :func:`widespread` (recall.py leaves it out of
the query's focus).

Error policy: pure functions over strings; nothing here raises for any input.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

MAX_QUERY_TERMS = 32

# Runs of characters from scripts written without spaces between words (and Hangul).
_UNSPACED = (
    "\u0e00-\u0e7f"  # Thai
    "\u0e80-\u0eff"  # Lao
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u3005\u3006\u3007"  # 々 〆 〇
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # half-width Katakana
    "\U00020000-\U0003134f"  # CJK extensions B-H
)
UNSPACED_RUN = re.compile(f"[{_UNSPACED}]+")
WORD_RE = re.compile(r"\w+", re.UNICODE)


def _grams(run: str, *, unigrams: bool) -> list[str]:
    bigrams = [run[i : i + 2] for i in range(len(run) - 1)]
    if len(run) == 1:
        return [run]
    return [*run, *bigrams] if unigrams else bigrams


def index_text(content: str) -> str | None:
    """What the full-text index should hold for ``content``; None when the content itself will do."""
    runs = UNSPACED_RUN.findall(content)
    if not runs:
        return None
    grams = [g for run in runs for g in _grams(run, unigrams=True)]
    return content + "\n" + " ".join(grams)


def query_terms(text: str) -> list[str]:
    """The distinct search terms of a query, lower-cased, in order (at most MAX_QUERY_TERMS)."""
    seen: dict[str, None] = {}
    for word in WORD_RE.findall(text):
        pos = 0
        for m in UNSPACED_RUN.finditer(word):
            if m.start() > pos:
                seen.setdefault(word[pos : m.start()].lower(), None)
            for gram in _grams(m.group(), unigrams=False):
                seen.setdefault(gram, None)
            pos = m.end()
        if pos < len(word):
            seen.setdefault(word[pos:].lower(), None)
    return list(seen)[:MAX_QUERY_TERMS]


# PostgreSQL's English stop words (snowball ``english.stop``), lower case
STOP_WORDS = frozenset(
    "i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her "
    "hers herself it its itself they them their theirs themselves what which who whom this that these "
    "those am is are was were be been being have has had having do does did doing a an the and but if "
    "or because as until while of at by for with about against between into through during before after "
    "above below to from up down in out on off over under again further then once here there when where "
    "why how all any both each few more most other some such no nor not only own same so than too very s "
    "t can will just don should now".split()
)


def content_terms(terms: Sequence[str]) -> list[str]:
    """The terms a query is ranked by: its terms without stop words (all of them if that leaves none)."""
    kept = [t for t in terms if t not in STOP_WORDS]
    return kept or list(terms)


def idf(docs: int, total: int) -> float:
    """Inverse document frequency of a term found in ``docs`` of ``total`` texts (FTS5's bm25: a
    term in half the texts or more counts next to nothing). Counts read at different moments
    (a backend whose reads are not one snapshot, with writes in between) may say more ``docs``
    than ``total``: such a term counts as one in every text, never as an error."""
    docs = min(docs, total)
    value = math.log((total - docs + 0.5) / (docs + 0.5)) if total > 0 else 0.0
    return max(value, 1e-6)


WIDESPREAD_SHARE = 0.05
WIDESPREAD_MIN_DOCS = 20


def widespread(docs: int, total: int) -> bool:
    """Whether a term found in ``docs`` of ``total`` texts is in so many that it tells them apart no better
    than a stop word (see the module docstring)."""
    return docs >= max(WIDESPREAD_MIN_DOCS, WIDESPREAD_SHARE * total)


def without_terms(text: str, terms: Sequence[str]) -> str:
    """``text`` with every whole word that is one of ``terms`` (as :func:`query_terms` gives them) taken out."""
    if not terms:
        return text
    drop = set(terms)
    return " ".join(WORD_RE.sub(lambda m: "" if m.group().lower() in drop else m.group(), text).split())


def fts_match(terms: Sequence[str]) -> str:
    """Terms as an FTS5 OR query (each quoted, so no FTS syntax leaks in)."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


NO_TERMS_NOTE = (
    "The query has no searchable words (only emoji, punctuation or symbols), so nothing was matched. "
    "Search with words (any language), or pass an empty query to list the newest passages."
)
