"""Scripted patient-doctor dialogues for the DPeM / MaLP benchmarks (deterministic, offline).

Two patients with different histories and different answer styles, in the spirit of the
paper's medical dataset (Zhang et al., "Data Construction"):

* ``ann``: type 2 diabetes, prefers concise advice; the doctor answers in one or two short
  sentences that end with her recurring reminder.
* ``bob``: asthma, wants full explanations; the doctor answers at length.

Some facts recur across sessions (the flag table's recurrences); symptoms vary.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from memories_core.types import Turn

T0 = datetime(2024, 1, 8, 9, 0, tzinfo=timezone.utc)

ANN_FACTS = [
    "I have type 2 diabetes.",
    "I prefer short, concise advice.",
    "I take metformin every morning.",
]
ANN_SYMPTOMS = [
    ("My feet tingle at night.", "Check your feet daily and keep your sugar steady."),
    ("I feel tired after lunch.", "Walk ten minutes after meals. Keep your sugar steady."),
    ("My skin is dry and itchy.", "Moisturise twice a day. Keep your sugar steady."),
    ("I am thirsty all the time.", "Test your sugar today. Drink water, not juice."),
    ("Can I eat rice for dinner?", "A small portion, with vegetables. Keep your sugar steady."),
    ("A cut on my toe heals slowly.", "Clean it daily and see a nurse if it reddens."),
    ("I get dizzy when I skip breakfast.", "Do not skip meals on metformin. Eat a snack."),
    ("My vision is blurry some mornings.", "Book an eye check; high sugar blurs vision."),
    ("Is fruit allowed?", "Yes, whole fruit in small portions. Skip juice."),
    ("I forgot my pill yesterday.", "Take today's dose as usual. Do not double it."),
    ("My legs cramp at night.", "Stretch before bed and drink water. Mention it at your check."),
    ("I want to start jogging.", "Good idea. Carry a snack and test your sugar first."),
]
BOB_FACTS = [
    "I have had asthma since childhood.",
    "Please explain things in detail, I like to understand why.",
]
BOB_SYMPTOMS = [
    (
        "I wheeze when it gets cold outside.",
        "Cold air narrows the airways of people with asthma, because the lining reacts to "
        "the sudden change in temperature and humidity. Cover your mouth and nose with a "
        "scarf so the air warms up before it reaches your lungs, and keep your reliever "
        "inhaler with you whenever you go out in winter.",
    ),
    (
        "My inhaler seems to work less well.",
        "There are several possible reasons. The technique matters a great deal: many people "
        "press and breathe in at different moments, so the medicine stays in the mouth. A "
        "spacer helps. It is also worth checking the expiry date and how often you need it, "
        "since needing it more than twice a week means your asthma is not well controlled.",
    ),
    (
        "I cough at night.",
        "A night-time cough is a common sign that asthma is not fully controlled. Airways are "
        "naturally narrower at night, dust mites in bedding can trigger them, and reflux can "
        "make it worse. Wash bedding hot weekly, and we should review your preventer dose.",
    ),
    (
        "Can I exercise with asthma?",
        "Yes, and it is good for you. Exercise can trigger symptoms because fast breathing "
        "dries and cools the airways, so warm up slowly for ten minutes, use your reliever "
        "fifteen minutes before if we agreed on that, and prefer swimming in warm humid air.",
    ),
    (
        "Pollen season is starting.",
        "Pollen is a frequent trigger. An antihistamine taken daily during the season, "
        "keeping windows closed in the morning when counts are high, and showering after "
        "being outside all reduce the amount of pollen that reaches your airways.",
    ),
]


def _session(
    rng: random.Random, facts: list[str], symptoms: list[tuple[str, str]], when: datetime
) -> list[list[Turn]]:
    """One session: a recurring fact or two, then two or three symptom exchanges."""
    rounds: list[list[Turn]] = []
    stated = rng.sample(facts, k=min(len(facts), rng.choice([1, 2])))
    for fact in stated:
        reply = "Thank you, I have noted that."
        rounds.append(
            [Turn("user", fact, timestamp=when), Turn("assistant", reply, timestamp=when)]
        )
        when += timedelta(minutes=2)
    for question, answer in rng.sample(symptoms, k=min(len(symptoms), rng.choice([2, 3]))):
        rounds.append(
            [Turn("user", question, timestamp=when), Turn("assistant", answer, timestamp=when)]
        )
        when += timedelta(minutes=2)
    return rounds


def _of(user: str) -> tuple[list[str], list[tuple[str, str]]]:
    return (ANN_FACTS, ANN_SYMPTOMS) if user == "ann" else (BOB_FACTS, BOB_SYMPTOMS)


def held_out_pairs(user: str, n: int) -> list[tuple[str, str]]:
    """The last ``n`` question/answer pairs of ``user``, never used by :func:`patient_rounds`."""
    return _of(user)[1][-n:] if n else []


def patient_rounds(
    user: str, sessions: int, seed: int = 0, *, held_out: int = 0
) -> list[list[Turn]]:
    """The rounds (one save each) of ``sessions`` weekly sessions of ``"ann"`` or ``"bob"``.

    ``held_out``: leave the last pairs of the user's symptoms out (for held-out evaluation).
    """
    rng = random.Random(f"{user}:{seed}")
    facts, symptoms = _of(user)
    symptoms = symptoms[: len(symptoms) - held_out]
    out: list[list[Turn]] = []
    for s in range(sessions):
        out += _session(rng, facts, symptoms, T0 + timedelta(days=7 * s))
    return out
