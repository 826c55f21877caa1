"""The *real* retrieval family: multi-session conversations between real people, with questions
written by reading them.

Source: ``chitchat-dataset`` (PyPI, MIT licence; a benchmark/test extra, never a server
dependency): 7,168 real chat conversations with ISO timestamps and sender ids. Conversations
between the same two people are grouped into one *dialogue* (one memory), each conversation a
session (and a ``thread``), in order of their start. A *turn* is one run of messages by one
sender, its texts joined with a space; it is stored as one passage, ``Speaker (2 May 2018): text``
with ``occurred_at`` = the conversation's start. Sender ids are UUIDs: each dialogue gives its two
people made-up first names (fixed per dialogue).

Dialogues used: the pairs of people with the most conversations (at least ``MIN_CONVERSATIONS``),
at most ``MAX_TURNS`` turns each, ordered by conversation count (then by their key); the first
``N_DIALOGUES``. Even ranks are the ``tune`` half, odd ranks the ``held`` half: no held-out
question shares a pair of people with a tuning question.

Questions live in ``data/real_dialogue_questions_tune.json`` and ``…_held.json``: lists of objects
``{"dialogue": KEY, "q": TEXT, "evidence": ["CONV:TURN", ...], "kind": KIND, "need_all": BOOL}``,
where ``CONV`` is the conversation's key in the dataset and ``TURN`` the turn's index in it (as
``show`` prints them), and ``KIND`` is ``single``, ``multi-hop``, ``temporal`` or ``absent``
(never said: ``evidence`` is empty). They were written by reading the conversations, not from
templates.

    python benchmarks/real_dialogue_set.py list          # the dialogues, their half and size
    python benchmarks/real_dialogue_set.py show KEY      # a dialogue's turns with their ids
    python benchmarks/real_dialogue_set.py check         # questions' evidence ids all exist
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

MIN_CONVERSATIONS = 8
MAX_TURNS = 1400
N_DIALOGUES = 24
DATA = Path(__file__).with_name("data")  # real_dialogue_questions_<half>.json
NAMES = [
    "Avery", "Blake", "Carmen", "Dario", "Elena", "Felix", "Gwen", "Hugo", "Iris", "Jasper", "Kira", "Luca",
    "Mona", "Nils", "Olga", "Pablo", "Quinn", "Rhea", "Soren", "Tess", "Umar", "Vera", "Wade", "Ximena",
    "Yara", "Zeke", "Anya", "Bruno", "Cleo", "Dev", "Edda", "Finn", "Gia", "Hector", "Ines", "Joel",
    "Keiko", "Lars", "Maren", "Noor", "Otto", "Pia", "Rafe", "Saskia", "Tomas", "Uma", "Viggo", "Willa",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Turn:
    id: str  # "CONV:TURN"
    session: int  # the conversation's index in its dialogue (0 = first)
    speaker: str
    at: datetime
    text: str

    def passage(self) -> str:
        return f"{self.speaker} ({self.at.day} {self.at:%B %Y}): {self.text}"


@dataclass(slots=True)
class Dialogue:
    key: str
    half: str  # tune | held
    names: tuple[str, str]
    conversations: list[str] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)

    def passages(self) -> list[str]:
        return [t.passage() for t in self.turns]


@functools.cache
def _dataset() -> dict[str, dict]:
    try:
        import chitchat_dataset
    except ImportError as e:
        raise SystemExit("the real family needs `pip install chitchat-dataset` (a test extra)") from e
    path = Path(chitchat_dataset.__file__).with_name("dataset.json")
    return json.loads(path.read_text())


def _pair_key(senders: tuple[str, str]) -> str:
    return hashlib.sha256("|".join(senders).encode()).hexdigest()[:8]


@functools.cache
def dialogues() -> list[Dialogue]:
    data = _dataset()
    pairs: dict[tuple[str, str], list[str]] = {}
    for key, conv in data.items():
        senders = {m["sender"] for turn in conv["messages"] for m in turn}
        if len(senders) == 2:
            pairs.setdefault(tuple(sorted(senders)), []).append(key)  # type: ignore[arg-type]
    ranked = sorted(
        (
            (senders, keys)
            for senders, keys in pairs.items()
            if len(keys) >= MIN_CONVERSATIONS and sum(len(data[k]["messages"]) for k in keys) <= MAX_TURNS
        ),
        key=lambda sk: (-len(sk[1]), _pair_key(sk[0])),
    )[:N_DIALOGUES]
    out = []
    for rank, (senders, keys) in enumerate(ranked):
        names = (NAMES[(2 * rank) % len(NAMES)], NAMES[(2 * rank + 1) % len(NAMES)])
        who = dict(zip(senders, names, strict=True))
        d = Dialogue(_pair_key(senders), "tune" if rank % 2 == 0 else "held", names)
        for session, conv_key in enumerate(sorted(keys, key=lambda k: (data[k]["start"], k))):
            conv = data[conv_key]
            at = datetime.fromisoformat(conv["start"].replace("Z", "+00:00"))
            d.conversations.append(conv_key)
            for i, run in enumerate(conv["messages"]):
                text = " ".join(m["text"].strip() for m in run if m["text"].strip())
                if text:
                    d.turns.append(Turn(f"{conv_key}:{i}", session, who[run[0]["sender"]], at, text))
        out.append(d)
    return out


def questions() -> list[dict]:
    return [
        q
        for path in sorted(DATA.glob("real_dialogue_questions_*.json"))
        for q in json.loads(path.read_text())
    ]


def check() -> list[str]:
    """Problems with the questions file: unknown dialogues or evidence ids, bad kinds."""
    by_key = {d.key: {t.id for t in d.turns} for d in dialogues()}
    problems = []
    for n, q in enumerate(questions()):
        ids = by_key.get(q.get("dialogue"))
        if ids is None:
            problems.append(f"#{n}: unknown dialogue {q.get('dialogue')!r}")
            continue
        if q.get("kind") not in ("single", "multi-hop", "temporal", "absent"):
            problems.append(f"#{n}: kind {q.get('kind')!r}")
        if (q.get("kind") == "absent") != (not q.get("evidence")):
            problems.append(f"#{n}: absent questions (and only they) have no evidence")
        problems += [f"#{n}: no turn {e!r} in {q['dialogue']}" for e in q.get("evidence", []) if e not in ids]
    return problems


def main(argv: list[str]) -> int:
    if not argv or argv[0] == "list":
        counts: dict[str, int] = {}
        for q in questions():
            counts[q["dialogue"]] = counts.get(q["dialogue"], 0) + 1
        for d in dialogues():
            print(
                f"{d.key} {d.half:4} {'/'.join(d.names):14} {len(d.conversations):3} conversations "
                f"{len(d.turns):4} turns {counts.get(d.key, 0):3} questions"
            )
        return 0
    if argv[0] == "show":
        (d,) = [d for d in dialogues() if d.key == argv[1]]
        session = -1
        for t in d.turns:
            if t.session != session:
                session = t.session
                print(f"\n=== session {session} ({t.at:%Y-%m-%d %H:%M}) ===")
            print(f"[{t.id}] {t.passage()}")
        return 0
    if argv[0] == "check":
        problems = check()
        print("\n".join(problems) or f"{len(questions())} questions, all evidence found")
        return 1 if problems else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
