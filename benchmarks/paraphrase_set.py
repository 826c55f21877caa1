"""A paraphrase recall set for archival memory: notes, questions that share no content word with
their note, and distractor notes on the same themes.

``PAIRS`` are (note, question) written by hand; :func:`generated_pairs` adds a few hundred more,
made with a fixed seed from templates whose slots are filled with (note word, question paraphrase)
pairs (a city and its country, a job and a description of it, …): each question names two
attributes of its note in other words, and every other note of the same template shares one of
them at most, so a question is answered by one note only. ``distractors()`` builds deterministic notes from
templates on the same themes (pets, health, family, travel, colleagues, infrastructure, food,
hobbies, home, money, learning), so a question's words and topic appear in many notes that do not
answer it. ``shared_content_words`` is the check that a question really shares no content word
(compared on a 5-letter stem) with its note; the benchmark refuses a set where one does.
"""

from __future__ import annotations

import random
import re

PAIRS: list[tuple[str, str]] = [
    ("Maria adopted a puppy from the shelter last weekend.", "Who got a new dog?"),
    ("Tom tore a ligament in his knee during the football match.", "Which person had a sports injury?"),
    (
        "Joana's parents live in Lisbon and she visits them every summer.",
        "Which colleague has family in Portugal?",
    ),
    (
        "The staging database moved to the db2 host on Tuesday.",
        "Where does the test environment's SQL server run now?",
    ),
    ("Ahmed is allergic to peanuts.", "Who cannot eat nuts?"),
    ("Our cat Whiskers needs her thyroid pills twice a day.", "Which pet takes medication?"),
    ("Priya ran the Berlin marathon in under four hours.", "Who completed a long-distance race?"),
    ("The quarterly budget review was moved to Thursday afternoon.", "When is the finance meeting now?"),
    ("Lena is learning Japanese before her trip to Kyoto.", "Who is studying a foreign language for travel?"),
    (
        "The office coffee machine broke and a new one arrives Monday.",
        "When will the espresso maker be replaced?",
    ),
    ("Carlos prefers vegetarian meals and avoids meat entirely.", "Who does not eat animal products?"),
    (
        "The production cluster runs on twelve servers in Frankfurt.",
        "How many machines host the live system?",
    ),
    ("Sofia's daughter starts kindergarten in September.", "Whose child begins school in autumn?"),
    ("Backups are copied to cold storage every night at 2 am.", "How often are archives saved offsite?"),
    ("Kenji plays the cello in a community orchestra.", "Who is a musician?"),
    (
        "The user wants reports formatted as bullet points, not prose.",
        "What layout does the person like for summaries?",
    ),
    ("Anna bought a house with a big garden near the river.", "Who purchased property recently?"),
    ("Our landlord raised the rent by ten percent.", "Did housing costs go up?"),
    ("David broke his wrist while skiing in Austria.", "Who hurt an arm on a winter holiday?"),
    (
        "The API gateway rejects requests larger than ten megabytes.",
        "What is the upload size cap on the web entry point?",
    ),
    ("Fatima is expecting twins in March.", "Who is pregnant?"),
    (
        "The team switched from Jenkins to GitHub Actions for builds.",
        "Which continuous integration tool do we use now?",
    ),
    ("Olga grows tomatoes and basil on her balcony.", "Who gardens at home?"),
    (
        "Marco's flight to Tokyo was cancelled because of a typhoon.",
        "Whose trip to Japan was disrupted by weather?",
    ),
    ("The user is colour-blind and cannot tell red from green.", "Does the person have any vision issue?"),
    ("Emma got promoted to engineering manager.", "Who received a career advancement?"),
    ("The monthly electricity bill doubled after the heat pump was installed.", "Why did power costs rise?"),
    ("Raj takes the train to work because he does not drive.", "How does he commute?"),
    (
        "Our Postgres instance has sixty-four gigabytes of RAM.",
        "How much memory does the relational database have?",
    ),
    ("Hannah volunteers at the food bank on Saturdays.", "Who does charity work on weekends?"),
    ("The wifi password was changed to a longer passphrase.", "Was the wireless network credential updated?"),
    ("Lucas is afraid of flying and prefers ferries.", "Who avoids planes?"),
    ("The invoice from the cloud provider is due on the fifth.", "When must we pay for hosting?"),
    ("Mei's grandmother turned one hundred last month.", "Whose relative reached a century?"),
    ("Peter runs a small bakery that sells sourdough bread.", "Who owns a shop making loaves?"),
    ("The user sleeps badly and wakes up at 4 am most nights.", "Does the person have insomnia?"),
    ("Nadia speaks Arabic, French and English fluently.", "Who is multilingual?"),
    ("The old laptop's battery swells and must be recycled.", "Which computer has a dangerous power cell?"),
    ("Jonas quit smoking three months ago.", "Who gave up cigarettes?"),
    (
        "We rotate the TLS certificates every ninety days.",
        "How often are the encryption credentials renewed?",
    ),
    ("Isabel's horse won a ribbon at the county show.", "Whose animal earned a prize?"),
    ("Sam is saving money to buy an electric car next year.", "Who plans to purchase a battery vehicle?"),
    ("The kitchen tap leaks, and a plumber comes on Friday.", "When will the faucet be repaired?"),
    ("Grace teaches maths at the local secondary school.", "Who is an educator?"),
    (
        "Our logs are kept for thirty days and then deleted.",
        "What is the retention period for event records?",
    ),
    ("Victor moved from Madrid to Oslo for a new job.", "Who relocated to Norway?"),
    ("The user dislikes emojis in replies.", "Should answers avoid pictograms?"),
    ("Chloe's son was diagnosed with asthma.", "Whose kid has a breathing condition?"),
]

_NAMES = [
    "Alice", "Ben", "Clara", "Dmitri", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jakob", "Keiko", "Liam",
    "Mira", "Nils", "Omar", "Paula", "Quentin", "Rosa", "Stefan", "Tara", "Umar", "Vera", "Wim", "Yara", "Zoe",
]  # fmt: skip
_CITIES = [
    "Paris",
    "Rome",
    "Vienna",
    "Prague",
    "Dublin",
    "Boston",
    "Denver",
    "Seoul",
    "Lima",
    "Cairo",
    "Perth",
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_TEMPLATES = [
    "{name} walked the neighbour's {animal} in the park on {day}.",
    "{name} bought a new collar for the {animal}.",
    "The vet said {name}'s {animal} is healthy and a bit overweight.",
    "{name} went to the gym three times this week.",
    "{name} prefers swimming to running because of the noise.",
    "{name} had a dentist appointment on {day}.",
    "{name}'s brother lives in {city} and works as a nurse.",
    "{name} called their cousin in {city} for a birthday.",
    "{name} flew to {city} for a conference on {day}.",
    "{name} booked a hotel in {city} for the spring holiday.",
    "The train to {city} was delayed by forty minutes.",
    "{name} reviewed the pull request about the login page.",
    "{name} is on call for the payments service this week.",
    "The {service} service was restarted after a memory leak.",
    "Disk usage on the {service} host reached eighty percent.",
    "The {service} deployment was rolled back on {day}.",
    "{name} cooked lentil soup for the team lunch.",
    "{name} ordered pizza for the Friday demo.",
    "The canteen serves fish every {day}.",
    "{name} started painting watercolours in the evening.",
    "{name} joined a chess club in {city}.",
    "{name} reads science fiction before bed.",
    "The heating in {name}'s flat was serviced on {day}.",
    "{name} repainted the living room a pale blue.",
    "{name} opened a savings account with a new bank.",
    "{name} paid the car insurance for the year.",
    "{name} signed up for an online statistics course.",
    "{name} passed the driving test on the second attempt.",
    "The meeting about the office move is on {day}.",
    "{name} asked for shorter answers with code examples.",
    "{name} likes tea with lemon in the morning.",
    "{name} is allergic to cat hair.",
    "The {service} dashboard shows response times per region.",
    "{name} recommended a podcast about history.",
]
_ANIMALS = ["dog", "cat", "rabbit", "parrot", "hamster", "goldfish"]
_SERVICES = ["search", "billing", "auth", "metrics", "mail", "queue", "cache"]

_STOP = set(
    "a an the is are was were be been to of in on at for by with from and or but not no do does did "
    "who what which when where why how whose has have had it its this that these those there their they "
    "he she his her him we our us you your i my me any now new get got as than then so if into after "
    "before up down out over under about same should must can cannot will would s".split()
)


def distractors(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        text = rng.choice(_TEMPLATES).format(
            name=rng.choice(_NAMES),
            city=rng.choice(_CITIES),
            day=rng.choice(_DAYS),
            animal=rng.choice(_ANIMALS),
            service=rng.choice(_SERVICES),
        )
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def content_stems(text: str) -> set[str]:
    return {w.lower()[:5] for w in re.findall(r"[A-Za-z]+", text) if w.lower() not in _STOP}


def shared_content_words(note: str, question: str) -> set[str]:
    return content_stems(note) & content_stems(question)


# (word in the note, its paraphrase in the question): no 5-letter stem in common (checked by the benchmark)
CITY_COUNTRY = [
    ("Lisbon", "Portugal"), ("Kyoto", "Japan"), ("Oslo", "Norway"), ("Nairobi", "Kenya"), ("Lima", "Peru"),
    ("Hanoi", "Vietnam"), ("Krakow", "Poland"), ("Dublin", "Ireland"), ("Athens", "Greece"),
    ("Cairo", "Egypt"), ("Istanbul", "Turkey"), ("Toronto", "Canada"), ("Melbourne", "Australia"),
    ("Seoul", "Korea"), ("Mumbai", "India"), ("Bogota", "Colombia"), ("Santiago", "Chile"),
    ("Havana", "Cuba"), ("Helsinki", "Finland"), ("Reykjavik", "Iceland"), ("Zurich", "Switzerland"),
    ("Budapest", "Hungary"), ("Bucharest", "Romania"), ("Marrakesh", "Morocco"), ("Accra", "Ghana"),
    ("Lagos", "Nigeria"), ("Manila", "the Philippines"), ("Jakarta", "Indonesia"), ("Bangkok", "Thailand"),
    ("Montevideo", "Uruguay"), ("Auckland", "New Zealand"), ("Edinburgh", "Scotland"),
    ("Copenhagen", "Denmark"), ("Stockholm", "Sweden"), ("Tallinn", "Estonia"), ("Riga", "Latvia"),
]  # fmt: skip
JOBS = [
    ("dentist", "tooth doctor"), ("plumber", "pipe fitter"), ("pilot", "airline captain"),
    ("baker", "bread maker"), ("nurse", "hospital carer"), ("lawyer", "attorney"),
    ("architect", "building designer"), ("chef", "restaurant cook"), ("journalist", "reporter"),
    ("veterinarian", "animal doctor"), ("electrician", "wiring technician"), ("carpenter", "woodworker"),
    ("accountant", "bookkeeper"), ("translator", "interpreter"), ("surgeon", "doctor who operates"),
    ("mechanic", "car repairer"), ("photographer", "camera professional"), ("programmer", "software developer"),
    ("firefighter", "fireman"), ("librarian", "book lender"), ("pharmacist", "chemist"),
    ("gardener", "landscaper"), ("economist", "expert on markets"), ("midwife", "birth assistant"),
]  # fmt: skip
SPORTS = [
    ("surfing", "riding waves"), ("skiing", "going down snowy slopes"), ("climbing", "scaling rock walls"),
    ("cycling", "riding a bike"), ("rowing", "paddling a boat"), ("fencing", "sword fighting"),
    ("boxing", "throwing punches in a ring"), ("sailing", "crewing a yacht"), ("diving", "exploring underwater"),
    ("archery", "shooting arrows"), ("judo", "a martial art"), ("golf", "hitting balls on a course"),
    ("tennis", "racket games"), ("yoga", "stretching poses"), ("swimming", "doing laps in a pool"),
    ("skating", "gliding on ice"),
]  # fmt: skip
RELATIVES = [
    ("grandmother", "granny"), ("uncle", "father's brother"), ("aunt", "mother's sister"),
    ("nephew", "sibling's son"), ("niece", "sibling's daughter"), ("cousin", "extended family"),
    ("husband", "spouse"), ("wife", "spouse"), ("stepson", "partner's child"), ("brother", "sibling"),
    ("sister", "sibling"), ("parents", "mum and dad"),
]  # fmt: skip
WHEN = [
    ("in January", "at the start of the year"), ("in December", "around Christmas"),
    ("in July", "in the summer"), ("on their birthday", "when they turned a year older"),
    ("at Easter", "during the spring holidays"), ("last weekend", "a few days ago"),
]  # fmt: skip
GOODS = [
    ("a cello", "a string instrument"), ("a motorbike", "a two-wheeled vehicle"), ("a kayak", "a small boat"),
    ("a telescope", "stargazing equipment"), ("an espresso machine", "a coffee maker"),
    ("a sewing machine", "tailoring equipment"), ("a drone", "a flying camera"), ("a piano", "a keyboard instrument"),
    ("a tent", "camping gear"), ("a lawnmower", "a grass cutter"), ("a treadmill", "a running machine"),
    ("a microscope", "lab equipment"), ("a van", "a delivery vehicle"), ("a fridge", "a refrigerator"),
    ("an aquarium", "a fish tank"), ("a saxophone", "a brass instrument"),
]  # fmt: skip
PEOPLE = [
    "Amara", "Bruno", "Celia", "Dario", "Esme", "Felix", "Gita", "Henrik", "Imani", "Jorge", "Kasia", "Lars",
    "Malik", "Noor", "Oscar", "Pilar", "Rafael", "Saanvi", "Teodor", "Ulla", "Viktor", "Wanda", "Xavi", "Yusuf",
]  # fmt: skip
# (note template, question template): {a}/{b} are the note's words, {A}/{B} their paraphrases
GENERATED = [
    ("{name} moved to {a} to work as a {b}.", "Which {B} relocated to {A}?", CITY_COUNTRY, JOBS),
    ("{name} spent a holiday in {a} and did some {b}.", "Who vacationed in {A} and tried {B}?", CITY_COUNTRY, SPORTS),
    ("{name}'s {b} lives in {a}.", "Whose {B} resides in {A}?", CITY_COUNTRY, RELATIVES),
    ("{name} bought {a} {b}.", "Who purchased {A} {B}?", GOODS, WHEN),
    ("{name} is {an_a} who took up {b} this year.", "Which {A} started {B} recently?", JOBS, SPORTS),
]  # fmt: skip


def generated_pairs(per_template: int = 64, seed: int = 5) -> list[tuple[str, str]]:
    """(note, question) pairs from :data:`GENERATED`, each (a, b) combination used once, so each
    question has one answer; other notes of the template share its ``a`` or its ``b``."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for note, question, first, second in GENERATED:
        combos = [(x, y) for x in first for y in second]
        rng.shuffle(combos)
        asked: set[str] = set()  # two words may share a paraphrase (brother, sister: sibling)
        for (a, pa), (b, pb) in combos:
            ask = question.format(A=pa, B=pb)
            if ask in asked:
                continue
            asked.add(ask)
            an_a = ("an " if a[0] in "aeiou" else "a ") + a
            out.append((note.format(name=rng.choice(PEOPLE), a=a, b=b, an_a=an_a), ask))
            if len(asked) == per_template:
                break
    return out
