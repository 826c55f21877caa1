"""Calibrates the near-duplicate threshold of archival inserts: paraphrases vs related-but-different facts.

Run: ``python benchmarks/bench_duplicates.py [--embedding-model local|static|NAME] [--pairs 1000] [--seed 11]
[--index 24000]``

An insert whose vector is at least the embedder's ``duplicate_similarity`` (cosine) close to a
live passage's is reported in its note as a near-duplicate, for the agent to supersede. This
script builds, from fixed templates and a fixed seed (no external data):

* **paraphrases** (positives): one fact written two ways ("Ana Kowalczyk lives in Lyon." /
  "Lyon is where Ana Kowalczyk lives."), across nine kinds of facts;
* **related but different** (negatives), one quarter each: the same person and relation with
  another value (a changed fact: "… lives in Porto."), the same statement about another
  person, the same person with another relation, and the same fact negated ("… no longer …");

embeds every text with the model the server would use (``make_embedder``), and prints
precision, recall and F0.5 of "cosine ≥ t means near-duplicate" for each threshold t, on a
tuning half and a held-out half (pairs split at random, seed fixed). The chosen threshold is
the one with the best F0.5 on the tuning half — precision counts twice as much as recall: a
note that calls a different fact a duplicate invites the agent to supersede the wrong
passage, a missed restatement only leaves a duplicate. Its held-out figures are printed last,
with the share of each kind of negative that would be reported (a reported "changed value"
or "negated" pair is an older version of the fact: worth superseding too, so the note asks
rather than asserts). Precision is for as many negatives as positives.

An insert does not compare its text with one other but searches the whole namespace, above
``SKETCH_FROM`` texts through a shortlist by sign bits (vector_scores.py, ``close_to``). The last
part checks that this finds what an exact scan finds: every text of the pairs, among
``--index`` texts in all (the rest more facts from the same templates with another seed — a
memory far more crowded with near-identical sentences than a real one, the hard case for a
shortlist), is looked up both ways at the chosen threshold; it prints how many of the
exact scan's near-duplicates the shortlist also reports, and the time of each.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import numpy as np

from kernmind.config import Settings
from kernmind.memory.embedder_factory import make_embedder
from kernmind.memory.vector_scores import Candidates, close_to, nearest_scored, sign_bits

sys.path.insert(0, str(Path(__file__).parent))
from bench_retrieval import VectorCache  # vectors cached between runs, per model

CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")), "kernmind-bench")

FIRST = (
    "Ana Marek Priya Tomas Lena Kofi Mei Lucas Sofia Omar Hana Diego Ingrid Ravi Chloe Yusuf Elif Mateo "
    "Nadia Pavel Aiko Bruno Zara Felix Leila Hugo Amara Jonas Freya Tariq Noor Emil Carmen Kenji Alma Idris"
).split()
LAST = (
    "Kowalczyk Lindqvist Okafor Moreau Tanaka Haddad Novak Fischer Castillo Nakamura Petrov Almeida "
    "Brennan Varga Osei Duarte Halvorsen Ibrahim Kaur Rossi Szabo Mendes Larsen Dubois Quinn Abara"
).split()
CITIES = (
    "Lyon Porto Oslo Kraków Nairobi Osaka Montreal Valencia Tbilisi Lima Ghent Leipzig Hobart Accra "
    "Bergen Seville Tartu Busan Cork Graz Quito Turin Aarhus Mombasa"
).split()
JOBS = (
    "nurse carpenter pilot pharmacist architect librarian electrician chef translator veterinarian "
    "geologist plumber dentist journalist firefighter baker surveyor midwife welder teacher"
).split()
COLOURS = "red black white grey ginger spotted brown golden".split()
ANIMALS = "cat dog rabbit parrot tortoise hamster ferret canary".split()
FOODS = (
    "sushi lasagne falafel ramen paella dumplings moussaka tacos risotto pho curry goulash "
    "pierogi ceviche couscous"
).split()
COMPANIES = (
    "Northwind Logistics|Bluefield Energy|Arcadia Robotics|Helios Pharma|Tidewater Bank|Quarry Games|"
    "Maple Analytics|Orchid Health|Granite Software|Silverline Rail|Juniper Foods|Cobalt Studios"
).split("|")
INSTRUMENTS = "cello violin piano trumpet harp saxophone drums flute accordion banjo".split()
ALLERGENS = "peanuts shellfish penicillin pollen cats latex gluten eggs sesame bee stings".split()
SPORTS = "tennis rowing climbing chess fencing judo swimming cycling badminton handball".split()

# relation -> (paraphrase templates of one fact, its negation, the slot that varies)
RELATIONS: dict[str, tuple[list[str], str, str]] = {
    "lives": (
        [
            "{p} lives in {city}.",
            "{p}'s home is in {city}.",
            "{city} is where {p} lives.",
            "{p} resides in {city}.",
            "These days {p} calls {city} home.",
        ],
        "{p} no longer lives in {city}.",
        "city",
    ),
    "job": (
        [
            "{p} works as a {job}.",
            "{p} is a {job} by profession.",
            "By trade, {p} is a {job}.",
            "{p} earns a living as a {job}.",
            "{p}'s job: {job}.",
        ],
        "{p} stopped working as a {job}.",
        "job",
    ),
    "pet": (
        [
            "{p} keeps a {colour} {animal}.",
            "{p} owns a {colour} {animal}.",
            "{p} has a {colour} {animal} as a pet.",
            "There is a {colour} {animal} that belongs to {p}.",
            "{p}'s pet is a {colour} {animal}.",
        ],
        "{p} gave away the {colour} {animal}.",
        "animal",
    ),
    "food": (
        [
            "{p} loves {food}.",
            "{p}'s favourite food is {food}.",
            "{food} is what {p} likes to eat most.",
            "{p} really enjoys eating {food}.",
            "Nothing beats {food} for {p}.",
        ],
        "{p} cannot stand {food}.",
        "food",
    ),
    "employer": (
        [
            "{p} works at {company}.",
            "{p} is employed by {company}.",
            "{company} employs {p}.",
            "{p} has a job at {company}.",
            "{p}'s employer is {company}.",
        ],
        "{p} left {company}.",
        "company",
    ),
    "music": (
        [
            "{p} plays the {instrument}.",
            "{p} is a {instrument} player.",
            "The {instrument} is the instrument {p} plays.",
            "{p} can play the {instrument}.",
            "{p} plays {instrument} in the evenings.",
        ],
        "{p} gave up playing the {instrument}.",
        "instrument",
    ),
    "allergy": (
        [
            "{p} is allergic to {allergen}.",
            "{p} has an allergy to {allergen}.",
            "{allergen} give {p} an allergic reaction.",
            "{p} must avoid {allergen} because of an allergy.",
            "{p} reacts badly to {allergen}: an allergy.",
        ],
        "{p} is not allergic to {allergen}.",
        "allergen",
    ),
    "sport": (
        [
            "{p} does {sport} every week.",
            "Every week {p} goes to {sport}.",
            "{p}'s weekly sport is {sport}.",
            "{p} practises {sport} weekly.",
            "Once a week, {p} does {sport}.",
        ],
        "{p} quit {sport}.",
        "sport",
    ),
    "birthday": (
        [
            "{p}'s birthday is on {day} {month}.",
            "{p} was born on {day} {month}.",
            "{p} celebrates a birthday every {day} {month}.",
            "On {day} {month} it is {p}'s birthday.",
            "{p} has a birthday on {month} {day}.",
        ],
        "{p}'s birthday is not on {day} {month}.",
        "day",
    ),
}
MONTHS = "January February March April May June July August September October November December".split()
SLOTS: dict[str, list[str]] = {
    "city": CITIES,
    "job": JOBS,
    "colour": COLOURS,
    "animal": ANIMALS,
    "food": FOODS,
    "company": COMPANIES,
    "instrument": INSTRUMENTS,
    "allergen": ALLERGENS,
    "sport": SPORTS,
    "month": MONTHS,
    "day": [str(d) for d in range(1, 29)],
}
NEGATIVE_KINDS = ("changed value", "other person", "other relation", "negated")


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    kind: str  # "paraphrase" or one of NEGATIVE_KINDS


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def fill(rng: random.Random) -> dict[str, str]:
    return {slot: rng.choice(values) for slot, values in SLOTS.items()}


def with_other(rng: random.Random, values: dict[str, str], slot: str) -> dict[str, str]:
    out = dict(values)
    while out[slot] == values[slot]:
        out[slot] = rng.choice(SLOTS[slot])
    return out


def make_pairs(n: int, seed: int) -> list[Pair]:
    """``n`` paraphrase pairs and ``n`` related-but-different pairs (a quarter of each kind)."""
    rng = random.Random(seed)
    relations = list(RELATIONS)
    pairs: list[Pair] = []
    for i in range(n):
        rel = relations[i % len(relations)]
        templates, _, _ = RELATIONS[rel]
        p, values = person(rng), fill(rng)
        a, b = rng.sample(templates, 2)
        pairs.append(Pair(a.format(p=p, **values), b.format(p=p, **values), "paraphrase"))
    for i in range(n):
        rel = relations[i % len(relations)]
        templates, negation, slot = RELATIONS[rel]
        kind = NEGATIVE_KINDS[i % len(NEGATIVE_KINDS)]
        p, values = person(rng), fill(rng)
        a_template, b_template = rng.choice(templates), rng.choice(templates)
        a = a_template.format(p=p, **values)
        if kind == "changed value":
            b = b_template.format(p=p, **with_other(rng, values, slot))
        elif kind == "other person":
            other = p
            while other == p:
                other = person(rng)
            b = b_template.format(p=other, **values)
        elif kind == "other relation":
            other_rel = rng.choice([r for r in relations if r != rel])
            b = rng.choice(RELATIONS[other_rel][0]).format(p=p, **values)
        else:
            b = negation.format(p=p, **values)
        pairs.append(Pair(a, b, kind))
    return pairs


async def shortlist_agreement(model: str, pairs: list[Pair], size: int, seed: int, threshold: float) -> None:
    """Near-duplicates of every text of the pairs among ``size`` texts: exact scan against the sign-bit
    shortlist (see the module docstring)."""
    embedder = make_embedder(Settings(embedding_model=model))
    assert embedder is not None
    cache = VectorCache(Path(CACHE), embedder.model)
    asked = sorted({t for pair in pairs for t in (pair.a, pair.b)})
    texts = list(asked)
    extra_seed = seed + 1
    while len(texts) < size:
        more = sorted({t for pair in make_pairs(2000, extra_seed) for t in (pair.a, pair.b)} - set(texts))
        texts += more[: size - len(texts)]
        extra_seed += 1
    vectors = np.asarray(await cache.embed(embedder, texts), dtype=np.float32)
    cache.save()
    await embedder.aclose()
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    ids = np.arange(1, len(texts) + 1, dtype=np.int64)
    index = Candidates(ids, vectors, None, np.ascontiguousarray(sign_bits(vectors).T))
    found = both = 0
    times: dict[str, list[float]] = {"exact scan": [], "sign-bit shortlist": []}
    for i in range(len(asked)):
        t0 = time.perf_counter()
        exact = {pid for pid, _ in nearest_scored(index, vectors[i], 50, threshold)} - {i + 1}
        t1 = time.perf_counter()
        short = {pid for pid, _ in close_to(index, vectors[i], 50, threshold)} - {i + 1}
        t2 = time.perf_counter()
        times["exact scan"].append((t1 - t0) * 1000)
        times["sign-bit shortlist"].append((t2 - t1) * 1000)
        found += len(exact)
        both += len(exact & short)
    print(
        f"\nnear-duplicates (cosine ≥ {threshold:.2f}) of the {len(asked)} texts of the pairs among {len(texts):,} "
        f"texts: the exact scan reports {found}, the sign-bit shortlist {both} of them "
        f"({100 * both / max(found, 1):.2f} %)"
    )
    for name, ts in times.items():
        print(f"  {name:<18} p50 {statistics.median(ts):.2f} ms")


async def similarities(model: str, pairs: list[Pair]) -> tuple[np.ndarray, float]:
    """Cosine of each pair with the model the server would use; ms per text embedded."""
    embedder = make_embedder(Settings(embedding_model=model))
    if embedder is None:
        raise SystemExit("--embedding-model none has no vectors to calibrate")
    texts = sorted({t for pair in pairs for t in (pair.a, pair.b)})
    t0 = time.perf_counter()
    vectors = np.asarray(await embedder.embed(texts), dtype=np.float32)
    ms = (time.perf_counter() - t0) * 1000 / len(texts)
    await embedder.aclose()
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = vectors / np.where(norms > 0, norms, 1)
    row = {t: i for i, t in enumerate(texts)}
    sims = np.array([float(vectors[row[p.a]] @ vectors[row[p.b]]) for p in pairs])
    return sims, ms


BETA = 0.5  # F-beta weighting: precision counts 1 / BETA times as much as recall


def scores(sims: np.ndarray, positive: np.ndarray, t: float) -> tuple[float, float, float]:
    """Precision, recall and F0.5 of "cosine ≥ t is a near-duplicate"."""
    flagged = sims >= t
    tp = int((flagged & positive).sum())
    precision = tp / int(flagged.sum()) if flagged.any() else 1.0
    recall = tp / max(1, int(positive.sum()))
    b2 = BETA * BETA
    f = (1 + b2) * precision * recall / (b2 * precision + recall) if precision + recall else 0.0
    return precision, recall, f


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--embedding-model", default="local", help="local (default), static, or an endpoint model"
    )
    ap.add_argument("--pairs", type=int, default=1000, help="paraphrase pairs, and as many negatives (1000)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument(
        "--index",
        type=int,
        default=24_000,
        help="texts the shortlist check searches among (24000; 0: skip it)",
    )
    args = ap.parse_args()
    pairs = make_pairs(args.pairs, args.seed)
    sims, ms = anyio.run(similarities, args.embedding_model, pairs)
    positive = np.array([p.kind == "paraphrase" for p in pairs])
    order = np.random.default_rng(args.seed).permutation(len(pairs))
    tune, held = np.zeros(len(pairs), dtype=bool), np.zeros(len(pairs), dtype=bool)
    tune[order[: len(pairs) // 2]] = True
    held[order[len(pairs) // 2 :]] = True
    print(
        f"model {args.embedding_model}: {int(positive.sum())} paraphrase pairs, {int((~positive).sum())} "
        f"related-but-different pairs ({ms:.2f} ms a text to embed); cosine of pairs, mean (min–max):"
    )
    for kind in ("paraphrase", *NEGATIVE_KINDS):
        s = sims[[p.kind == kind for p in pairs]]
        print(f"  {kind:<15} {s.mean():.3f} ({s.min():.3f}–{s.max():.3f})")
    print(
        f"\n{'threshold':>9}  {'tuning P':>8}  {'tuning R':>8}  {'tuning F0.5':>11}  "
        f"{'held-out P':>10}  {'held-out R':>10}  {'held-out F0.5':>13}"
    )
    best: tuple[float, float] | None = None  # (F0.5 on the tuning half, threshold)
    for t in np.round(np.arange(0.60, 1.0, 0.01), 2):
        tp_, tr_, tf_ = scores(sims[tune], positive[tune], t)
        hp_, hr_, hf_ = scores(sims[held], positive[held], t)
        if best is None or tf_ > best[0]:
            best = (tf_, float(t))
        print(f"{t:>9.2f}  {tp_:>8.3f}  {tr_:>8.3f}  {tf_:>11.3f}  {hp_:>10.3f}  {hr_:>10.3f}  {hf_:>13.3f}")
    assert best is not None
    chosen = best[1]
    hp, hr, hf = scores(sims[held], positive[held], chosen)
    print(
        f"\nchosen (best F0.5 on the tuning half): {chosen:.2f}; held-out precision {hp:.3f}, "
        f"recall {hr:.3f}, F0.5 {hf:.3f}"
    )
    for kind in NEGATIVE_KINDS:
        mask = held & np.array([p.kind == kind for p in pairs])
        print(f"  held-out {kind:<15} reported as near-duplicates: {(sims[mask] >= chosen).mean():.1%}")
    if args.index:
        embedder = make_embedder(Settings(embedding_model=args.embedding_model))
        threshold = getattr(embedder, "duplicate_similarity", None) or chosen
        anyio.run(shortlist_agreement, args.embedding_model, pairs, args.index, args.seed, threshold)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
