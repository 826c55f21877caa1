"""fulltext.py: the terms a query is ranked by."""

from __future__ import annotations

import pytest

from kernmind.memory.fulltext import content_terms, idf, names_in, query_terms

pytestmark = pytest.mark.sqlite_only("pure functions: no database involved")


def test_stop_words_are_left_out_unless_nothing_else_is_left() -> None:
    assert content_terms(query_terms("What did Maya name the beagle?")) == ["maya", "name", "beagle"]
    assert content_terms(query_terms("Who is it?")) == ["who", "is", "it"]


def test_terms_written_like_names_ids_or_numbers() -> None:
    assert names_in("What animal does Ana Kowalczyk keep?") == {"ana", "kowalczyk"}
    assert names_in("Who closed INC-48213?") == {"inc", "48213"}
    assert names_in("was invoice 884123 paid") == {"884123"}
    assert names_in("Who avoids planes?") == set()  # the first word's capital says nothing


def test_idf_is_high_for_rare_terms_and_next_to_nothing_for_common_ones() -> None:
    assert idf(1, 10_000) > 8 > idf(100, 10_000) > 4
    assert idf(6_000, 10_000) == pytest.approx(1e-6)
