"""fusion.py on its own: scores in [0, 1], what matched, rare terms, the no-match cut-off."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kernmind.memory.database import TermStat
from kernmind.memory.fusion import DEFAULT, FUSION, Fusion, fuse, fusion_for, rare_shares

pytestmark = pytest.mark.sqlite_only("pure functions: no database involved")

F = Fusion(
    words_weight=0.35, words_power=2.0, floor=0.2, ceiling=0.7, cutoff=0.1, rare_docs=2, rare_share=0.25
)


def test_scores_are_between_0_and_1_best_first_and_say_what_matched() -> None:
    rng = random.Random(3)
    for _ in range(200):
        words = {i: rng.random() for i in range(0, 40, 2)}
        cosines = {i: rng.uniform(-0.2, 1.0) for i in range(0, 40, 3)}
        out = fuse(words, cosines, {}, F)
        assert all(0.0 <= s.score <= 1.0 for s in out)
        assert [s.score for s in out] == sorted((s.score for s in out), reverse=True)
        for s in out:
            has_words = words.get(s.id, 0) > 0
            close = cosines.get(s.id, -1) > F.floor
            assert (
                s.match
                == {(True, True): "both", (True, False): "words", (False, True): "meaning"}[
                    (has_words, close)
                ]
            )


def test_a_perfect_match_scores_1_and_nothing_related_is_no_match() -> None:
    out = fuse({1: 1.0}, {1: 0.9, 2: 0.05, 3: 0.21}, {}, F)
    assert out[0].id == 1 and out[0].score == 1.0 and out[0].match == "both"
    assert [s.id for s in out] == [1]  # 2 is unrelated; 3 barely related: below the cut-off


def test_the_only_text_holding_a_rare_term_ranks_above_every_meaning_only_hit() -> None:
    """'Kowalczyk' among near-duplicates: the one fact holding the surname (a weak meaning match)
    must beat facts that are close in meaning but hold no word of the query."""
    terms = [TermStat("kowalczyk", 1, 0.8, (7,)), TermStat("cat", 900, 0.2, None)]
    words = {7: 0.8, 8: 0.2}
    cosines = {7: 0.3, 8: 0.35, 9: 0.69, 10: 0.68}
    out = fuse(words, cosines, rare_shares(terms, F, {"kowalczyk"}), F)
    assert out[0].id == 7
    assert fuse(words, cosines, {}, F)[0].id == 9  # without the protection it would lose


def test_an_incidental_rare_word_does_not_protect_a_text() -> None:
    """'Who avoids planes?': 'avoids' occurs once, in a note about meat; it is no name, id or number
    and not most of the query, so the note about a fear of flying stays first."""
    terms = [TermStat("avoids", 1, 0.46, (5,)), TermStat("planes", 0, 0.54, None)]
    out = fuse({5: 0.47}, {5: 0.35, 6: 0.46}, rare_shares(terms, F, set()), F)
    assert out[0].id == 6
    assert rare_shares(terms, F, {"avoids"}) == {5: 0.46}  # written like a name, it would count


def test_a_rare_name_does_not_protect_a_text_meaning_calls_unrelated() -> None:
    """Unless the rare term is most of the query: 'Who cannot eat Brie?' where 'Brie' is a colleague's
    name once and the note is about something else entirely."""
    terms = [TermStat("brie", 1, 0.3, (5,)), TermStat("eat", 40, 0.3, None), TermStat("cannot", 0, 0.4, None)]
    out = fuse({5: 0.3}, {5: 0.17, 6: 0.48}, rare_shares(terms, F, {"brie"}), F)
    assert out[0].id == 6
    alone = [TermStat("brie", 1, 0.9, (5,)), TermStat("eat", 40, 0.1, None)]
    assert fuse({5: 0.9}, {5: 0.17, 6: 0.48}, rare_shares(alone, F, set()), F)[0].id == 5


def test_rare_terms_count_only_up_to_the_models_limit() -> None:
    terms = [TermStat("ana", 3, 0.5, (1, 2, 3)), TermStat("lyon", 1, 0.3, (4,))]
    names = {"ana", "lyon"}
    assert rare_shares(terms, F, names) == {4: 0.3}  # 'ana' is in 3 texts, more than rare_docs = 2
    assert rare_shares(terms, replace(F, rare_docs=3), names) == {1: 0.5, 2: 0.5, 3: 0.5, 4: 0.3}


@pytest.mark.parametrize("model", [*FUSION, "some-endpoint-model"])
def test_every_model_has_parameters_in_range(model: str) -> None:
    f = fusion_for(model)
    assert f is FUSION.get(model, DEFAULT)
    assert 0 < f.words_weight < 1 and f.words_power >= 1 and f.floor < f.ceiling and 0 <= f.cutoff < 1


def test_a_text_close_only_to_the_speakers_name_is_no_match() -> None:
    """'Did Leo get a tattoo?' in a conversation where every other turn is Leo's: small talk looks close
    to the question as asked (the name), not to its focus ("Did get a tattoo?"), and is left out; a
    turn about the question is close to both and stays."""
    f = replace(F, focus_weight=0.4)
    cosines = {1: 0.55, 2: 0.62}  # 1: "Leo: Wait, seriously?"  2: "Leo: I got a tattoo of a whale."
    focus = {1: 0.12, 2: 0.5}
    assert [s.id for s in fuse({}, cosines, {}, f, focus=focus)] == [2]
    assert [s.id for s in fuse({}, cosines, {}, f)] == [2, 1]  # without the focus both would match


def test_meaning_weighs_the_focus_by_focus_weight() -> None:
    cosines, focus = {1: 0.7, 2: 0.5}, {1: 0.3, 2: 0.6}
    by_asked = fuse({}, cosines, {}, replace(F, focus_weight=0.0, cutoff=0.0), focus=focus)
    by_focus = fuse({}, cosines, {}, replace(F, focus_weight=1.0, cutoff=0.0), focus=focus)
    assert [s.id for s in by_asked] == [1, 2] and [s.id for s in by_focus] == [2, 1]
    mixed = fuse({}, {1: 0.7}, {}, replace(F, focus_weight=0.5, cutoff=0.0), focus={1: 0.3})
    assert mixed[0].score == pytest.approx((1 - F.words_weight) * (0.5 - F.floor) / (F.ceiling - F.floor))


def test_a_question_naming_something_no_text_holds_needs_a_clear_match() -> None:
    """'What's for dinner on Mars?': no text holds 'mars', so a note that is only somewhat close in
    meaning is no match; 'When is the Volvo getting winter tyres?' still finds the note about the car's
    tyres, which is clearly about it."""
    f = replace(F, cutoff_absent=0.3)
    assert [s.id for s in fuse({}, {1: 0.3}, {}, f)] == [1]  # without a name missing: a weak match
    assert fuse({}, {1: 0.3}, {}, f, absent=True) == []
    assert [s.id for s in fuse({}, {1: 0.68}, {}, f, absent=True)] == [1]
    assert [s.id for s in fuse({}, {1: 0.3}, {}, replace(F, cutoff_absent=None), absent=True)] == [1]
