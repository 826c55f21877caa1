"""fulltext.py: the terms a query is ranked by."""

from __future__ import annotations

import pytest

from kernmind.memory.fulltext import content_terms, idf, query_terms, widespread, without_terms

pytestmark = pytest.mark.sqlite_only("pure functions: no database involved")


def test_stop_words_are_left_out_unless_nothing_else_is_left() -> None:
    assert content_terms(query_terms("What did Maya name the beagle?")) == ["maya", "name", "beagle"]
    assert content_terms(query_terms("Who is it?")) == ["who", "is", "it"]


def test_idf_is_high_for_rare_terms_and_next_to_nothing_for_common_ones() -> None:
    assert idf(1, 10_000) > 8 > idf(100, 10_000) > 4
    assert idf(6_000, 10_000) == pytest.approx(1e-6)


def test_idf_of_counts_read_at_different_moments_is_a_number_not_an_error() -> None:
    """More texts with the term than texts in all (a write between the two counts) ranks like a
    term in every text."""
    assert idf(12, 10) == idf(10, 10) == pytest.approx(1e-6)


def test_a_term_in_a_twentieth_of_the_texts_and_twenty_of_them_is_widespread() -> None:
    assert widespread(20, 400) and widespread(5_000, 100_000)
    assert not widespread(19, 400)  # too few texts to say
    assert not widespread(30, 1_000) and not widespread(4_999, 100_000)  # a small share of them
    assert not widespread(15, 30)  # half of a small memory: 20 texts at least


def test_taking_terms_out_of_a_query_keeps_its_other_words() -> None:
    assert without_terms("Did Leo get a tattoo?", ["leo"]) == "Did get a tattoo?"
    assert without_terms("What is Maya's pet called?", ["maya"]) == "What is 's pet called?"
    assert without_terms("Leo and LEO and Leonard", ["leo"]) == "and and Leonard"
    assert without_terms("nothing to take", []) == "nothing to take"
