"""fusion.py on its own: the rule (scores in [0, 1], what matched), neighbours, the thread prior,
the named time first, and what is left out."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kernmind.memory.fusion import DEFAULT, FUSION, Fusion, fuse, fusion_for

pytestmark = pytest.mark.sqlite_only("pure functions: no database involved")

F = Fusion(floor=0.2, ceiling=0.7)


def test_scores_are_between_0_and_1_best_first_and_say_what_matched() -> None:
    rng = random.Random(3)
    for _ in range(200):
        words = {i: rng.random() for i in range(0, 40, 2)}
        cosines = {i: rng.uniform(-0.2, 1.0) for i in range(0, 40, 3)}
        threads = {i: rng.randrange(4) for i in range(0, 40) if rng.random() < 0.5}
        before = {i: rng.random() for i in threads if rng.random() < 0.5}
        out = fuse(words, cosines, F, before=before, threads=threads)
        assert all(0.0 <= s.score <= 1.0 for s in out)
        assert [s.score for s in out] == sorted((s.score for s in out), reverse=True)
        for s in out:
            has_words = words.get(s.id, 0) > 0 or before.get(s.id, 0) > 0
            close = cosines.get(s.id, -1) > F.floor
            assert (
                s.match
                == {(True, True): "both", (True, False): "words", (False, True): "meaning"}[
                    (has_words, close)
                ]
            )


def test_the_rule_is_a_weighted_sum_of_the_words_share_and_calibrated_meaning() -> None:
    [one] = fuse({1: 0.5}, {1: 0.45}, F)
    meaning = (0.45 - F.floor) / (F.ceiling - F.floor)
    assert one.score == pytest.approx(F.words_weight * 0.5 + (1 - F.words_weight) * meaning, abs=1e-4)
    assert fuse({1: 1.0}, {1: 0.9}, F)[0].score == 1.0  # every word and a paraphrase


def test_a_candidate_scoring_below_the_cutoff_is_left_out() -> None:
    out = fuse({1: 0.3}, {1: 0.1, 2: 0.05, 3: 0.3}, F)
    assert [s.id for s in out] == [1, 3]  # 2: no word, meaning at or below the floor
    assert out[0].match == "words" and out[1].match == "meaning"
    assert fuse({1: 0.15}, {3: 0.25}, F) == []  # 0.06 and 0.06: below the cut-off (0.08)


def test_a_text_close_only_to_the_speakers_name_is_no_match() -> None:
    """'Did Leo get a tattoo?' in a conversation where every other turn is Leo's: small talk looks close
    to the question as asked (the name), not to its focus ("Did get a tattoo?"), and is left out; a
    turn about the question is close to both and stays."""
    cosines = {1: 0.55, 2: 0.62}  # 1: "Leo: Wait, seriously?"  2: "Leo: I got a tattoo of a whale."
    focus = {1: 0.2, 2: 0.5}
    assert [s.id for s in fuse({}, cosines, F, focus=focus)] == [2]
    assert [s.id for s in fuse({}, cosines, F)] == [2, 1]  # without the focus both would match


def test_a_passage_holding_what_was_asked_scores_clearly_above_one_that_does_not() -> None:
    """The rule docs/tools.md names: all of the question's words, or a paraphrase, reaches at least
    the words weight or the meaning weight; a passage sharing one incidental word of four and only
    the topic's vocabulary stays well below."""
    holds = fuse({1: 1.0}, {1: 0.45}, F)[0].score
    paraphrase = fuse({}, {1: 0.7}, F)[0].score
    near = fuse({2: 0.25}, {2: 0.3}, F)[0].score
    assert holds >= 0.5 and paraphrase >= 0.5 and near < 0.25


def test_a_reply_is_read_with_the_turn_before_it() -> None:
    """'How was the trip to Lisbon?' — 'Amazing, the kids loved it' holds none of its words; the
    turn before ('We just got back from Lisbon') does. Read with its neighbour the reply is a words
    match too, and ranks above an unrelated turn that is as close in meaning."""
    words = {10: 1.0}
    cosines = {10: 0.4, 11: 0.35, 30: 0.36}
    without = fuse(words, cosines, F)
    assert [s.id for s in without][1:] == [30, 11]
    read = fuse(words, cosines, F, before={11: 1.0}, threads={10: "t", 11: "t"})
    assert [s.id for s in read][:2] == [10, 11] and read[1].match == "both"
    assert [
        s.id for s in fuse(words, cosines, replace(F, neighbour=0.0, thread_weight=0.0), before={11: 1.0})
    ][1:] == [30, 11]


def test_the_thread_prior_lifts_the_texts_of_a_thread_holding_the_best_hit() -> None:
    """Turns 1-3 are one conversation about the question (1 the best hit); 7 is as good a match as 2
    alone, in a conversation that holds nothing else about it. The best text keeps its score and its
    place; the conversation's other turns rank above the lone one."""
    cosines = {1: 0.65, 2: 0.45, 3: 0.42, 7: 0.46}
    threads = {1: "a", 2: "a", 3: "a", 7: "b"}
    plain = fuse({}, cosines, replace(F, thread_weight=0.0), threads=threads)
    assert [s.id for s in plain] == [1, 7, 2, 3]
    out = fuse({}, cosines, F, threads=threads)
    assert [s.id for s in out] == [1, 2, 3, 7]
    assert out[0].score == plain[0].score  # the best text of a thread keeps its score
    assert {s.id: s.score for s in out}[7] == {s.id: s.score for s in plain}[7]  # alone in its thread


def test_texts_without_a_thread_rank_as_without_the_prior() -> None:
    cosines = {1: 0.65, 2: 0.45, 3: 0.42, 7: 0.46}
    assert fuse({}, cosines, F) == fuse({}, cosines, replace(F, thread_weight=0.0))


def test_a_named_time_ranks_every_text_inside_it_above_every_text_outside() -> None:
    """'What did we decide in March?': 1 and 2 are from March, 3 (a day after it) and 4 (a month
    before) are better matches otherwise; inside comes first, then the closer in time."""
    cosines = {1: 0.3, 2: 0.25, 3: 0.69, 4: 0.68}
    fit = {1: 1.0, 2: 1.0, 3: 0.97, 4: 0.5}
    out = fuse({}, cosines, F, fit=fit)
    assert [s.id for s in out] == [1, 2, 3, 4]
    assert out[1].score > out[2].score


def test_a_text_inside_the_named_time_is_a_match_on_its_own() -> None:
    out = fuse({}, {1: 0.1, 2: 0.1}, F, fit={1: 1.0, 2: 0.4})  # both below the cut-off
    assert [s.id for s in out] == [1]


@pytest.mark.parametrize("model", [*FUSION, "some-endpoint-model"])
def test_every_model_has_parameters_in_range(model: str) -> None:
    f = fusion_for(model)
    assert f is FUSION.get(model, DEFAULT)
    assert 0 < f.words_weight < 1 and f.floor < f.ceiling
    assert 0 <= f.focus_weight <= 1 and 0 <= f.neighbour <= 1 and 0 <= f.thread_weight and 0 <= f.cutoff < 1


def test_meaning_weighs_the_focus_by_focus_weight() -> None:
    cosines, focus = {1: 0.7, 2: 0.5}, {1: 0.3, 2: 0.6}
    by_asked = fuse({}, cosines, replace(F, focus_weight=0.0, cutoff=0.0), focus=focus)
    by_focus = fuse({}, cosines, replace(F, focus_weight=1.0, cutoff=0.0), focus=focus)
    assert [s.id for s in by_asked] == [1, 2] and [s.id for s in by_focus] == [2, 1]
    mixed = fuse({}, {1: 0.7}, replace(F, focus_weight=0.5, cutoff=0.0), focus={1: 0.3})
    assert mixed[0].score == pytest.approx((1 - F.words_weight) * (0.5 - F.floor) / (F.ceiling - F.floor))
