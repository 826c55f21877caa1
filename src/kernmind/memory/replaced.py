"""A fact that changed is found by what it used to say: "Where does Mira live?" finds "Mira moved from
Bergen to Oslo", which superseded "Mira lives in Bergen" (docs/tools.md, "A fact that changed").

Design: a search hiding superseded passages still draws them from full text (:func:`with_replaced`),
takes them out of the hits (:func:`split_replaced`) and passes their match, a hair less, to the
passage that replaced them where that one passes the filter (:func:`carry`).
Error policy: pure functions over rows and an index snapshot; nothing here raises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernmind.memory.database import TextHits

if TYPE_CHECKING:
    from kernmind.memory.vector_scores import Candidates

CARRIED = 0.999  # the share of a replaced passage's match its replacement gets


def hides(where: Any) -> bool:
    return getattr(where, "include_superseded", True) is False


def with_replaced(where: Any) -> Any:
    """A passage filter that also finds superseded passages where ``where`` hides them."""
    return dataclasses.replace(where, include_superseded=True) if hides(where) else where


def split_replaced(text: TextHits, drop: bool) -> dict[int, Any]:
    """Superseded passages among the full-text hits, the best per replacing id; with ``drop``, taken
    out of the hits (the search hides them)."""
    replaced: dict[int, Any] = {}
    live = []
    for row in text.rows:
        new = getattr(row, "superseded_by", None)
        if new is None or not drop:
            live.append(row)
        if new is not None and new not in replaced:  # rows come best first
            replaced[new] = row
    text.rows = live
    return replaced


def carry(
    replaced: dict[int, Any],
    candidates: Candidates,
    *similarities: tuple[Sequence[float] | None, dict[int, float] | None],
    carried: dict[int, float],
    neighbour: float,
) -> None:
    """Pass each superseded passage's words score (into ``carried``) and similarity to each query
    vector (into its dict: ``similarities`` are (vector, similarity by id) pairs) to the passage that
    replaced it."""
    from kernmind.memory.vector_scores import similarity_of

    passing = set(candidates.passing([*replaced]))
    for new, old in replaced.items():
        if new not in passing:
            continue
        carried[new] = max(carried.get(new, 0.0), (old.score or 0.0) * CARRIED)
        for vec, sims in similarities:
            if sims is not None and vec is not None:
                got = similarity_of(candidates, vec, [old.id, new], neighbour)
                if new in got:
                    sims[new] = max(got[new], got.get(old.id, -1.0) - (1 - CARRIED))
