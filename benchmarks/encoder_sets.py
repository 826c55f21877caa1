"""Three kinds of retrieval input for comparing encoders (bench_encoders.py), generated with fixed seeds.

Each family is a :class:`Family`: passages, and questions with the indices of the passages that
answer them.

* *paraphrase*: paraphrase_set.py's hand-written pairs (the question shares no content word with its
  note) among its template distractors.
* *exact*: unique names, ids, numbers and rare words among near-duplicates — "Ana Kowalczyk keeps a
  red cat in Lyon." beside hundreds of facts of the same shape; the question names the one thing
  that tells them apart ("What pet does Ana Kowalczyk keep?").
* *conversation*: dialogues between two people over dated sessions, one turn per passage as
  ``Speaker (date): text``; events (a pet, a move, a job, a trip, a hobby) are said once among
  small talk, some change later (a second move); questions ask for the turn that says it.

This is the encoder-side yardstick only (meaning-only ranking, no fusion); the retrieval suite of
issue 22 (words only / meaning only / default, held-out halves) is a separate benchmark.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field

from paraphrase_set import PAIRS, distractors


@dataclass
class Family:
    name: str
    passages: list[str] = field(default_factory=list)
    questions: list[tuple[str, set[int]]] = field(default_factory=list)


def paraphrase(n_distractors: int = 600) -> Family:
    fam = Family("paraphrase", [n for n, _ in PAIRS] + distractors(n_distractors))
    fam.questions = [(q, {i}) for i, (_, q) in enumerate(PAIRS)]
    return fam


_FIRST = "Ana Ben Carla Dmitri Elif Farid Greta Hugo Ines Jonas Kira Luca Mila Nils Olga Pavel Rosa Sami Tara Umar".split()
_SYL = "ko wal czyk ber ngu mar ish tel dov ran zek pel ost vin hal brus tam quel sor jit fen gor lub ach".split()
_COLOURS = "red grey black white ginger brown spotted striped".split()
_PETS = "cat dog parrot rabbit tortoise ferret".split()
_CITIES = "Lyon Porto Graz Ghent Turin Brno Aarhus Bilbao Cork Split Tartu Lille".split()
_SERVICES = "billing search auth mail queue cache metrics export".split()
_RARE = "zeolite quokka marimba sphagnum tarragon obsidian kumquat theremin axolotl vellum".split()


def _surname(rng: random.Random) -> str:
    return "".join(rng.choice(_SYL) for _ in range(rng.randint(2, 3))).capitalize()


def exact(n_facts: int = 2000, n_questions: int = 300, seed: int = 11) -> Family:
    """Near-identical facts told apart by one rare token; questions name that token."""
    rng = random.Random(seed)
    fam = Family("exact")
    asks: list[tuple[str, int]] = []
    used: set[str] = set()

    def unique(make) -> str:  # type: ignore[no-untyped-def]
        while (value := make()) in used:
            pass
        used.add(value)
        return value

    for i in range(n_facts):
        kind = i % 4
        city, pet, colour = rng.choice(_CITIES), rng.choice(_PETS), rng.choice(_COLOURS)
        if kind == 0:
            who = unique(lambda: f"{rng.choice(_FIRST)} {_surname(rng)}")
            text, ask = f"{who} keeps a {colour} {pet} in {city}.", f"What pet does {who} keep?"
        elif kind == 1:
            ticket = unique(
                lambda: (
                    f"{rng.choice('ABCDEFGHKMNPRSTX')}{rng.choice('ABCDEFGHKMNPRSTX')}-{rng.randint(1000, 99999)}"
                )
            )
            service = rng.choice(_SERVICES)
            text = f"Ticket {ticket} was closed after the {service} outage in {city}."
            ask = f"Why was ticket {ticket} closed?"
        elif kind == 2:
            room = unique(lambda: str(rng.randint(100, 9999)))
            text = f"Room {room} is booked for the {rng.choice(_SERVICES)} review on Thursday."
            ask = f"What is room {room} booked for?"
        else:
            rare = unique(lambda: f"{rng.choice(_RARE)}-{_surname(rng).lower()}")
            text = f"The {rare} plugin broke the nightly build in {city}."
            ask = f"What did the {rare} plugin break?"
        fam.passages.append(text)
        asks.append((ask, i))
    for ask, i in rng.sample(asks, n_questions):
        fam.questions.append((ask, {i}))
    return fam


# (what is said, the question that asks for it); {p} is the speaker, {x} a slot filled per dialogue
_EVENTS: list[tuple[str, str, list[str]]] = [
    (
        "We adopted a puppy last week, we named him {x}.",
        "What is the name of {p}'s dog?",
        "Biscuit Pepper Ziggy Mochi Bruno Olive".split(),
    ),
    (
        "I started a new job as a {x} at a logistics company.",
        "What job did {p} start?",
        ["data analyst", "nurse", "welder", "translator", "pilot"],
    ),
    ("We finally moved into a flat in {x}.", "Which city did {p} move to?", _CITIES),
    (
        "I signed up for {x} lessons on Tuesday evenings.",
        "What lessons is {p} taking?",
        ["salsa", "pottery", "violin", "climbing", "Italian"],
    ),
    (
        "My sister is getting married in {x} next spring.",
        "Where is {p}'s sister's wedding?",
        ["Seville", "Bergen", "Kyoto", "Quebec", "Naples"],
    ),
    (
        "I broke my {x} playing five-a-side football.",
        "What did {p} injure?",
        ["wrist", "ankle", "collarbone", "little finger"],
    ),
    (
        "We booked a trip to {x} for the summer holidays.",
        "Where is {p} going on holiday?",
        ["Iceland", "Vietnam", "Morocco", "Peru", "Sicily"],
    ),
    (
        "I've been reading {x} every night this month.",
        "Which book is {p} reading?",
        ["Dune", "Middlemarch", "The Hobbit", "Beloved"],
    ),
    (
        "Our landlord put the rent up by {x} percent.",
        "How much did {p}'s rent go up?",
        ["five", "eight", "twelve", "fifteen"],
    ),
    (
        "I sold my old car and bought a {x}.",
        "What did {p} buy after selling the car?",
        ["cargo bike", "scooter", "camper van", "used Volvo"],
    ),
]
_SMALL_TALK = [
    "How was your week?",
    "Not bad, a bit tiring honestly.",
    "That sounds great!",
    "Ha, I know what you mean.",
    "Did you see the weather today?",
    "It rained all afternoon here.",
    "Anyway, how is the family?",
    "Everyone is fine, thanks for asking.",
    "I need more sleep.",
    "Same here, work has been busy.",
    "Let's catch up properly soon.",
    "Sure, maybe next weekend?",
    "Oh nice, tell me more.",
    "I made pasta again for dinner.",
    "We watched a film last night.",
    "Talk soon!",
    "Good luck with it!",
    "That's a lot to deal with.",
    "I'm glad it worked out.",
    "What are you up to this weekend?",
]
_PEOPLE = (
    "Maya Leo Noor Sven Ada Tomas Iris Kofi Lena Rui Hana Omar Zoe Emil Vera Yusuf Alma Bram Cleo Dario "
    "Esme Felix Gala Hamid Ilse Jakub Kaia Lars Mira Nico Oona Piet Quinn Rahel Silas Tove Ugo Vida Wim Xenia"
).split()


def conversation(dialogues: int = 20, sessions: int = 15, turns: int = 20, seed: int = 5) -> Family:
    """Dialogues between two people, one turn per passage; each event is said once (moves twice)."""
    rng = random.Random(seed)
    fam = Family("conversation")
    people = rng.sample(_PEOPLE, 2 * dialogues)  # nobody is in two dialogues: each question has one answer
    for d in range(dialogues):
        a, b = people[2 * d], people[2 * d + 1]
        day = dt.date(2023, 1, 1) + dt.timedelta(days=rng.randint(0, 200))
        said: list[tuple[str, int]] = []  # (question, passage index)
        events = [(rng.choice([a, b]), e) for e in rng.sample(_EVENTS, 8)]
        slots = rng.sample(range(sessions * turns), len(events) + 1)
        moved: dict[str, int] = {}
        for s in range(sessions):
            day += dt.timedelta(days=rng.randint(3, 20))
            for t in range(turns):
                speaker = (a, b)[t % 2]
                k = s * turns + t
                text = rng.choice(_SMALL_TALK)
                if k in slots[:-1]:
                    person, (line, question, fills) = events[slots.index(k)]
                    speaker = person
                    text = line.format(x=rng.choice(fills))
                    said.append((question.format(p=person), len(fam.passages)))
                    if "moved" in line:
                        moved[person] = len(fam.passages)
                elif k == slots[-1] and moved:  # a change: the same person moves again
                    speaker = next(iter(moved))
                    text = f"Big news, we're moving again, this time to {rng.choice(_CITIES)}."
                    said.append((f"Where does {speaker} live now?", len(fam.passages)))
                fam.passages.append(f"{speaker} ({day.isoformat()}): {text}")
        fam.questions += [(q, {i}) for q, i in said]
    return fam
