"""The *conversations* retrieval family: generated multi-session dialogues between two people.

Everything is generated with fixed seeds (no external data). Each dialogue has two speakers, 16–19
dated sessions a week or three apart and at least 22 turns a session. Each speaker lives through
four or five storylines that recur and change over time (moving city, changing jobs, adopting a
pet, a hobby that progresses, a trip, an injury, a sibling's wedding, training for a race,
renovating a kitchen): a story's beats fall in different sessions, and the partner answers with
turns on the same topic about other people (a cousin's dog, a brother's move) — distractors that
share the words and the meaning of the evidence. Small talk fills the rest. A turn is stored as
one passage, ``Speaker (8 May 2023): text``.

Questions, each with the turns that answer it:

* ``single``: one fact, asked once with the evidence's words (``words``) and once in other
  words (``paraphrase``) where the story allows;
* ``multi-hop``: two facts from two stories ("Which city was Maya living in when she adopted
  Biscuit?": the move and the adoption); every evidence turn is needed;
* ``temporal``: "When did …", "What did Maya do after …", questions naming a month ("How far was
  Leo running in May 2023?") and "… before the move";
* ``absent``: things never said in the dialogue ("What is the name of Maya's horse?"); the right
  answer is no passage at all. ``absent/topic``: never said either, but asked like the real
  questions, with words the dialogue uses ("Why did Maya's hamster go to the vet?" where Maya's
  beagle did; checked: the subject's word occurs in no turn). ``absent-other``: asks one speaker
  about what only the other did — the subject *was* mentioned, by the other speaker, so it is
  reported apart, not as never said.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

NAMES = [
    "Maya", "Leo", "Nina", "Omar", "Priya", "Jonah", "Sofia", "Mateo", "Hana", "Elias", "Zara", "Theo",
    "Lucia", "Ravi", "Ingrid", "Kofi", "Amelie", "Diego", "Yuki", "Samir", "Clara", "Idris", "Freya", "Tariq",
    "Alma", "Niko", "Leila", "Oskar", "Mira", "Andre", "Selin", "Emil", "Rosa", "Kai", "Talia", "Bastian",
    "Noemi", "Arjun", "Greta", "Malik",
]  # fmt: skip
CITIES = [
    "Portland", "Denver", "Austin", "Seattle", "Chicago", "Boston", "Toronto", "Vancouver", "Dublin",
    "Glasgow", "Lyon", "Munich", "Rotterdam", "Barcelona", "Valencia", "Bologna", "Copenhagen", "Melbourne",
]  # fmt: skip
COMPANIES = [
    "Brightwave", "Northwind Labs", "Copperleaf", "Helix Foods", "Quantis", "Bluepeak", "Orbital Health",
    "Finch & Co", "Tidewater", "Lumen Studio", "Greenline Transit", "Ironbark Bank",
]  # fmt: skip
ROLES = [
    "product manager", "data analyst", "UX designer", "backend engineer", "marketing lead", "nurse manager",
    "sales director", "quality engineer", "research scientist", "operations coordinator",
]  # fmt: skip
PRODUCTS = [
    "mobile app",
    "billing system",
    "new website",
    "spring catalogue",
    "analytics dashboard",
    "loyalty programme",
]
MANAGERS = ["Greg", "Helen", "Marcus", "Denise", "Rupert", "Yolanda", "Victor", "Ines"]
PETS = [
    ("beagle", "dog", "Biscuit", "he"), ("corgi", "dog", "Waffles", "she"), ("greyhound", "dog", "Comet", "he"),
    ("tabby kitten", "cat", "Pickle", "she"), ("Maine Coon", "cat", "Mango", "he"), ("lop-eared rabbit", "rabbit", "Clover", "she"),
    ("border collie", "dog", "Juniper", "she"), ("ginger kitten", "cat", "Pumpkin", "he"),
]  # fmt: skip
SWALLOWED = ["sock", "hair tie", "bottle cap", "rubber duck", "chunk of chocolate", "shoelace"]
TRICKS = ["roll over", "give a high five", "fetch the newspaper", "ring a bell for dinner", "sit on command"]
HOBBIES = [
    # (activity, paraphrase for questions, venue, progress lines)
    ("pottery", "a craft with clay", "the ceramics studio on {street}", [
        "My first bowl came out completely lopsided, but I love it anyway.",
        "I made a set of four mugs this week, glazed in blue.",
        "The studio is selling two of my vases at the weekend fair!",
    ]),
    ("rock climbing", "a sport on walls with ropes", "the bouldering gym on {street}", [
        "I finally finished a V3 route at the gym, my forearms are dead.",
        "I led my first outdoor route on real rock this weekend.",
        "I'm entering a small bouldering competition next month.",
    ]),
    ("guitar", "a string instrument", "the music school on {street}", [
        "I can play three chords now, my fingertips hurt a lot.",
        "I learned the whole intro to Blackbird this week.",
        "I played two songs at an open mic night and didn't faint!",
    ]),
    ("watercolour painting", "an art with brushes", "the community centre on {street}", [
        "My first landscape looked like soup, honestly.",
        "I painted our balcony plants and I'm actually proud of it.",
        "A café on {street} is hanging three of my paintings this month.",
    ]),
    ("salsa dancing", "a Latin dance", "the dance hall on {street}", [
        "I kept stepping on my partner's feet in the first lesson.",
        "We learned the cross-body lead and it finally clicked.",
        "Our class performed at a festival and I didn't miss a step.",
    ]),
    ("sourdough baking", "making bread at home", "a workshop at the bakery on {street}", [
        "My first loaf was as flat as a pancake.",
        "The starter is bubbly now and the crumb is getting open.",
        "I baked six loaves for the neighbours' street party.",
    ]),
]  # fmt: skip
STREETS = ["Elm Street", "Harbour Road", "Mill Lane", "Station Road", "King Street", "Park Avenue"]
TRIPS = [
    # (destination, reason, sight, dish)
    ("Lisbon", "a friend's birthday", "the view from the castle at sunset", "grilled sardines"),
    ("Kyoto", "the cherry blossom season", "the bamboo forest at dawn", "ramen"),
    ("Iceland", "a hiking holiday", "the glacier lagoon", "lamb soup"),
    ("Mexico City", "a conference", "the murals in the national palace", "tacos al pastor"),
    ("Marrakesh", "my cousin's wedding", "the spice market at night", "tagine"),
    ("Edinburgh", "the summer festival", "the castle on the hill", "haggis"),
    ("Hanoi", "a food tour", "the lantern-lit old quarter", "pho"),
    ("Cape Town", "a work trip", "the penguins at Boulders Beach", "bobotie"),
]  # fmt: skip
INJURIES = [
    ("sprained my ankle", "ankle", "football"), ("pulled a muscle in my back", "back", "tennis"),
    ("twisted my knee", "knee", "basketball"), ("jammed my wrist", "wrist", "volleyball"),
]  # fmt: skip
SIBLINGS = [
    ("sister", "Anya"),
    ("brother", "Felipe"),
    ("sister", "Corinne"),
    ("brother", "Rashid"),
    ("sister", "Beatriz"),
]
FIANCES = [
    "a paramedic called Josh",
    "a teacher named Lorenzo",
    "her college friend Amira",
    "a chef called Stefan",
    "a pilot named Carmen",
]
VENUES = [
    "an old barn outside town",
    "a vineyard by the lake",
    "a lighthouse on the coast",
    "her grandparents' garden",
]
RACES = [("half marathon", [8, 12, 15, 18], "1 hour 58 minutes"), ("10k", [4, 6, 8, 9], "52 minutes"),
         ("marathon", [18, 25, 30, 32], "4 hours 11 minutes")]  # fmt: skip
CABINETS = ["sage green", "navy blue", "matte black", "oak", "cream"]

# never in any dialogue (checked): questions about them have no answer
ABSENT = [
    "Did {p} ever mention learning to sail?",
    "What did {p} say about the trip to Antarctica?",
    "What instrument does {p} play in the orchestra?",
    "What is the name of {p}'s horse?",
    "Which university did {p}'s daughter apply to?",
    "How is {p}'s beekeeping going?",
    "What did {p} think of the opera?",
    "Did {p} get a tattoo?",
    "What's for dinner on Mars?",
    "How many chess tournaments has {p} won?",
    "What did {p} buy at the antique auction?",
    "Where did {p} go scuba diving?",
]
ABSENT_WORDS = {"sail", "antarctica", "orchestra", "horse", "university", "daughter", "beekeeping", "opera",
                "tattoo", "mars", "chess", "tournament", "auction", "antique", "scuba"}  # fmt: skip
# Never said either, but asked the way the dialogues' real questions are, with their topic words
# ("vet", "name", "move", "rent", "trick", "finish", "physio" …): a subject never mentioned, told by
# the word after the shared ones. (question, words that must occur in no turn of the dialogue)
ABSENT_NEAR = [
    ("What did {p} name the parrot?", ("parrot",)),
    ("Why did {p}'s hamster go to the vet?", ("hamster",)),
    ("What trick did {p}'s pony learn?", ("pony",)),
    ("Why did {p} move to Tokyo?", ("tokyo",)),
    ("How much is the rent on {p}'s flat in Oslo?", ("oslo",)),
    ("What does {p} do at the zoo?", ("zoo",)),
    ("How are {p}'s piano lessons going?", ("piano",)),
    ("What did {p} knit for the baby?", ("knit", "baby")),
    ("What did {p} eat in Peru?", ("peru",)),
    ("When did {p} come back from the safari?", ("safari",)),
    ("How did {p} break an arm?", ("arm",)),
    ("What did the dentist say about {p}'s tooth?", ("dentist", "tooth")),
    ("When is {p}'s grandmother's birthday party?", ("grandmother",)),
    ("How long did it take {p} to finish the triathlon?", ("triathlon",)),
    ("Which swimming competition did {p} enter?", ("swimming",)),
    ("What colour did {p} paint the nursery?", ("nursery",)),
    ("When was {p}'s garden shed finished?", ("shed",)),
    ("Which podcast does {p} recommend?", ("podcast",)),
    ("What car did {p} buy?", ("car",)),
    ("Who is {p}'s landlord in Madrid?", ("madrid",)),
]
ABSENT_NEAR_PER_DIALOGUE = 6

GREETINGS = [
    ("Hey {b}! How have you been?", "Hi {a}! Busy, but good. It's been a while."),
    ("Morning {b}, got a minute to catch up?", "Always, {a}. Coffee in hand, go ahead."),
    ("{b}! Long time no talk.", "I know, {a}, life got hectic. Tell me everything."),
    ("Hi {b}, are you free to chat?", "Sure {a}, I just got home."),
]
GOODBYES = [
    ("I should get going, talk soon!", "Take care, {a}. Speak next week!"),
    ("Okay, dinner is calling. Bye for now!", "Bye {a}, enjoy your evening."),
    ("Let's catch up again soon.", "Definitely. Have a good one, {a}."),
]
SMALL_TALK = [
    "The weather has been {weather} all week.", "Did you watch the new episode of {show}?",
    "I'm so tired, I didn't sleep well last night.", "We ordered {food} last night and it was great.",
    "I finally cleaned out the garage this weekend.", "My phone screen cracked again, unbelievable.",
    "Have you read anything good lately? I'm into {book} right now.", "The neighbours are having another party.",
    "I tried that new {food} place near the station.", "Traffic this morning was a nightmare.",
    "I'm thinking of getting a new bike for the summer.", "My mum called, she says hi.",
    "I can't believe how fast this year is going.", "I spent all Sunday doing laundry and watching {show}.",
    "We had a power cut for two hours yesterday.", "My plants are finally recovering on the windowsill.",
    "I started drinking green tea instead of coffee.", "The supermarket was out of {food} again.",
    "Haha, that's so you.", "Oh no, that sounds stressful.", "That's amazing, I'm so happy for you!",
    "Really? Tell me more.", "Ha, I can imagine.", "Sounds like a lot, take it easy.",
    "Same here, honestly.", "Wait, seriously?", "Good for you!", "I hope it gets better soon.",
]  # fmt: skip
WEATHER = ["grey and rainy", "unusually warm", "freezing", "windy", "perfectly sunny", "foggy"]
SHOWS = [
    "The Crown",
    "Severance",
    "Ted Lasso",
    "the baking show",
    "that detective series",
    "the nature documentary",
]
FOODS = ["Thai curry", "pizza", "sushi", "dumplings", "burritos", "falafel", "pho", "ramen"]
BOOKS = ["a mystery novel", "a biography of Lincoln", "a book about sleep", "a sci-fi trilogy"]


@dataclass(slots=True)
class Turn:
    speaker: str
    at: datetime
    text: str
    session: int

    @property
    def passage(self) -> str:
        return f"{self.speaker} ({self.at.day} {self.at:%B %Y}): {self.text}"


@dataclass(frozen=True, slots=True)
class DialogueQuestion:
    text: str
    evidence: tuple[int, ...]  # turn indices; empty: nothing answers it
    kind: str  # single | multi-hop | temporal | absent | absent-other
    overlap: str = ""  # words | paraphrase ('' where it does not apply)

    @property
    def need_all(self) -> bool:
        return self.kind == "multi-hop"


@dataclass(slots=True)
class Dialogue:
    speakers: tuple[str, str]
    turns: list[Turn]
    questions: list[DialogueQuestion]

    def passages(self) -> list[str]:
        return [t.passage for t in self.turns]


# --------------------------------------------------------------------------- construction


@dataclass(slots=True)
class Line:
    speaker: str
    text: str
    key: str | None = None


@dataclass(slots=True)
class Milestone:
    session: int
    key: str
    done: str  # "adopted Biscuit": completes "What did Maya do after she …"
    after: str  # "adopting Biscuit": completes "What did Maya do after …"


@dataclass(slots=True)
class Story:
    person: str
    kind: str
    beats: dict[int, list[Line]] = field(default_factory=dict)
    questions: list[tuple[str, tuple[str, ...], str, str]] = field(default_factory=list)
    milestones: list[Milestone] = field(default_factory=list)
    month_topics: list[tuple[str, int, str]] = field(default_factory=list)  # (topic question, session, key)

    def say(self, session: int, *lines: Line) -> None:
        self.beats.setdefault(session, []).extend(lines)

    def ask(self, text: str, keys: str | tuple[str, ...], kind: str = "single", overlap: str = "") -> None:
        self.questions.append((text, (keys,) if isinstance(keys, str) else keys, kind, overlap))


class Builder:
    """One dialogue's storylines, laid out over its sessions (see the module docstring)."""

    def __init__(self, rng: random.Random, a: str, b: str, n_sessions: int) -> None:
        self.rng = rng
        self.a, self.b = a, b
        self.n = n_sessions
        self.keys = 0
        self.home: dict[
            str, tuple[str, str, int, str, str]
        ] = {}  # person -> (city1, city2, move session, keys)
        self.jobs: dict[str, tuple[str, str, int, str, str]] = {}

    def key(self, name: str) -> str:
        self.keys += 1
        return f"{name}#{self.keys}"

    def partner(self, p: str) -> str:
        return self.b if p == self.a else self.a

    def chatter(self, s: Story, first: int, last: int, lines: list[str], share: float = 0.35) -> None:
        """Now and then, in sessions after ``first`` and before ``last``, a line that mentions the story
        again (not evidence for its questions, though it repeats their words)."""
        for session in range(first + 1, min(last, self.n)):
            if self.rng.random() < share:
                s.say(session, Line(s.person, self.rng.choice(lines)))

    def sessions(self, count: int, lo: int = 0, gap: tuple[int, int] = (1, 3)) -> list[int]:
        start = self.rng.randint(lo, max(lo, self.n - 1 - count * gap[0]))
        out = [start]
        for _ in range(count - 1):
            out.append(min(self.n - 1, out[-1] + self.rng.randint(*gap)))
        return out

    # each storyline: beats in sessions, questions by evidence key, milestones for "after" questions

    def move(self, p: str) -> Story:
        r, s, q = self.rng, Story(p, "move"), self.partner(p)
        city1, city2, other = r.sample(CITIES, 3)
        early, plan, moved, settled = self.sessions(4, gap=(2, 4))
        home1, k_plan, k_moved, k_hood, k_settled = (
            self.key(x) for x in ("home1", "plan", "moved", "hood", "settled")
        )
        s.say(early, Line(p, r.choice([
            f"The rain in {city1} hasn't stopped all week.", f"Rent in {city1} went up again, it's getting silly.",
            f"I found a great little bakery near my flat in {city1}.",
        ]), home1))  # fmt: skip
        s.say(plan, Line(p, f"I'm seriously thinking about leaving {city1}. I've been looking at flats in {city2}.", k_plan),
              Line(q, f"Wow, {city2}! My brother moved to {other} last year and loves it."))  # fmt: skip
        s.say(moved, Line(p, r.choice([
            f"Guess what, I moved to {city2} last weekend! Boxes everywhere.",
            f"The move is done, I'm officially living in {city2} now.",
            f"We signed the lease and I'm settled in {city2} at last.",
        ]), k_moved), Line(q, "How's the new neighbourhood?"),
            Line(p, "Quiet, and there's a farmers' market two streets away.", k_hood))  # fmt: skip
        if settled > moved:
            s.say(
                settled,
                Line(p, f"{city2} is growing on me, I even found a running trail by the river.", k_settled),
            )
        self.chatter(
            s,
            early,
            plan,
            [
                f"My landlord in {city1} still hasn't fixed the heating.",
                f"The trams in {city1} were on strike again.",
            ],
        )
        self.chatter(
            s,
            moved,
            self.n,
            [
                f"Still unpacking boxes in {city2}, send help.",
                f"The buses in {city2} are so confusing.",
                "I miss my old neighbours sometimes.",
            ],
        )
        s.ask(f"Which city did {p} move to?", k_moved, overlap="words")
        s.ask(f"Where does {p} live these days?", k_moved, overlap="paraphrase")
        s.ask(f"When did {p} move to {city2}?", k_moved, "temporal")
        s.ask(f"What is near {p}'s new place?", k_hood, overlap="paraphrase")
        s.ask(f"What did {p} say about {city1} before the move?", (home1, k_plan), "temporal")
        s.milestones.append(Milestone(moved, k_moved, f"moved to {city2}", f"moving to {city2}"))
        self.home[p] = (city1, city2, moved, home1, k_moved)
        return s

    def job(self, p: str) -> Story:
        r, s, q = self.rng, Story(p, "job"), self.partner(p)
        co1, co2 = r.sample(COMPANIES, 2)
        role1, role2 = r.sample(ROLES, 2)
        early, interview, offer, later = self.sessions(4, gap=(2, 4))
        k1, k_int, k_new, k_why, k_mgr = (
            self.key(x) for x in ("job1", "interview", "newjob", "why", "manager")
        )
        product, mgr = r.choice(PRODUCTS), r.choice(MANAGERS)
        s.say(early, Line(p, r.choice([
            f"Work at {co1} is hectic, we're launching the {product} next week.",
            f"As a {role1} at {co1} I spend half my day in meetings about the {product}.",
        ]), k1), Line(q, "My boss keeps scheduling meetings at eight in the morning, it's brutal."))  # fmt: skip
        s.say(interview, Line(p, f"I had an interview at {co2} yesterday, fingers crossed.", k_int))
        s.say(offer, Line(p, f"I accepted the offer from {co2}! I'll be their new {role2}.", k_new),
              Line(q, "Congrats! What made you decide?"),
              Line(p, "Better pay, and I can walk to the office instead of sitting in traffic.", k_why))  # fmt: skip
        if later > offer:
            s.say(later, Line(p, f"My manager at {co2}, {mgr}, is really supportive so far.", k_mgr))
            s.ask(f"Who is {p}'s manager at {co2}?", k_mgr, overlap="words")
        for first, last, co in ((early, offer, co1), (offer, self.n, co2)):
            for session in range(first + 1, last):
                if r.random() < 0.3:
                    k = self.key("atwork")
                    s.say(
                        session,
                        Line(
                            p,
                            r.choice(
                                [
                                    f"Long day at {co}, three meetings back to back.",
                                    f"Everyone at {co} is stressed about the deadline.",
                                ]
                            ),
                            k,
                        ),
                    )
                    s.month_topics.append((f"Where was {p} working in {{month}}?", session, k))
        s.ask(f"What is {p}'s new position?", k_new, overlap="paraphrase")
        s.ask(f"When did {p} accept the offer from {co2}?", k_new, "temporal")
        s.ask(f"Why did {p} switch employers?", k_why, overlap="paraphrase")
        s.ask(f"Where did {p} have a job interview?", k_int, overlap="words")
        s.month_topics.append((f"Where was {p} working in {{month}}?", early, k1))
        s.milestones.append(
            Milestone(offer, k_new, f"accepted the offer from {co2}", f"accepting the job at {co2}")
        )
        self.jobs[p] = (co1, co2, offer, k1, k_new)
        return s

    def pet(self, p: str) -> Story:
        r, s, q = self.rng, Story(p, "pet"), self.partner(p)
        breed, species, name, pron = r.choice(PETS)
        other = r.choice([x for x in PETS if x[0] != breed])
        adopt, vet, trick = self.sessions(3, gap=(2, 4))
        k_ad, k_vet, k_trick = self.key("adopt"), self.key("vet"), self.key("trick")
        obj, what = r.choice(SWALLOWED), r.choice(TRICKS)
        s.say(adopt, Line(p, f"We adopted a {breed} from the shelter and named {'him' if pron == 'he' else 'her'} {name}!", k_ad),
              Line(q, f"Aww! My cousin has a {other[0]}, {other[3]} is a handful."))  # fmt: skip
        s.say(vet, Line(p, f"{name} had to go to the vet, {pron} swallowed a {obj}.", k_vet),
              Line(q, "Oh no! Our vet bills last year were insane too."))  # fmt: skip
        if trick > vet:
            s.say(trick, Line(p, f"{name} finally learned to {what}, I'm so proud.", k_trick))
            s.ask(f"What trick did {name} learn?", k_trick, overlap="words")
        self.chatter(
            s,
            adopt,
            self.n,
            [
                f"{name} is snoring next to me right now.",
                f"Took {name} to the park, {pron} made three new friends.",
                f"{name} chewed another cable, I give up.",
            ],
        )
        s.ask(f"What did {p} name the {breed}?", k_ad, overlap="words")
        s.ask(f"What is {p}'s pet called?", k_ad, overlap="paraphrase")
        s.ask(f"Why did {name} go to the vet?", k_vet, overlap="words")
        s.ask(f"What did {p}'s {species} eat that made it sick?", k_vet, overlap="paraphrase")
        s.ask(f"When did {p} adopt {name}?", k_ad, "temporal")
        s.milestones.append(Milestone(adopt, k_ad, f"adopted {name}", f"adopting {name}"))
        return s

    def hobby(self, p: str) -> Story:
        r, s, q = self.rng, Story(p, "hobby"), self.partner(p)
        activity, para, venue, progress = r.choice(HOBBIES)
        street = r.choice(STREETS)
        sessions = self.sessions(4, gap=(2, 3))
        k_start = self.key("hobby")
        s.say(sessions[0], Line(p, f"I signed up for a {activity} class at {venue.format(street=street)}.", k_start),
              Line(q, f"I tried {activity} once in college and gave up after a week."))  # fmt: skip
        for i, (session, line) in enumerate(zip(sessions[1:], progress, strict=False)):
            k = self.key(f"progress{i}")
            s.say(session, Line(p, line.format(street=street), k))
            s.month_topics.append((f"How was {p}'s {activity} going in {{month}}?", session, k))
        self.chatter(
            s,
            sessions[0],
            self.n,
            [f"I have {activity} class again tonight.", f"My {activity} teacher says I'm improving."],
            share=0.25,
        )
        s.ask(f"What class did {p} sign up for?", k_start, overlap="words")
        s.ask(f"Which new pastime, {para}, did {p} take up?", k_start, overlap="paraphrase")
        s.milestones.append(
            Milestone(sessions[0], k_start, f"signed up for {activity}", f"signing up for {activity}")
        )
        return s

    def trip(self, p: str) -> Story:
        r, s, q = self.rng, Story(p, "trip"), self.partner(p)
        dest, reason, sight, dish = r.choice(TRIPS)
        other = r.choice([t for t in TRIPS if t[0] != dest])
        plan, back = self.sessions(2, gap=(1, 2))
        if back == plan:
            plan = max(0, plan - 1)
        k_plan, k_back, k_food = self.key("tripplan"), self.key("back"), self.key("food")
        s.say(plan, Line(p, f"I booked flights to {dest} for {reason}.", k_plan),
              Line(q, f"Nice! I went to {other[0]} years ago, {other[2]} was amazing."))  # fmt: skip
        s.say(back, Line(p, f"Just got back from {dest}. I'll never forget {sight}.", k_back),
              Line(q, "Did you try the local food?"), Line(p, f"Yes, {dish} almost every day!", k_food))  # fmt: skip
        self.chatter(
            s,
            plan,
            back,
            [f"I'm counting the days until {dest}!", "I still need to buy a travel adapter."],
            0.6,
        )
        s.ask(f"Why did {p} fly to {dest}?", k_plan, overlap="words")
        s.ask(f"Which sight impressed {p} most on the journey?", k_back, overlap="paraphrase")
        s.ask(f"What did {p} eat in {dest}?", k_food, overlap="words")
        s.ask(f"When did {p} come back from {dest}?", k_back, "temporal")
        s.milestones.append(Milestone(back, k_back, f"got back from {dest}", f"getting back from {dest}"))
        return s

    def injury(self, p: str) -> Story:
        r, s, q = self.rng, Story(p, "injury"), self.partner(p)
        hurt, part, sport = r.choice(INJURIES)
        first, healed = self.sessions(2, gap=(2, 4))
        k_hurt, k_heal = self.key("injury"), self.key("healed")
        s.say(first, Line(p, f"I {hurt} playing {sport} on Saturday.", k_hurt),
              Line(q, "Ouch. My dad had the same thing last winter, rest it properly."))  # fmt: skip
        self.chatter(s, first, healed, [f"My {part} still hurts when I take the stairs."], 0.5)
        s.ask(f"How did {p} get hurt?", k_hurt, overlap="paraphrase")
        s.ask(f"Which sport was {p} playing when the {part} injury happened?", k_hurt, overlap="words")
        if healed > first:
            s.say(healed, Line(p, f"The physio says my {part} has healed, I'm back to {sport}.", k_heal))
            s.ask(f"What did the physio say about {p}'s {part}?", k_heal, overlap="words")
            s.ask(f"When did {p} recover?", k_heal, "temporal")
        s.milestones.append(Milestone(first, k_hurt, hurt.replace("my", "their"), "the injury"))
        return s

    def family(self, p: str) -> Story:
        r, s, q = self.rng, Story(p, "family"), self.partner(p)
        relation, sib = r.choice(SIBLINGS)
        fiance, venue = r.choice(FIANCES), r.choice(VENUES)
        engaged, wedding = self.sessions(2, gap=(3, 6))
        k_eng, k_wed = self.key("engaged"), self.key("wedding")
        s.say(engaged, Line(p, f"My {relation} {sib} got engaged to {fiance}!", k_eng),
              Line(q, "That's lovely! My best friend is getting married in the autumn too."))  # fmt: skip
        self.chatter(
            s,
            engaged,
            wedding,
            [
                f"{sib} keeps sending me photos of wedding venues.",
                f"Helping {sib} with the seating plan is a nightmare.",
            ],
            0.4,
        )
        s.ask(f"Who did {p}'s {relation} get engaged to?", k_eng, overlap="words")
        if wedding > engaged:
            s.say(
                wedding, Line(p, f"{sib}'s wedding at {venue} was beautiful, I cried during the vows.", k_wed)
            )
            s.ask(f"Where was the ceremony for {p}'s sibling held?", k_wed, overlap="paraphrase")
            s.ask(f"When did {sib} get married?", k_wed, "temporal")
            s.milestones.append(Milestone(wedding, k_wed, f"went to {sib}'s wedding", f"{sib}'s wedding"))
        return s

    def race(self, p: str) -> Story:
        r, s, q = self.rng, Story(p, "race"), self.partner(p)
        race, distances, time = r.choice(RACES)
        sessions = self.sessions(5, gap=(1, 3))
        k_reg = self.key("register")
        s.say(sessions[0], Line(p, f"I signed up for a {race} in the spring, I need to start training.", k_reg),
              Line(q, "You're braver than me, I get tired walking to the bus."))  # fmt: skip
        for session, km in zip(sessions[1:4], distances, strict=False):
            k = self.key("training")
            s.say(session, Line(p, f"Ran {km} km this morning, my legs are sore.", k))
            s.month_topics.append((f"How far was {p} running in {{month}}?", session, k))
        if sessions[4] > sessions[3]:
            k_done = self.key("finished")
            s.say(sessions[4], Line(p, f"I finished the {race} in {time}!", k_done),
                  Line(q, "That's incredible, my colleague ran one last year and walked half of it."))  # fmt: skip
            s.ask(f"How long did it take {p} to finish the {race}?", k_done, overlap="words")
            s.ask(f"What was {p}'s result in the race?", k_done, overlap="paraphrase")
            s.milestones.append(
                Milestone(sessions[4], k_done, f"finished the {race}", f"finishing the {race}")
            )
        self.chatter(
            s,
            sessions[0],
            sessions[4],
            ["Skipped my run today, it was pouring.", "New running shoes, my feet are thanking me."],
            0.3,
        )
        s.ask(f"Which race did {p} enter?", k_reg, overlap="paraphrase")
        return s

    def kitchen(self, p: str) -> Story:
        r, s, q = self.rng, Story(p, "kitchen"), self.partner(p)
        colour = r.choice(CABINETS)
        start, mid, done = self.sessions(3, gap=(2, 3))
        k0, k1, k2 = self.key("reno"), self.key("cabinets"), self.key("renodone")
        s.say(start, Line(p, "We started renovating the kitchen, we're cooking on a camping stove.", k0),
              Line(q, "Good luck! Our bathroom took twice as long as the builder said."))  # fmt: skip
        s.say(mid, Line(p, f"The {colour} cabinets arrived, they look even better than in the shop.", k1))
        self.chatter(
            s,
            start,
            done,
            ["Still no kitchen, we're living on takeaway.", "There's plaster dust on absolutely everything."],
            0.5,
        )
        s.ask(f"What colour are {p}'s new cabinets?", k1, overlap="words")
        s.ask(f"How was {p} making meals during the works?", k0, overlap="paraphrase")
        if done > mid:
            s.say(done, Line(p, "The kitchen is finally done, we hosted our first dinner last night.", k2))
            s.ask(f"When was {p}'s kitchen renovation finished?", k2, "temporal")
            s.milestones.append(Milestone(done, k2, "finished the kitchen", "the kitchen renovation"))
        return s


STORIES = ["move", "job", "pet", "hobby", "trip", "injury", "family", "race", "kitchen"]


def month_name(at: datetime) -> str:
    return f"{at:%B %Y}"


def build_dialogue(index: int, seed: int = 2024) -> Dialogue:
    rng = random.Random(seed * 1000 + index)
    a, b = rng.sample(NAMES, 2)
    n = rng.randint(16, 19)
    builder = Builder(rng, a, b, n)
    stories: list[Story] = []
    kinds = {a: rng.sample(STORIES, rng.randint(4, 5)), b: rng.sample(STORIES, rng.randint(4, 5))}
    for person in (a, b):
        for kind in sorted(kinds[person], key=lambda k: k not in ("move", "job")):  # move, job first
            stories.append(getattr(builder, kind)(person))
    start = datetime(2022, 3, 1, tzinfo=UTC) + timedelta(days=rng.randint(0, 400))
    dates = [start]
    for _ in range(n - 1):
        dates.append(dates[-1] + timedelta(days=rng.randint(6, 20)))
    turns: list[Turn] = []
    where: dict[str, int] = {}
    for session in range(n):
        at = dates[session] + timedelta(hours=rng.randint(8, 20), minutes=rng.randint(0, 59))
        lines: list[Line] = []
        hello, reply = rng.choice(GREETINGS)
        first, second = (a, b) if rng.random() < 0.5 else (b, a)
        blocks = [s.beats[session] for s in stories if session in s.beats]
        talk = rng.sample(SMALL_TALK, max(0, 20 - sum(len(b) for b in blocks)))
        blocks += [
            [
                Line(
                    rng.choice((a, b)),
                    t.format(
                        weather=rng.choice(WEATHER),
                        show=rng.choice(SHOWS),
                        food=rng.choice(FOODS),
                        book=rng.choice(BOOKS),
                    ),
                )
            ]
            for t in talk
        ]
        rng.shuffle(blocks)  # a story's beat stays together; small talk falls between beats
        body: list[Line] = [line for block in blocks for line in block]
        bye, bye_reply = rng.choice(GOODBYES)
        lines = [
            Line(first, hello.format(a=first, b=second)),
            Line(second, reply.format(a=first, b=second)),
            *body,
            Line(first, bye.format(a=first, b=second)),
            Line(second, bye_reply.format(a=first, b=second)),
        ]
        for line in lines:
            if line.key:
                where[line.key] = len(turns)
            turns.append(Turn(line.speaker, at, line.text, session))
            at += timedelta(minutes=rng.randint(1, 3))
    for turn in turns:
        words = {w.strip(".,!?'").lower() for w in turn.text.split()}
        assert not words & ABSENT_WORDS, turn.text
    questions = _questions(builder, stories, turns, where, rng, dates)
    return Dialogue((a, b), turns, questions)


def _questions(
    builder: Builder,
    stories: list[Story],
    turns: list[Turn],
    where: dict[str, int],
    rng: random.Random,
    dates: list[datetime],
) -> list[DialogueQuestion]:
    out = [
        DialogueQuestion(text, tuple(where[k] for k in keys), kind, overlap)
        for s in stories
        for text, keys, kind, overlap in s.questions
    ]
    for s in stories:  # questions naming a month: every turn of the topic in that month answers it
        by_month: dict[str, list[int]] = {}
        asked: dict[str, str] = {}
        for template, session, key in s.month_topics:
            month = month_name(dates[session])
            by_month.setdefault(month, []).append(where[key])
            asked[month] = template.format(month=month)
        for month, ids in by_month.items():
            out.append(DialogueQuestion(asked[month], tuple(ids), "temporal", "words"))
    for person in builder.a, builder.b:
        marks = sorted(
            (m for s in stories if s.person == person for m in s.milestones), key=lambda m: m.session
        )
        for m, nxt in itertools.pairwise(marks):
            if nxt.session > m.session:
                out.append(
                    DialogueQuestion(f"What did {person} do after {m.after}?", (where[nxt.key],), "temporal")
                )
        for m in marks:  # multi-hop: where they lived / worked when something happened
            if person in builder.home and m.key != builder.home[person][4]:
                _, _, moved, k_home, k_moved = builder.home[person]
                lived = where[k_moved] if m.session >= moved else where[k_home]
                out.append(DialogueQuestion(
                    f"Which city was {person} living in when they {m.done}?", (lived, where[m.key]), "multi-hop"
                ))  # fmt: skip
            if person in builder.jobs and m.key != builder.jobs[person][4]:
                _, _, offer, k1, k_new = builder.jobs[person]
                worked = where[k_new] if m.session >= offer else where[k1]
                out.append(DialogueQuestion(
                    f"Which company did {person} work for when they {m.done}?", (worked, where[m.key]), "multi-hop"
                ))  # fmt: skip
    for template in rng.sample(ABSENT, 4):
        out.append(DialogueQuestion(template.format(p=rng.choice((builder.a, builder.b))), (), "absent"))
    out += _absent_near(builder, turns)
    # asked about the wrong person: what only the partner did
    for s in stories:
        other = builder.partner(s.person)
        if s.questions and not any(t.person == other and t.kind == s.kind for t in stories):
            text, _, kind, _ = s.questions[0]
            if kind == "single" and rng.random() < 0.3:
                out.append(DialogueQuestion(text.replace(s.person, other), (), "absent-other"))
    return out


def _words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z]+", text)}


def _absent_near(builder: Builder, turns: list[Turn]) -> list[DialogueQuestion]:
    """Never-said questions that share the dialogue's topic words (their own random stream, so the
    rest of the dialogue's questions are the same with or without them)."""
    rng = random.Random(f"absent-near {builder.a} {builder.b} {len(turns)}")
    said = set().union(*(_words(t.text) for t in turns))
    fresh = [
        (t, absent) for t, absent in ABSENT_NEAR if not any(w.startswith(a) for w in said for a in absent)
    ]
    picked = rng.sample(fresh, min(ABSENT_NEAR_PER_DIALOGUE, len(fresh)))
    return [
        DialogueQuestion(t.format(p=rng.choice((builder.a, builder.b))), (), "absent", "topic")
        for t, _ in picked
    ]


def build(n_dialogues: int = 20, seed: int = 2024) -> list[Dialogue]:
    return [build_dialogue(i, seed) for i in range(n_dialogues)]
