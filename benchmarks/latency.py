"""Latency and scale benchmark: HistoryMemory save throughput and recall latency vs N.

For each size N (default 1k, 10k, 100k) one *target* user holds N synthetic dialogue turns and
10 other users hold N/10 turns each, so the store holds 2N rows. Every system uses the real
all-MiniLM-L6-v2 embedder, and every measured recall includes embedding the query.

Systems (each runs in its own subprocess, so its peak RSS is its own):

* ``ours-persistent``: ``HistoryMemory(path=tmpdir)``, SQLite file + embedded persistent Chroma
  (the library default). Its ingest of the target user's N turns embeds every turn with the
  real model: that is the headline save throughput. The vectors it computes are written to a
  scratch file and reused by every other system (texts are embedded once per size).
* ``ours-memory``: ``HistoryMemory(path=None)``, SQLite ``:memory:`` + NumpyIndex.
* ``langchain-inmemory``: ``langchain_core`` ``InMemoryVectorStore`` used as a retriever with a
  per-user ``filter`` callable, as a LangChain user would write it.
* ``chroma-plain``: a bare Chroma ``PersistentClient`` collection (cosine space,
  ``embedding_function=None``) queried with ``query_embeddings`` and ``where={"user_id": ...}``.

For ours, ``hybrid`` is the public ``memory.recall(q, scope, k=5)``; ``dense`` and ``lexical``
are ``memory.retriever.search(q, user_id=..., k=5, where={"kind": "turn"}, mode=...)`` (the
filter recall itself applies). ``embed_query`` alone is timed as a reference.

Other users' turns are a random permutation of the target user's turns split into 10 parts
(same texts, so they need no extra embedding, and the user filter must separate identical
texts). Texts come from ~100 templates x prefixes x suffixes x vocabularies, seeded.

    nice -n 10 python benchmarks/latency.py                       # 1k, 10k, 100k (slow)
    nice -n 10 python benchmarks/latency.py --sizes 1000,10000
    nice -n 10 python benchmarks/latency.py --sizes 300 --queries 10 --name latency_dev  # trial
    python benchmarks/latency.py --report-only                    # redo md/png from JSON

torch runs with 1 intra-op thread by default (``--torch-threads``): on a shared, busy 2-core
machine 2 threads embedded about 2x slower and embedded queries about 5x slower.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from machine_info import machine

from memories_core.embedders.base import BaseEmbedder
from memories_core.interfaces import Embedder
from memories_core.retrieval import SearchMode

# First-stage figures (HistoryMemory reranks by default where the rerank extra is).
os.environ.setdefault("LLM_MEMORIES_LATE_INTERACTION", "off")

OUT = Path(__file__).resolve().parent / "out"
SYSTEMS = ("ours-persistent", "ours-memory", "chroma-plain", "langchain-inmemory")
TARGET = "target-user"
OTHER_USERS = 10
K = 5
BASE_TIME = datetime(2024, 1, 1, tzinfo=timezone.utc)

# --------------------------------------------------------------------------- synthetic data


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


NAMES = _words(
    "Maria Liam Olivia Noah Emma Mateo Ava Lucas Sofia Ethan Mia Arjun Priya Kenji Yuki Chen "
    "Fatima Omar Leila Tomas Ingrid Sven Chloe Pierre Amara Kwame Zara Diego Lucia Marco Hana "
    "Jonas Freya Rahul Aisha Daniel Grace Oscar Nina Felix"
)
RELATIONS = (
    "sister",
    "brother",
    "mom",
    "dad",
    "cousin",
    "best friend",
    "coworker",
    "neighbor",
    "roommate",
    "boss",
    "aunt",
    "uncle",
    "grandma",
    "son",
    "daughter",
)
PLACES = (
    *_words(
        "Lisbon Kyoto Denver Chicago Barcelona Seattle Oaxaca Reykjavik Nairobi Hanoi Toronto "
        "Berlin Marrakech Vienna Austin Portland Copenhagen Edinburgh Santiago Melbourne Dublin "
        "Prague Istanbul Havana Montreal Seoul Lima Bali Amsterdam Boston"
    ),
    "Lake Tahoe",
    "the Grand Canyon",
    "Yosemite",
    "the Alps",
    "Cape Town",
    "New Orleans",
    "San Diego",
    "the Scottish Highlands",
    "Mexico City",
    "Buenos Aires",
)
FOODS = (
    "sushi",
    "ramen",
    "tacos al pastor",
    "pad thai",
    "lasagna",
    "pho",
    "falafel",
    "dim sum",
    "paella",
    "butter chicken",
    "pierogi",
    "ceviche",
    "bibimbap",
    "croissants",
    "banana bread",
    "mushroom risotto",
    "lentil soup",
    "fish and chips",
    "shakshuka",
    "dumplings",
    "gelato",
    "cheesecake",
    "sourdough pizza",
    "vegan chili",
    "empanadas",
    "goulash",
    "tiramisu",
    "kimchi fried rice",
    "apple pie",
    "green curry",
    "poke bowls",
    "mac and cheese",
    "churros",
    "baklava",
    "miso soup",
    "brisket",
    "spring rolls",
    "quiche",
    "hummus",
    "peanut noodles",
)
HOBBIES = (
    "rock climbing",
    "pottery",
    "bird watching",
    "trail running",
    "chess",
    "knitting",
    "salsa dancing",
    "photography",
    "sourdough baking",
    "playing guitar",
    "painting watercolors",
    "kayaking",
    "gardening",
    "woodworking",
    "yoga",
    "surfing",
    "board games",
    "writing poetry",
    "scuba diving",
    "cycling",
    "learning Japanese",
    "playing the piano",
    "birding",
    "skateboarding",
    "fly fishing",
    "calligraphy",
    "stargazing",
    "volunteering at the shelter",
    "journaling",
    "tennis",
)
PETS = ("dog", "cat", "parrot", "rabbit", "hamster", "turtle", "goldfish", "corgi", "beagle")
PET_NAMES = _words("Biscuit Pepper Luna Milo Nala Ziggy Waffles Mochi Rufus Pickles Clover Juniper")
JOBS = (
    "nurse",
    "software engineer",
    "teacher",
    "architect",
    "chef",
    "accountant",
    "graphic designer",
    "physiotherapist",
    "data analyst",
    "librarian",
    "electrician",
    "journalist",
    "pharmacist",
    "barista",
    "veterinarian",
    "lawyer",
    "product manager",
    "carpenter",
)
EVENTS = (
    "wedding",
    "birthday party",
    "concert",
    "marathon",
    "job interview",
    "family reunion",
    "book club meeting",
    "graduation",
    "housewarming",
    "dentist appointment",
    "conference",
    "baby shower",
    "farmers market",
    "art exhibition",
    "camping trip",
)
MONTHS = _words(
    "January February March April May June July August September October November December"
)
DAYS = _words("Monday Tuesday Wednesday Thursday Friday Saturday Sunday")
GENRES = ("sci-fi", "mystery", "fantasy", "historical", "romance", "horror", "thriller")
THINGS = ("novel", "podcast", "documentary", "series", "album", "movie")

USER_TEMPLATES = (
    "I had {food} with my {rel} {name} at a tiny place in {place}",
    "My {rel} {name} just started a new job as a {job}",
    "I've been really into {hobby} lately, mostly on weekends",
    "We're planning a trip to {place} in {month} to celebrate my {rel}'s birthday",
    "I adopted a {pet} named {petname} from the shelter on {month} {day}",
    "{name} and I went {hobby2} near {place} last {weekday}",
    "I'm allergic to {food}, so I always ask before ordering",
    "My favorite food has to be {food}, especially the way my {rel} makes it",
    "I work as a {job}, and the night shifts are exhausting",
    "The {event} is on {month} {day}, and I still need a gift",
    "I finally finished that {genre} {thing} {name} recommended",
    "My {pet} {petname} knocked over the plant again this morning",
    "I tried making {food} from scratch and it was a disaster",
    "{name} is moving to {place} for a {job} position in {month}",
    "I signed up for a {hobby} class that meets every {weekday} evening",
    "My {rel} keeps sending me recipes for {food}",
    "We spent the whole weekend in {place} eating {food} and walking around",
    "I ran into {name} at the {event} and we talked for hours",
    "I'm thinking about quitting my job as a {job} to do something creative",
    "My {rel} {name} is getting married in {place} next {month}",
    "I've been saving up to go to {place} since {year}",
    "I hate {food}, I can't stand the smell of it",
    "Last {weekday} I took {petname} to the vet for a checkup",
    "{name} taught me {hobby} when we were roommates in {place}",
    "I'm hosting a {event} at my place on {month} {day}",
    "My {rel} and I argued about where to eat, {food} or {food2}",
    "I started {hobby} in {year} and never looked back",
    "I grew up in {place} but moved away when I was {age}",
    "I'm {age} years old and just started learning {hobby}",
    "My {rel} gave me a {genre} {thing} for my birthday",
    "I've been craving {food} all week, maybe because of the cold",
    "We missed our flight to {place} on {month} {day} and had to rebook",
    "{name} bakes the best {food} I've ever tasted",
    "I volunteer as a {job} at the community center every {weekday}",
    "My {pet} is {age} now and still acts like a puppy",
    "I lost my keys at the {event} and {name} helped me find them",
    "I want to learn {hobby} before my trip to {place}",
    "My {rel} works as a {job} in {place}",
    "We celebrated our anniversary with {food} and a walk by the river",
    "I can't decide between {place} and {place2} for the summer vacation",
    "I broke my wrist {hobby2} in {year}, so I'm careful now",
    "Every {weekday} my {rel} and I call each other for an hour",
    "I just booked tickets for the {event} in {place}",
    "{name} recommended a {genre} {thing} about {place}",
    "I'm trying to eat less {food} and more vegetables",
    "I named my {pet} {petname} after a character from a {genre} {thing}",
    "My first job was as a {job} in {place} back in {year}",
    "I haven't seen my {rel} {name} since the {event} in {month}",
    "We made {food} together at {name}'s {event}",
    "I'm nervous about my {event} on {weekday}",
    "My {rel} is visiting from {place} on {month} {day}",
    "I usually go {hobby2} with {name} on {weekday} mornings",
    "The best {food} I ever had was in {place}",
    "I'm learning to cook {food} for my {rel}'s {event}",
    "{name} lent me a {genre} {thing} and I still haven't returned it",
    "I got a promotion at work, I'm now a senior {job}",
    "I'm going to {place} with {name} for the {event}",
    "My {pet} {petname} loves chasing squirrels in the park",
    "I ate way too much {food} at the {event} yesterday",
    "I've been meaning to call {name} about the trip to {place}",
)
ASSISTANT_TEMPLATES = (
    "That sounds wonderful! How long have you been into {hobby}?",
    "{place} is lovely in {month}. Are you staying long?",
    "Congratulations to {name}! Being a {job} is a big change.",
    "Oh no, I hope {petname} is okay. Does your {pet} do that often?",
    "{food} is a great choice. Do you have a favorite place for it in {place}?",
    "That's a thoughtful gift idea for the {event}. What else is on your list?",
    "It sounds like your {rel} means a lot to you.",
    "A {genre} {thing} is perfect for a rainy {weekday}. What did you think of the ending?",
    "Good luck with the {event} on {month} {day}! I'm sure it will go well.",
    "Have you tried {hobby}? It might be a nice way to relax after work.",
    "I'll remember that you don't like {food}.",
    "Visiting {place} with {name} sounds like a great plan.",
    "Working as a {job} must be demanding. How do you unwind?",
    "Making {food} from scratch takes practice; the second try is usually better.",
    "It must be nice to have {name} close by again.",
    "Would you like some tips for traveling to {place} in {month}?",
    "How is {petname} settling in at home?",
    "That's a big milestone. Are you celebrating with your {rel}?",
    "Was the {food} in {place} better than the one at home?",
    "It sounds like the {event} was a lot of fun.",
    "Do you want me to remind you about the {event} on {month} {day}?",
    "{hobby} with friends is a great way to stay active.",
    "Your {rel} sounds like a great cook. Do they share recipes?",
    "How did you get started with {hobby} back in {year}?",
    "Many people find {place} surprisingly affordable in {month}.",
    "A {genre} {thing} recommendation from {name} is usually a good sign.",
    "What did {name} say about moving to {place}?",
    "That's frustrating. Did the airline help you rebook the trip to {place}?",
    "It's great that you volunteer every {weekday}.",
    "I hope your wrist healed well after the {hobby2} accident.",
)
PREFIXES = (
    "",
    "",
    "",
    "Oh, ",
    "By the way, ",
    "Honestly, ",
    "Funny thing, ",
    "So, ",
    "Guess what, ",
    "Just so you know, ",
    "Anyway, ",
    "Well, ",
)
SUFFIXES = (
    "",
    "",
    "",
    " It was amazing.",
    " I can't wait to do it again.",
    " Not sure how I feel about it.",
    " It made my whole week.",
    " What do you think?",
    " I should write that down.",
    " It was a bit stressful though.",
    " We laughed the entire time.",
    " I'll tell you more later.",
    " Remind me about it next month.",
    " It's been on my mind a lot.",
    " Totally worth it.",
)
QUERY_TEMPLATES = (
    "What food does my {rel} like?",
    "When is the {event}?",
    "What is my {pet}'s name?",
    "Where did I have {food}?",
    "What does {name} do for work?",
    "When am I going to {place}?",
    "What hobbies am I into?",
    "Which foods am I allergic to?",
    "Who recommended the {genre} {thing}?",
    "What did I do with {name} last {weekday}?",
    "Where does my {rel} work?",
    "What is my job?",
    "Where did I grow up?",
    "When did I start {hobby}?",
    "What happened at the {event}?",
    "Who taught me {hobby}?",
    "Did I ever visit {place}?",
    "What did {name} bake?",
    "Where is my {rel} {name} getting married?",
    "What gift did my {rel} give me?",
    "How old is my {pet}?",
    "Who is moving to {place}?",
    "What did I eat at the {event}?",
    "Which {thing} did {name} lend me?",
    "When is my {rel} visiting?",
    "Remind me what I said about {food}",
    "Who did I meet at the {event}?",
    "What class do I take on {weekday}?",
    "Tell me about my trip to {place} with {name}",
    "What do I usually do on {weekday} mornings?",
    "Have I talked about {hobby} before?",
    "What did I cook for my {rel}?",
    "Where did {name} and I go {hobby2}?",
    "When did I adopt {petname}?",
    "Which city did I choose for the summer vacation?",
    "What was my first job?",
    "Why am I nervous this week?",
    "What is {name}'s favorite food?",
    "What did the vet say about {petname}?",
    "Do I like {food}?",
)
ACTIVITIES = ("hiking", "kayaking", "cycling", "skiing", "climbing", "running", "surfing", "biking")


_ARTICLE = re.compile(r"\b([Aa]) ([aeiouAEIOU])")
_LOWER_OK = {"My", "We", "We're", "The", "Every", "Last"}


def _fill(template: str, rng: random.Random) -> str:
    places = rng.sample(PLACES, 2)
    foods = rng.sample(FOODS, 2)
    values = {
        "name": rng.choice(NAMES),
        "rel": rng.choice(RELATIONS),
        "place": places[0],
        "place2": places[1],
        "food": foods[0],
        "food2": foods[1],
        "hobby": rng.choice(HOBBIES),
        "hobby2": rng.choice(ACTIVITIES),
        "pet": rng.choice(PETS),
        "petname": rng.choice(PET_NAMES),
        "job": rng.choice(JOBS),
        "event": rng.choice(EVENTS),
        "month": rng.choice(MONTHS),
        "day": str(rng.randint(1, 28)),
        "weekday": rng.choice(DAYS),
        "genre": rng.choice(GENRES),
        "thing": rng.choice(THINGS),
        "year": str(rng.randint(2005, 2024)),
        "age": str(rng.randint(3, 70)),
    }
    text = _ARTICLE.sub(r"\1n \2", template.format(**values))
    return text[0].upper() + text[1:]


def make_turns(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` deterministic ``(role, content)`` turns of 10-25 words (mostly user turns)."""
    rng = random.Random(seed)
    turns: list[tuple[str, str]] = []
    while len(turns) < n:
        if rng.random() < 0.6:
            role, base = "user", _fill(rng.choice(USER_TEMPLATES), rng)
            prefix, suffix = rng.choice(PREFIXES), rng.choice(SUFFIXES)
            lower = prefix and base.split()[0] in _LOWER_OK
            core = (base[0].lower() + base[1:]) if lower else base
            text = f"{prefix}{core}.{suffix}".replace("?.", "?")
        else:
            role, text = "assistant", _fill(rng.choice(ASSISTANT_TEMPLATES), rng)
        words = len(text.split())
        if words > 25:
            continue
        while words < 10:
            text += rng.choice(SUFFIXES[3:])
            words = len(text.split())
        turns.append((role, text))
    return turns


def make_queries(n: int, seed: int) -> list[str]:
    """``n`` deterministic questions about the target user's memories."""
    rng = random.Random(seed + 7919)
    queries: dict[str, None] = {}
    while len(queries) < n:
        queries.setdefault(_fill(rng.choice(QUERY_TEMPLATES), rng), None)
    return list(queries)


def others_layout(n: int, seed: int) -> list[tuple[str, list[int]]]:
    """Which target turns each other user holds: a permutation of ``range(n)`` in 10 parts."""
    order = list(range(n))
    random.Random(seed + 104729).shuffle(order)
    per = n // OTHER_USERS
    return [(f"other-{u:02d}", order[u * per : (u + 1) * per]) for u in range(OTHER_USERS)]


def render(role: str, content: str) -> str:
    """The record text HistoryMemory stores for a turn (``Turn.render``)."""
    return f"{role}: {content}"


# --------------------------------------------------------------------------- embedding


class VectorBank(BaseEmbedder):
    """Wraps the real embedder: documents come from a text -> vector table, queries are real.

    In ``record`` mode every document batch goes to the real model (nothing is skipped, so a
    timed save pays the full embedding cost) and the vectors are kept; otherwise known texts
    are looked up and only unknown ones are embedded. ``embed_query`` always runs the model.
    Same ``name``/``dimension`` as the wrapped embedder.
    """

    def __init__(self, inner: Embedder, *, record: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.record = record
        self.table: dict[str, npt.NDArray[np.float32]] = {}
        self.embed_seconds = 0.0
        self.embedded = 0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    def load(self, texts: Sequence[str], matrix: npt.NDArray[np.float32]) -> None:
        for text, row in zip(texts, matrix, strict=True):
            self.table[text] = row

    def _real(self, texts: list[str]) -> npt.NDArray[np.float32]:
        start = time.perf_counter()
        vectors = self.inner.embed_documents(texts)
        self.embed_seconds += time.perf_counter() - start
        self.embedded += len(texts)
        for text, row in zip(texts, vectors, strict=True):
            self.table[text] = row
        return vectors

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        if self.record:
            return self._real(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in self.table))
        if missing:
            self._real(missing)
        return np.stack([self.table[t] for t in texts])

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        return self.inner.embed_query(text)


def real_embedder(threads: int, query_runtime: str = "auto") -> Embedder:
    """The library's default embedder (all-MiniLM-L6-v2, offline), loaded and warmed up.

    With ``query_runtime="auto"`` the onnxruntime query pass is made ready before anything
    is timed (it exports once per machine in the background otherwise), so every timed
    query runs where a user's warm process runs it; the runtime used is printed.
    """
    import torch

    from memories_core.embedders import SentenceTransformerEmbedder

    if threads > 0:
        torch.set_num_threads(threads)
    embedder = SentenceTransformerEmbedder(query_runtime=query_runtime)  # type: ignore[arg-type]
    print("query runtime:", embedder.prepare_query_runtime(), flush=True)
    embedder.embed_query("warm up the model")
    return embedder


def vectors_for(
    texts: Sequence[str], workdir: Path, bank: VectorBank, *, progress: bool = True
) -> npt.NDArray[np.float32]:
    """The target texts' vectors: from ``workdir/vectors.npy``, else embedded now and saved."""
    file = workdir / "vectors.npy"
    if file.exists():
        matrix = np.load(file)
        bank.load(texts, matrix)
        return matrix
    from tqdm.auto import tqdm

    unique = list(dict.fromkeys(texts))
    for start in tqdm(range(0, len(unique), 512), desc="embedding", disable=not progress):
        bank._real(unique[start : start + 512])
    matrix = np.stack([bank.table[t] for t in texts])
    np.save(file, matrix)
    return matrix


# --------------------------------------------------------------------------- measuring


def rss_mib() -> float:
    """Current resident set size in MiB."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stats_ms(samples: Sequence[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "n": len(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "mean_ms": statistics.fmean(ms),
        "min_ms": ms[0],
        "max_ms": ms[-1],
    }


def time_queries(
    funcs: dict[str, Callable[[str], Any]],
    texts_of: Callable[[str, Any], list[str]],
    queries: Sequence[str],
    warmup: Sequence[str],
    *,
    budget: float,
    min_queries: int,
    keep: int = 50,
) -> dict[str, Any]:
    """Time every function on every query, interleaved (load noise hits all alike).

    Stops early once ``budget`` seconds have passed and ``min_queries`` queries are done.
    Keeps the top-k texts of the first ``keep`` queries, to compare systems' results.
    """
    for query in warmup:
        for func in funcs.values():
            func(query)
    samples: dict[str, list[float]] = {name: [] for name in funcs}
    tops: dict[str, list[list[str]]] = {name: [] for name in funcs}
    start = time.perf_counter()
    for i, query in enumerate(queries):
        for name, func in funcs.items():
            t0 = time.perf_counter()
            result = func(query)
            samples[name].append(time.perf_counter() - t0)
            if i < keep:
                tops[name].append(texts_of(name, result))
        if time.perf_counter() - start > budget and i + 1 >= min_queries:
            break
    return {name: {**stats_ms(values), "top_texts": tops[name]} for name, values in samples.items()}


# --------------------------------------------------------------------------- workers


def _turn_objects(pairs: Sequence[tuple[str, str]], offsets: Sequence[int]) -> list[Any]:
    from memories_core import Turn

    return [
        Turn(role, content, timestamp=BASE_TIME + timedelta(seconds=offset))
        for (role, content), offset in zip(pairs, offsets, strict=True)
    ]


def worker_ours(args: argparse.Namespace, persistent: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from memories_core import HistoryMemory, Scope

    n, workdir = args.size, Path(args.workdir)
    pairs = make_turns(n, args.seed)
    texts = [render(r, c) for r, c in pairs]
    embedder = real_embedder(args.torch_threads)
    cache = OUT / "cache" / f"latency_vectors_{n}_{args.seed}.npy"
    reuse = bool(args.cached_vectors) and cache.exists()
    bank = VectorBank(embedder, record=persistent and not reuse)
    if reuse:
        # Recall latency only: the turns' vectors come from an earlier run's cache, so the
        # save throughput of this run excludes embedding (reported as such).
        bank.load(texts, np.load(cache))
    elif not persistent:
        vectors_for(texts, workdir, bank)
    rss_start = rss_mib()
    memory = HistoryMemory(
        path=workdir / "ours-persistent" if persistent else None, embedder=bank, k=K
    )
    scope = Scope(TARGET)
    batch = args.batch

    # 1. the target user's N turns, in save() calls of `batch` turns
    bar = tqdm(total=n, desc=f"save target N={n}", unit="turn")
    start = time.perf_counter()
    for lo in range(0, n, batch):
        chunk = _turn_objects(pairs[lo : lo + batch], range(lo, min(lo + batch, n)))
        memory.save(chunk, scope)
        bar.update(len(chunk))
    target_seconds = time.perf_counter() - start
    bar.close()
    embed_seconds, embedded = bank.embed_seconds, bank.embedded
    if persistent:
        matrix = np.stack([bank.table[t] for t in texts])
        np.save(workdir / "vectors.npy", matrix)
        if not reuse:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.save(cache, matrix)
        bank.record = False  # other users' texts are the same texts: look them up

    # 2. the 10 other users' N/10 turns each (vectors known: storage cost only)
    bar = tqdm(total=n // OTHER_USERS * OTHER_USERS, desc="save others", unit="turn")
    start = time.perf_counter()
    others = 0
    for user, rows in others_layout(n, args.seed):
        for lo in range(0, len(rows), batch):
            part = rows[lo : lo + batch]
            memory.save(_turn_objects([pairs[i] for i in part], part), Scope(user))
            bar.update(len(part))
            others += len(part)
    others_seconds = time.perf_counter() - start
    bar.close()
    rss_loaded = rss_mib()

    def search(mode: SearchMode) -> Callable[[str], Any]:
        def run(query: str) -> Any:
            return memory.retriever.search(
                query, user_id=TARGET, k=K, where={"kind": "turn"}, mode=mode
            )

        return run

    funcs: dict[str, Callable[[str], Any]] = {"hybrid": lambda q: memory.recall(q, scope, k=K)}
    extra: dict[str, Any] = {}
    if args.previous_default:
        from memories_core.retrieval import FusionConfig

        # The earlier default (context spreading only, no boosts), timed interleaved with it.
        previous = FusionConfig(temporal_weight=0.0, entity_weight=0.0)
        funcs["hybrid, previous default"] = lambda q: memory.engine.search(
            q, TARGET, k=K, kinds=["turn"], fusion=previous
        )
    if args.without_question_rule:
        from memories_core.retrieval import FusionConfig

        # The default without the question-answer rule, timed interleaved with it.
        plain = FusionConfig(after_question_weight=None, question_weight=1.0)
        funcs["hybrid, without question rule"] = lambda q: memory.engine.search(
            q, TARGET, k=K, kinds=["turn"], fusion=plain
        )
    if args.late_interaction:
        from memories_core.retrieval import FusionConfig
        from memories_core.retrieval.late_interaction import (
            DEFAULT_CACHE_BYTES,
            late_interaction_pipeline,
            late_interaction_reranker,
        )

        # The default pipeline + the optional late-interaction reranker with its defaults.
        # Without --late-prefetch its token-vector cache starts empty, so a query pays for
        # the candidates no earlier query ranked; with it, every record of the target user
        # is encoded first (timed) into a cache big enough for all of them.
        reranker = late_interaction_reranker(
            cache_bytes=(1 << 30) if args.late_prefetch else DEFAULT_CACHE_BYTES
        )
        late = late_interaction_pipeline(FusionConfig().pipeline(), reranker)
        if args.late_prefetch:
            began = time.perf_counter()
            extra["late_prefetched"] = memory.engine.prefetch(TARGET, late, progress=True)
            extra["late_prefetch_seconds"] = round(time.perf_counter() - began, 1)
            extra["late_cache_mib"] = round(reranker.cache.nbytes / 2**20, 1)
            print(f"prefetch: {extra}", flush=True)
        funcs["hybrid + late interaction"] = lambda q: memory.engine.search(
            q, TARGET, k=K, kinds=["turn"], pipeline=late
        )
    funcs.update({mode: search(cast(SearchMode, mode)) for mode in args.modes if mode != "hybrid"})
    if not persistent:
        funcs["embed_query"] = embedder.embed_query

    leaks = 0

    def texts_of(name: str, result: Any) -> list[str]:
        nonlocal leaks
        if name == "embed_query":
            return []
        hits = result.records if name == "hybrid" else result
        if name in (
            "hybrid, previous default",
            "hybrid, without question rule",
            "hybrid + late interaction",
        ):
            hits = result
        leaks += sum(hit.record.user_id != TARGET for hit in hits)
        return [hit.record.text for hit in hits]

    queries = make_queries(args.queries + args.warmup, args.seed)
    recall = time_queries(
        funcs,
        texts_of,
        queries[args.warmup :],
        queries[: args.warmup],
        budget=args.budget,
        min_queries=args.min_queries,
    )
    rows_in_store = memory.store.count()
    vectors_in_index = memory.index.count()
    memory.close()
    return {
        "save": {
            "target_turns": n,
            "target_seconds": target_seconds,
            "target_turns_per_s": n / target_seconds,
            "target_embed_seconds": embed_seconds,
            "target_embedded_texts": embedded,
            "target_embedding_included": persistent,
            "others_turns": others,
            "others_seconds": others_seconds,
            "others_turns_per_s": others / others_seconds if others_seconds else None,
            "batch": batch,
        },
        "recall": recall,
        "checks": {
            "rows_in_store": rows_in_store,
            "vectors_in_index": vectors_in_index,
            "foreign_hits": leaks,
        },
        "rss_mib": {"start": rss_start, "loaded": rss_loaded, "peak": peak_rss_mib()},
        **extra,
    }


def worker_chroma(args: argparse.Namespace) -> dict[str, Any]:
    import chromadb
    from chromadb.config import Settings

    n, workdir = args.size, Path(args.workdir)
    pairs = make_turns(n, args.seed)
    texts = [render(r, c) for r, c in pairs]
    embedder = real_embedder(args.torch_threads)
    matrix = vectors_for(texts, workdir, VectorBank(embedder))
    rss_start = rss_mib()
    client = chromadb.PersistentClient(
        path=str(workdir / "chroma-plain"), settings=Settings(anonymized_telemetry=False)
    )
    collection = client.create_collection(
        "bench", configuration={"hnsw": {"space": "cosine"}}, embedding_function=None
    )
    rows = [(TARGET, i) for i in range(n)]
    rows += [(user, i) for user, part in others_layout(n, args.seed) for i in part]
    step = client.get_max_batch_size()
    start = time.perf_counter()
    for lo in range(0, len(rows), step):
        chunk = rows[lo : lo + step]
        collection.add(
            ids=[f"{user}/{i}" for user, i in chunk],
            embeddings=matrix[[i for _, i in chunk]],
            documents=[texts[i] for _, i in chunk],
            metadatas=[{"user_id": user, "role": pairs[i][0]} for user, i in chunk],
        )
    add_seconds = time.perf_counter() - start
    rss_loaded = rss_mib()

    def query(q: str) -> Any:
        return collection.query(
            query_embeddings=[embedder.embed_query(q)],  # type: ignore[arg-type]
            where={"user_id": TARGET},
            n_results=K,
        )

    leaks = 0

    def texts_of(name: str, result: Any) -> list[str]:
        nonlocal leaks
        leaks += sum(meta["user_id"] != TARGET for meta in result["metadatas"][0])
        return list(result["documents"][0])

    queries = make_queries(args.queries + args.warmup, args.seed)
    recall = time_queries(
        {"dense": query},
        texts_of,
        queries[args.warmup :],
        queries[: args.warmup],
        budget=args.budget,
        min_queries=args.min_queries,
    )
    return {
        "save": {"rows": len(rows), "add_seconds": add_seconds, "embedding_included": False},
        "recall": recall,
        "checks": {"rows_in_store": collection.count(), "foreign_hits": leaks},
        "rss_mib": {"start": rss_start, "loaded": rss_loaded, "peak": peak_rss_mib()},
    }


def worker_langchain(args: argparse.Namespace) -> dict[str, Any]:
    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_memories.bridges import CoreEmbeddings

    n, workdir = args.size, Path(args.workdir)
    pairs = make_turns(n, args.seed)
    texts = [render(r, c) for r, c in pairs]
    embedder = real_embedder(args.torch_threads)
    bank = VectorBank(embedder)
    vectors_for(texts, workdir, bank)
    rss_start = rss_mib()
    # Documents are embedded through the public add_documents path, but the bank answers from
    # the precomputed vectors; queries go to the real model (CoreEmbeddings.embed_query).
    store = InMemoryVectorStore(CoreEmbeddings(bank))
    rows = [(TARGET, i) for i in range(n)]
    rows += [(user, i) for user, part in others_layout(n, args.seed) for i in part]
    start = time.perf_counter()
    for lo in range(0, len(rows), 5000):
        chunk = rows[lo : lo + 5000]
        store.add_documents(
            [
                Document(page_content=texts[i], metadata={"user_id": user, "role": pairs[i][0]})
                for user, i in chunk
            ],
            ids=[f"{user}/{i}" for user, i in chunk],
        )
    add_seconds = time.perf_counter() - start
    rss_loaded = rss_mib()
    retriever = store.as_retriever(
        search_kwargs={"k": K, "filter": lambda doc: doc.metadata["user_id"] == TARGET}
    )
    leaks = 0

    def texts_of(name: str, result: Any) -> list[str]:
        nonlocal leaks
        leaks += sum(doc.metadata["user_id"] != TARGET for doc in result)
        return [doc.page_content for doc in result]

    queries = make_queries(args.queries + args.warmup, args.seed)
    recall = time_queries(
        {"dense": retriever.invoke},
        texts_of,
        queries[args.warmup :],
        queries[: args.warmup],
        budget=args.budget,
        min_queries=args.min_queries,
    )
    return {
        "save": {"rows": len(rows), "add_seconds": add_seconds, "embedding_included": False},
        "recall": recall,
        "checks": {"rows_in_store": len(store.store), "foreign_hits": leaks},
        "rss_mib": {"start": rss_start, "loaded": rss_loaded, "peak": peak_rss_mib()},
    }


def run_worker(args: argparse.Namespace) -> None:
    load_before = os.getloadavg()
    if args.worker == "ours-persistent":
        result = worker_ours(args, persistent=True)
    elif args.worker == "ours-memory":
        result = worker_ours(args, persistent=False)
    elif args.worker == "chroma-plain":
        result = worker_chroma(args)
    elif args.worker == "langchain-inmemory":
        result = worker_langchain(args)
    else:
        raise SystemExit(f"unknown worker {args.worker!r}")
    result["loadavg"] = {"before": load_before[0], "after": os.getloadavg()[0]}
    Path(args.result).write_text(json.dumps(result))


# --------------------------------------------------------------------------- orchestration


def save_results(
    name: str,
    result: dict[str, Any] | None,
    report: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], None],
) -> dict[str, Any]:
    """Write ``OUT/<name>.json`` (unless ``result`` is ``None``: read it back) and its md/png.

    ``None`` is ``--report-only``: the saved JSON is drawn again with today's report and plot.
    """
    OUT.mkdir(parents=True, exist_ok=True)
    if result is None:
        result = dict(json.loads((OUT / f"{name}.json").read_text()))
    else:
        (OUT / f"{name}.json").write_text(json.dumps(result, indent=2))
    (OUT / f"{name}.md").write_text(report(result))
    plot(result, OUT / f"{name}.png")
    return result


def add_output_options(parser: argparse.ArgumentParser, name: str) -> None:
    """``--name`` (the stem of ``OUT/<name>.{json,md,png}``) and ``--report-only``."""
    parser.add_argument("--name", default=name)
    parser.add_argument("--report-only", action="store_true", help="redo md/png from the JSON")


def run_or_redraw(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], None],
) -> None:
    """Run, save and print the report; with ``--report-only``, draw the saved JSON again."""
    if args.report_only:
        save_results(args.name, None, report, plot)
        return
    result = run(args)
    save_results(args.name, result, report, plot)
    print(report(result))


def command_line() -> str:
    """This process's command as results record it (``machine_info.nice_command_line``)."""
    from machine_info import nice_command_line, portable_path

    return nice_command_line(portable_path(sys.argv[0]), sys.argv[1:])


def overlap(a: list[list[str]], b: list[list[str]]) -> float | None:
    """Mean fraction of shared top-k texts between two systems over the same queries."""
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if x and y]
    if not pairs:
        return None
    return statistics.fmean(
        sum((Counter(x) & Counter(y)).values()) / max(len(x), len(y)) for x, y in pairs
    )


def orchestrate(args: argparse.Namespace) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    json_path = OUT / f"{args.name}.json"
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    report: dict[str, Any] = {
        "machine": machine(),
        "command": command_line(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": {
            "sizes": sizes,
            "systems": systems,
            "k": K,
            "queries": args.queries,
            "warmup": args.warmup,
            "budget_s": args.budget,
            "min_queries": args.min_queries,
            "batch": args.batch,
            "torch_threads": args.torch_threads,
            "seed": args.seed,
            "other_users": OTHER_USERS,
        },
        "results": {},
    }
    for n in sizes:
        workdir = Path(tempfile.mkdtemp(prefix=f"latency-{n}-"))
        report["results"][str(n)] = {}
        try:
            for system in systems:
                result_file = workdir / f"{system}.json"
                cmd = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--worker",
                    system,
                    "--size",
                    str(n),
                    "--workdir",
                    str(workdir),
                    "--result",
                    str(result_file),
                    "--seed",
                    str(args.seed),
                    "--queries",
                    str(args.queries),
                    "--warmup",
                    str(args.warmup),
                    "--budget",
                    str(args.budget),
                    "--min-queries",
                    str(args.min_queries),
                    "--batch",
                    str(args.batch),
                    "--torch-threads",
                    str(args.torch_threads),
                    *(["--cached-vectors"] if args.cached_vectors else []),
                    *(["--previous-default"] if args.previous_default else []),
                    *(["--without-question-rule"] if args.without_question_rule else []),
                    *(["--late-interaction"] if args.late_interaction else []),
                    *(["--late-prefetch"] if args.late_prefetch else []),
                    "--modes",
                    ",".join(args.modes),
                ]
                print(f"\n=== N={n} {system} ===", flush=True)
                start = time.perf_counter()
                done = subprocess.run(cmd, check=False)
                wall = time.perf_counter() - start
                if done.returncode != 0 or not result_file.exists():
                    report["results"][str(n)][system] = {"error": f"exit {done.returncode}"}
                    print(f"!!! {system} failed with exit code {done.returncode}", flush=True)
                    continue
                result = json.loads(result_file.read_text())
                result["wall_seconds"] = wall
                report["results"][str(n)][system] = result
                print(system_lines(n, system, result), flush=True)
                json_path.write_text(json.dumps(report, indent=1))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    report["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    add_overlaps(report)
    json_path.write_text(json.dumps(report, indent=1))
    write_outputs(report, args.name)


def add_overlaps(report: dict[str, Any]) -> None:
    """Agreement of each system's top-5 with the exact dense search (ours-memory, numpy)."""
    for by_system in report["results"].values():
        exact = by_system.get("ours-memory", {}).get("recall", {}).get("dense", {})
        reference = exact.get("top_texts")
        for result in by_system.values():
            for row in result.get("recall", {}).values():
                if reference and row.get("top_texts"):
                    row["overlap_with_exact_dense"] = overlap(row["top_texts"], reference)


def system_lines(n: int, system: str, result: dict[str, Any]) -> str:
    out = []
    for mode, row in result["recall"].items():
        out.append(
            f"  {system:20s} {mode:12s} p50 {row['p50_ms']:8.1f} ms  p95 {row['p95_ms']:8.1f} ms"
            f"  mean {row['mean_ms']:8.1f} ms  (n={row['n']})"
        )
    save = result["save"]
    if "target_turns_per_s" in save:
        out.append(
            f"  save target {save['target_turns_per_s']:.1f} turns/s, "
            f"others {save['others_turns_per_s']:.1f} turns/s"
        )
    out.append(f"  peak RSS {result['rss_mib']['peak']:.0f} MiB; checks {result['checks']}")
    return "\n".join(out)


# --------------------------------------------------------------------------- outputs

LABELS = {
    ("ours-persistent", "hybrid"): "ours path= (SQLite+Chroma), hybrid recall",
    ("ours-persistent", "hybrid, previous default"): "ours path=, recall with the earlier "
    "default pipeline (interleaved)",
    ("ours-persistent", "hybrid, without question rule"): "ours path=, recall without the "
    "question-answer context rule (interleaved)",
    ("ours-persistent", "hybrid + late interaction"): "ours path=, recall + the optional "
    "late-interaction reranker (`late_interaction_pipeline()`; token-vector cache empty at "
    "start unless prefetched, see below; interleaved)",
    ("ours-persistent", "dense"): "ours path=, dense search",
    ("ours-persistent", "lexical"): "ours path=, lexical search",
    ("ours-memory", "hybrid"): "ours in-memory (SQLite+numpy), hybrid recall",
    ("ours-memory", "dense"): "ours in-memory, dense search",
    ("ours-memory", "lexical"): "ours in-memory, lexical search",
    ("ours-memory", "embed_query"): "embed_query alone (reference)",
    ("chroma-plain", "dense"): "plain Chroma collection, where user_id",
    ("langchain-inmemory", "dense"): "LangChain InMemoryVectorStore retriever, filter",
}


def label(system: str, mode: str) -> str:
    return LABELS.get((system, mode), f"{system} {mode}")


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def recall_table(n: str, by_system: dict[str, Any]) -> list[str]:
    lines = [
        f"**N = {int(n):,}** target-user records ({2 * int(n):,} rows in the store), k = {K}",
        "",
        "| system | p50 ms | p95 ms | mean ms | queries | top-5 overlap w/ exact dense |"
        " peak RSS MiB | RSS growth MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, result in by_system.items():
        if "error" in result:
            lines.append(f"| {system} | failed: {result['error']} | | | | | | |")
            continue
        rss = result["rss_mib"]
        for mode, row in result["recall"].items():
            lines.append(
                f"| {label(system, mode)} | {fmt(row['p50_ms'])} | {fmt(row['p95_ms'])} | "
                f"{fmt(row['mean_ms'])} | {row['n']} | "
                f"{fmt(row.get('overlap_with_exact_dense'), 2)} | {fmt(rss['peak'], 0)} | "
                f"{fmt(rss['peak'] - rss['start'], 0)} |"
            )
        if "late_prefetch_seconds" in result:
            lines.append(
                f"| ({system}: before timing, `engine.prefetch` encoded "
                f"{result['late_prefetched']:,} records in {result['late_prefetch_seconds']} s "
                f"into a {result['late_cache_mib']} MiB token-vector cache) | | | | | | | |"
            )
    return lines


def save_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| N | system | target ingest turns/s | of which embedding s / total s |"
        " other users' ingest turns/s (vectors known) |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    for n, by_system in results.items():
        for system in ("ours-persistent", "ours-memory"):
            result = by_system.get(system)
            if not result or "error" in result:
                continue
            save = result["save"]
            embedding = save["target_embedding_included"]
            rate = fmt(save["target_turns_per_s"])
            lines.append(
                f"| {int(n):,} | {system} | {rate}{'' if embedding else ' (vectors known)'} | "
                f"{fmt(save['target_embed_seconds'])} / {fmt(save['target_seconds'])} | "
                f"{fmt(save['others_turns_per_s'])} |"
            )
    return lines


def targets(results: dict[str, Any]) -> list[str]:
    lines = []

    def p50(n: int, system: str) -> float | None:
        row = results.get(str(n), {}).get(system, {}).get("recall", {}).get("hybrid")
        return None if row is None else float(row["p50_ms"])

    for n, limit in ((10_000, 50.0), (100_000, 150.0)):
        for system in ("ours-persistent", "ours-memory"):
            value = p50(n, system)
            verdict = "not measured" if value is None else ("met" if value <= limit else "NOT met")
            lines.append(
                f"- recall p50 <= {limit:.0f} ms at {n:,} records, {system}: "
                f"{fmt(value)} ms: **{verdict}**"
            )
    for size, by_system in results.items():
        save = by_system.get("ours-persistent", {}).get("save")
        if save:
            value = save["target_turns_per_s"]
            verdict = "met" if value >= 150 else "NOT met"
            lines.append(
                f"- bulk save >= 150 turns/s (embedding included) at N = {int(size):,}: "
                f"{value:.1f} turns/s: **{verdict}**"
            )
    return lines


def write_outputs(report: dict[str, Any], name: str) -> None:
    results = report["results"]
    m = report["machine"]
    loads = [
        r["loadavg"]["before"]
        for by in results.values()
        for r in by.values()
        if isinstance(r, dict) and "loadavg" in r
    ]
    md = [
        "## Latency and scale (HistoryMemory, all-MiniLM-L6-v2)",
        "",
        f"Machine: {m['nproc']} cores (`nproc`), {m['cpu']}, {m['ram_gib']} GiB RAM; "
        f"Python {m['python']}, SQLite {m['sqlite']}, "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f". torch threads: {report['settings']['torch_threads']} (`--torch-threads`; on "
        "this busy box 2 threads embedded about 2x slower than 1). "
        + (
            f"The machine was shared: 1-minute load average {min(loads):.1f}-{max(loads):.1f} "
            "during the run, so absolute numbers are pessimistic and noisy."
            if loads
            else ""
        ),
        "",
        f"Command: `{report['command']}`",
        "",
        "One target user with N turns plus 10 other users with N/10 turns each (2N rows). "
        f"Recall: {report['settings']['queries']} queries after {report['settings']['warmup']} "
        f"warm-ups (fewer if a system exceeded the {report['settings']['budget_s']:.0f} s "
        "budget), k = 5, query embedding included in every dense and hybrid row, systems timed "
        "interleaved per "
        "query. Baselines reuse the vectors computed during our ingest (same embedder, same "
        "texts); queries are embedded by the real model in every system. Each system runs in "
        "its own process; RSS growth = peak RSS minus RSS after loading the model and data. "
        '"dense" and "lexical" rows are `memory.retriever.search(..., mode=...)` (lexical '
        'embeds no query). Compare rows with "embed_query alone" of the same N: the '
        "difference is the memory's own cost; on a shared box the embedding share moves with "
        "the load.",
        "",
        "### Recall latency",
        "",
    ]
    for n, by_system in results.items():
        md += [*recall_table(n, by_system), ""]
    md += [
        "### Save throughput (HistoryMemory.save, no LLM, "
        f"{report['settings']['batch']} turns per call)",
        "",
        *save_table(results),
        "",
        "### Targets",
        "",
        *targets(results),
        "",
    ]
    text = "\n".join(md)
    (OUT / f"{name}.md").write_text(text)
    print("\n" + text)
    plot(report, name)


def plot(report: dict[str, Any], name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    sizes = sorted(int(n) for n in results)
    fig, (ax50, ax95, axsave) = plt.subplots(1, 3, figsize=(18, 5.5))
    series: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    for n in sizes:
        for system, result in results[str(n)].items():
            for mode, row in result.get("recall", {}).items():
                series.setdefault((system, mode), {})[n] = row
    for (system, mode), points in series.items():
        xs = sorted(points)
        if mode == "embed_query":
            style = "--"
        elif system.startswith("ours") and mode != "hybrid":
            style = ":"
        else:
            style = "-"
        for ax, key in ((ax50, "p50_ms"), (ax95, "p95_ms")):
            ax.plot(xs, [points[x][key] for x in xs], style, marker="o", label=label(system, mode))
    for ax, title in ((ax50, "recall p50"), (ax95, "recall p95")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("records of the target user (store holds 2N)")
        ax.set_ylabel("ms (query embedding included, except lexical)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax50.axhline(50, color="grey", lw=0.8, ls="--")
    ax50.axhline(150, color="grey", lw=0.8, ls="--")
    ax95.legend(fontsize=7, loc="upper left")
    width = 0.38
    for offset, (system, key, legend) in enumerate(
        (
            ("ours-persistent", "target_turns_per_s", "path=, embedding included"),
            ("ours-memory", "target_turns_per_s", "in-memory, vectors known"),
        )
    ):
        bar_x: list[float] = []
        bar_y: list[float] = []
        for i, n in enumerate(sizes):
            save = results[str(n)].get(system, {}).get("save")
            if save:
                bar_x.append(i + (offset - 0.5) * width)
                bar_y.append(save[key])
        axsave.bar(bar_x, bar_y, width, label=legend)
    axsave.set_xticks(range(len(sizes)), [f"{n:,}" for n in sizes])
    axsave.set_yscale("log")
    axsave.axhline(150, color="grey", lw=0.8, ls="--", label="target 150 turns/s")
    axsave.set_title("HistoryMemory.save throughput (turns/s)")
    axsave.set_xlabel("N")
    axsave.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / f"{name}.png", dpi=120)


# --------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--modes", default="hybrid,dense,lexical", type=lambda s: s.split(","))
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--budget", type=float, default=120.0, help="seconds of timed queries per system"
    )
    parser.add_argument("--min-queries", type=int, default=30)
    parser.add_argument("--batch", type=int, default=500, help="turns per save() call")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (0 = torch default); 1 is faster on a busy shared box",
    )
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--name",
        default="latency",
        help="output files benchmarks/out/<name>.{json,md,png}; e.g. latency_dev for trials",
    )
    parser.add_argument("--report-only", action="store_true", help="redo md/png from the JSON")
    parser.add_argument(
        "--cached-vectors",
        action="store_true",
        help="reuse the turns' vectors of an earlier run (benchmarks/out/cache); recall only",
    )
    parser.add_argument(
        "--previous-default",
        action="store_true",
        help="also time recall with the earlier default pipeline (no boosts), interleaved",
    )
    parser.add_argument(
        "--without-question-rule",
        action="store_true",
        help="also time recall without the question-answer context rule, interleaved",
    )
    parser.add_argument(
        "--late-interaction",
        action="store_true",
        help="also time recall with the optional late-interaction reranker, interleaved",
    )
    parser.add_argument(
        "--late-prefetch",
        action="store_true",
        help="with --late-interaction: encode every record of the target user first (timed)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args)
    elif args.report_only:
        report = json.loads((OUT / f"{args.name}.json").read_text())
        add_overlaps(report)
        write_outputs(report, args.name)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
