"""The *exact* retrieval family: unique names, ids, numbers and rare words among near-duplicates.

Everything here is generated with fixed seeds (no external data). One corpus of near-identical
facts, the kind that defeats meaning search: 2,000 "``First Last`` keeps a ``colour animal`` in
``City``." facts whose first names, colours, animals and cities repeat (only the surname is
unique; a third of the surnames are random-looking strings such as ``Xhqorvand``), ticket
closures with ids (``INC-48213``), paid invoices with numbers, and sightings of rare words
(``axolotl``), each kind in many near-copies. Questions name the one thing that tells the
answer apart: the surname alone, a question naming the person, the id, the number, the rare
word.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FIRST = [
    "Ana", "Ben", "Chloe", "David", "Elena", "Farid", "Grace", "Hugo", "Irene", "Jonas", "Kira", "Luis",
    "Marta", "Nico", "Olga", "Pavel", "Rosa", "Sami", "Tomas", "Vera",
]  # fmt: skip
REAL_SURNAMES = [
    "Kowalczyk", "Nakamura", "Okonkwo", "Lindqvist", "Petrenko", "Abernathy", "Castellano", "Dufresne",
    "Eriksen", "Fitzgerald", "Gonzaga", "Halvorsen", "Iwasaki", "Jablonski", "Karlsson", "Lombardi",
    "Moreau", "Novak", "Oyelaran", "Papadopoulos", "Quintero", "Rasmussen", "Szabo", "Takahashi",
    "Uchenna", "Villanueva", "Wojcik", "Yilmaz", "Zielinski", "Achebe", "Brennan", "Cerny", "Dimitrov",
    "Esposito", "Fagerlund", "Grabowski", "Hakimi", "Ivanova", "Jovanovic", "Kovacs", "Laurent",
    "Mendoza", "Nieminen", "Olsen", "Pereira", "Rossi", "Sato", "Tanaka", "Urbanek", "Varga",
]  # fmt: skip
COLOURS = ["red", "black", "white", "grey", "brown", "ginger", "golden", "spotted", "striped", "tabby"]
ANIMALS = ["cat", "dog", "rabbit", "parrot", "hamster", "tortoise", "ferret", "canary", "guinea pig", "goat"]
CITIES = [
    "Lyon", "Lille", "Nantes", "Porto", "Turin", "Bilbao", "Graz", "Ghent", "Aarhus", "Malmo", "Brno",
    "Leeds", "Cork", "Basel", "Bergen", "Gdansk", "Split", "Varna", "Tartu", "Kaunas",
]  # fmt: skip
TEAMS = ["platform", "billing", "identity", "search", "mobile", "data", "support", "network"]
OUTCOMES = ["after a config fix", "after a restart", "as a duplicate", "after a rollback", "with a hotfix"]
VENDORS = ["the printing shop", "the cloud provider", "the cleaning company", "the law firm", "the caterer"]
RARE_WORDS = [
    "axolotl", "pangolin", "quokka", "narwhal", "okapi", "tapir", "capybara", "aardvark", "kinkajou",
    "fossa", "numbat", "gharial", "saiga", "dugong", "binturong", "ocelot", "margay", "coati", "serval",
    "tarsier", "theremin", "ocarina", "zither", "didgeridoo", "harmonium", "bouzouki", "sitar", "kalimba",
    "hurdy-gurdy", "shamisen", "astrolabe", "sextant", "abacus", "metronome", "gyroscope", "periscope",
    "kaleidoscope", "hourglass", "sundial", "barometer", "durian", "rambutan", "mangosteen", "kumquat",
    "persimmon", "jackfruit", "lychee", "tamarind", "quince", "loquat",
]  # fmt: skip
SIGHT_PLACES = [
    "at the market",
    "in a museum",
    "at the zoo",
    "in a shop window",
    "at a fair",
    "in a documentary",
]


@dataclass(frozen=True, slots=True)
class ExactQuestion:
    text: str
    answer: int  # index of the fact that answers it
    kind: str  # surname | person | id | number | rare-word


def _random_surname(rng: random.Random) -> str:
    consonants, vowels = "bcdfghjklmnpqrstvwxzy", "aeiou"
    parts = []
    for _ in range(rng.randint(3, 4)):
        parts.append(rng.choice(consonants) + rng.choice(vowels) + rng.choice(consonants + "r"))
    return "".join(parts).capitalize()


def build(
    n_people: int = 2000, n_tickets: int = 300, n_invoices: int = 300, seed: int = 11
) -> tuple[list[str], list[ExactQuestion]]:
    """(facts, questions); about 40 % of the facts get a question, the rest are near-duplicates."""
    rng = random.Random(seed)
    facts: list[str] = []
    questions: list[ExactQuestion] = []
    surnames: list[str] = []
    seen: set[str] = set()
    while len(surnames) < n_people:
        name = rng.choice(REAL_SURNAMES) if len(surnames) < len(REAL_SURNAMES) else ""
        if not name or name in seen:
            name = (
                _random_surname(rng)
                if rng.random() < 0.5
                else rng.choice(REAL_SURNAMES)
                + rng.choice(["ski", "sen", "ova", "elli", "ez", "ard", "ström", "berg", "stein", "ic"])
            )
        if name.lower() in seen or name.lower() in {w.lower() for w in FIRST + CITIES}:
            continue
        seen.add(name.lower())
        surnames.append(name)
    for i, last in enumerate(surnames):
        first, colour, animal, city = (
            rng.choice(FIRST),
            rng.choice(COLOURS),
            rng.choice(ANIMALS),
            rng.choice(CITIES),
        )
        facts.append(f"{first} {last} keeps a {colour} {animal} in {city}.")
        if i % 12 == 0:
            questions.append(ExactQuestion(last, len(facts) - 1, "surname"))
        elif i % 12 == 6:
            ask = rng.choice(
                [
                    f"What animal does {first} {last} keep?",
                    f"Where does {first} {last} live?",
                    f"Which pet belongs to {last}?",
                    f"Tell me about {first} {last}'s {animal}.",
                ]
            )
            questions.append(ExactQuestion(ask, len(facts) - 1, "person"))
    ids: set[str] = set()
    for i in range(n_tickets):
        while (tid := f"{rng.choice(['INC', 'REQ', 'CHG'])}-{rng.randint(10000, 99999)}") in ids:
            pass
        ids.add(tid)
        facts.append(f"Ticket {tid} was closed by the {rng.choice(TEAMS)} team {rng.choice(OUTCOMES)}.")
        if i % 3 == 0:
            ask = rng.choice([tid, f"Who closed ticket {tid}?", f"What happened to {tid}?"])
            questions.append(ExactQuestion(ask, len(facts) - 1, "id"))
    numbers: set[int] = set()
    for i in range(n_invoices):
        while (num := rng.randint(100000, 999999)) in numbers:
            pass
        numbers.add(num)
        amount = rng.randint(2, 90) * 10
        facts.append(f"Invoice {num} from {rng.choice(VENDORS)} for {amount} euros was paid.")
        if i % 3 == 0:
            ask = rng.choice([f"invoice {num}", f"Was invoice {num} paid?", f"How much was invoice {num}?"])
            questions.append(ExactQuestion(ask, len(facts) - 1, "number"))
    for word in RARE_WORDS:
        for j in range(2):  # the word once; a near-copy without it
            first = rng.choice(FIRST)
            if j == 0:
                facts.append(f"{first} saw a {word} {rng.choice(SIGHT_PLACES)} on Sunday.")
                ask = rng.choice([f"Who saw a {word}?", f"{word}", f"Where was the {word} seen?"])
                questions.append(ExactQuestion(ask, len(facts) - 1, "rare-word"))
            else:
                facts.append(f"{first} saw a {rng.choice(ANIMALS)} {rng.choice(SIGHT_PLACES)} on Sunday.")
    return facts, questions
