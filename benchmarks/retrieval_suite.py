"""The four families of the retrieval benchmark as corpora and questions (bench_retrieval.py runs them).

* ``paraphrase``: paraphrase_set.py's hand-written pairs and generated pairs (questions that
  share no content word with their note) among distractor notes on the same themes;
* ``exact``: exact_set.py's unique names, ids, numbers and rare words among near-duplicates;
* ``conversations``: dialogue_set.py's multi-session dialogues, one corpus (one memory) per
  dialogue, a turn per passage, stored with the session's time as the passage's time;
* ``real``: real_dialogue_set.py's real multi-session chats between the same two people
  (chitchat-dataset, a test extra), one corpus per pair of people, a turn per passage with the
  conversation's start as its time and the conversation as its session and its ``thread``;
  questions written by reading them (``data/real_dialogue_questions_{tune,held}.json``). The
  halves are split by pair of people (real_dialogue_set.py). This family decides the defaults;
  the generated ones are regression checks.

Every question belongs to the ``tune`` half or the ``held`` half: fusion parameters are chosen
on ``tune`` only and figures are reported on ``held``. Pairs and facts alternate between the
halves; dialogues are split whole (the first half of them tune), so no held-out question
shares a dialogue with a tuning question.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dialogue_set
import exact_set
import paraphrase_set

# kinds of questions about things never said: the right answer is no result. ("absent-other", asking one
# speaker about what only the other did, is about something said: reported on its own.)
NEVER_SAID = ("absent", "absent/topic")  # the real family's never-said kind is "absent"


@dataclass(slots=True)
class Corpus:
    texts: list[str]
    times: list[float] | None = None  # epoch seconds per text (None: stored now)
    sessions: list[int] | None = None  # conversations: each turn's session
    threads: list[str] | None = None  # each text's thread (stored with it where the store has threads)


@dataclass(frozen=True, slots=True)
class Question:
    corpus: int
    text: str
    evidence: tuple[int, ...]  # indices into the corpus's texts; empty: nothing answers it
    kind: str
    half: str  # tune | held
    need_all: bool = False  # multi-hop: every evidence text is needed (recall is the share found)


@dataclass(slots=True)
class Family:
    name: str
    corpora: list[Corpus]
    questions: list[Question] = field(default_factory=list)


def paraphrase(quick: bool = False) -> Family:
    pairs = paraphrase_set.PAIRS + paraphrase_set.generated_pairs(per_template=16 if quick else 64)
    overlap = [(q, shared) for n, q in pairs if (shared := paraphrase_set.shared_content_words(n, q))]
    if overlap:
        raise SystemExit(f"paraphrase questions sharing content words with their note: {overlap}")
    notes = [n for n, _ in pairs]
    corpus = Corpus(notes + paraphrase_set.distractors(200 if quick else 600))
    kinds = ["hand-written"] * len(paraphrase_set.PAIRS) + ["generated"] * (
        len(pairs) - len(paraphrase_set.PAIRS)
    )
    questions = [
        Question(0, q, (i,), kinds[i], "tune" if i % 2 == 0 else "held") for i, (_, q) in enumerate(pairs)
    ]
    return Family("paraphrase", [corpus], questions)


def exact(quick: bool = False) -> Family:
    if quick:
        facts, asked = exact_set.build(n_people=600, n_tickets=100, n_invoices=100)
    else:
        facts, asked = exact_set.build()
    seen: dict[str, int] = {}  # alternate within each kind, so both halves hold every kind
    questions = []
    for q in asked:
        seen[q.kind] = seen.get(q.kind, -1) + 1
        questions.append(
            Question(0, q.text, (q.answer,), q.kind, "tune" if seen[q.kind] % 2 == 0 else "held")
        )
    return Family("exact", [Corpus(facts)], questions)


def conversations(quick: bool = False) -> Family:
    dialogues = dialogue_set.build(4 if quick else 20)
    family = Family("conversations", [])
    for d_index, d in enumerate(dialogues):
        half = "tune" if d_index < len(dialogues) // 2 else "held"
        family.corpora.append(
            Corpus(d.passages(), [t.at.timestamp() for t in d.turns], [t.session for t in d.turns])
        )
        for q in d.questions:
            kind = f"{q.kind}/{q.overlap}" if q.overlap else q.kind
            family.questions.append(Question(d_index, q.text, q.evidence, kind, half, q.need_all))
    return family


def real(quick: bool = False) -> Family:
    """The real dialogues that have questions (quick: the first two of each half)."""
    import real_dialogue_set

    asked: dict[str, list[dict]] = {}
    for q in real_dialogue_set.questions():
        asked.setdefault(q["dialogue"], []).append(q)
    family = Family("real", [])
    taken = {"tune": 0, "held": 0}
    for d in real_dialogue_set.dialogues():
        if d.key not in asked or (quick and taken[d.half] >= 2):
            continue
        taken[d.half] += 1
        index = {t.id: i for i, t in enumerate(d.turns)}
        c_index = len(family.corpora)
        family.corpora.append(
            Corpus(
                d.passages(),
                [t.at.timestamp() for t in d.turns],
                [t.session for t in d.turns],
                [f"{d.key}/{t.session}" for t in d.turns],
            )
        )
        for q in asked[d.key]:
            evidence = tuple(index[e] for e in q.get("evidence", []) if e in index)
            kind = q.get("kind", "single")
            family.questions.append(
                Question(
                    c_index, q["q"], evidence, kind, d.half, bool(q.get("need_all")) and len(evidence) > 1
                )
            )
    return family


FAMILIES = {"paraphrase": paraphrase, "exact": exact, "conversations": conversations, "real": real}
