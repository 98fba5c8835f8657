"""EMG-RAG's secretary story (Wang et al., 2024, Table 1 and Figure 2), offline.

A secretary tells the phone assistant about the boss's trip to Amsterdam; an airline
notification moves the departure time (a *replacement*), a hotel notice brings a breakfast
voucher that expires (a *deletion* by validity); then the assistant answers "What time is my
boss's flight to Amsterdam?", fills a form and lists reminders.

The model is **scripted**: ``SCRIPTED_EXTRACTIONS`` holds the extraction answers a real model
would give for each message (what the paper's GPT-4 step produces), and every other prompt
(answer, autofill) is answered by the rule-based stand-in ``emg_reply``. No network, no model
download: the embedder is the deterministic ``HashingEmbedder``. Pass a real ``llm=`` and the
default embedder for real use.

Run: ``python examples/memory_graph_assistant.py [output folder]``
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from memories_core import EMGMemory, FixedClock, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.emg import TrainingExample
from memories_core.prompts.emg import EXTRACT_SYSTEM, emg_reply
from memories_core.prompts.spec import read_section
from memories_core.types import ChatMessage


def memory(
    text: str, kind: str, sub: str, subject: str, relation: str, obj: str, **extra: str
) -> dict[str, str | None]:
    return {
        "text": text,
        "type": kind,
        "subclass": sub,
        "subject": subject,
        "relation": relation,
        "object": obj,
        "when": extra.get("when"),
        "valid_until": extra.get("valid_until"),
    }


#: The extraction answers of the scripted model, by message (Table 1's M1-M6, then the edits).
SCRIPTED_EXTRACTIONS: dict[str, list[dict[str, str | None]]] = {
    "My boss is traveling to Amsterdam next month, I assist with flight and hotel arrangements.": [
        memory(
            "My boss travels to Amsterdam in May 2024.",
            "Event",
            "Arrangement",
            "boss",
            "travels_to",
            "Amsterdam",
            when="next month",
        ),
        memory(
            "I am my boss's assistant.",
            "Relationship",
            "Colleague/Friends",
            "user",
            "assists",
            "boss",
        ),
    ],
    "I booked the EK349 flight.": [
        memory(
            "I booked flight EK349 for my boss.", "Event", "Arrangement", "boss", "flight", "EK349"
        ),
    ],
    "I booked the Crowne Plaza near Central Station.": [
        memory(
            "I booked the Crowne Plaza near Central Station for my boss.",
            "Event",
            "Arrangement",
            "boss",
            "hotel",
            "Crowne Plaza",
        ),
    ],
    "The EK349 flight departs at 01:40 on 2024-05-12.": [
        memory(
            "The EK349 flight departs at 01:40 on 2024-05-12.",
            "Event",
            "Arrangement",
            "EK349",
            "departs_at",
            "01:40 on 2024-05-12",
            when="2024-05-12T01:40",
        ),
    ],
    "The Crowne Plaza reservation is for 2024-05-12 to 2024-05-18.": [
        memory(
            "The Crowne Plaza reservation is from 2024-05-12 to 2024-05-18.",
            "Event",
            "Arrangement",
            "Crowne Plaza",
            "reserved_from",
            "2024-05-12",
            when="2024-05-12T15:00",
        ),
    ],
    "My name is Lin Mei, mobile +65 8123 4567.": [
        memory("My name is Lin Mei.", "Attribute", "Name/Nickname", "user", "name", "Lin Mei"),
        memory(
            "My mobile number is +65 8123 4567.",
            "Attribute",
            "Contact",
            "user",
            "mobile_number",
            "+65 8123 4567",
        ),
    ],
    "Emirates: flight EK349 on 2024-05-12 now departs at 01:30.": [
        memory(
            "The EK349 flight departs at 01:30 on 2024-05-12.",
            "Event",
            "Arrangement",
            "EK349",
            "departs_at",
            "01:30 on 2024-05-12",
            when="2024-05-12T01:30",
        ),
    ],
    "Crowne Plaza: your breakfast voucher is valid until 2024-05-14.": [
        memory(
            "The Crowne Plaza breakfast voucher expires on 2024-05-14.",
            "Event",
            "Arrangement",
            "Crowne Plaza",
            "breakfast_voucher",
            "voucher",
            valid_until="2024-05-14T00:00",
        ),
    ],
}


def scripted_model(messages: Sequence[ChatMessage]) -> str:
    """The scripted LLM: extraction answers from the script, other prompts by rule."""
    if messages[0].content == EXTRACT_SYSTEM:
        text = read_section(messages[-1].content, "raw_text")
        return json.dumps({"memories": SCRIPTED_EXTRACTIONS.get(text, [])})
    return emg_reply(messages)


def main(out: Path) -> None:
    start = datetime(2024, 4, 10, 9, 0, tzinfo=timezone.utc)
    clock = FixedClock(start)
    assistant = EMGMemory(
        llm=ScriptedLLM(default=scripted_model), embedder=HashingEmbedder(), clock=clock
    )
    scope = Scope("secretary")
    messages = list(SCRIPTED_EXTRACTIONS)
    for i, text in enumerate(messages):
        at = start + timedelta(hours=i)
        if text.startswith(("Emirates:", "Crowne Plaza:")):
            assistant.ingest(text, scope, source="notification", at=at)  # app notifications
        else:
            assistant.save([Turn("user", text, timestamp=at)], scope)
    # Extraction and edits run in the background; a script that reads the graph now waits.
    assistant.flush("secretary")

    print("Edits (engine update history):")
    for change in assistant.edits("secretary"):
        print(f"  {change.at:%Y-%m-%d %H:%M}  {change.reason}")

    # Train the selection policy on Table 1's two QA pairs and their required memories (step 3,
    # as the paper trains on generated QA pairs before serving questions): warm
    # start, then REINFORCE with the offline retrieval-quality reward (§4.3).
    by_text = {r.text: r.id for r in assistant.memories("secretary", include_expired=True)}
    trip = by_text["My boss travels to Amsterdam in May 2024."]
    flight = by_text["I booked flight EK349 for my boss."]
    hotel = by_text["I booked the Crowne Plaza near Central Station for my boss."]
    departs = by_text["The EK349 flight departs at 01:30 on 2024-05-12."]
    stay = by_text["The Crowne Plaza reservation is from 2024-05-12 to 2024-05-18."]
    now = datetime(2024, 5, 10, 8, 0, tzinfo=timezone.utc)
    report = assistant.train_policy(
        [
            TrainingExample(
                "secretary",
                "What time is my boss's flight to Amsterdam?",
                frozenset({trip, flight, departs}),
            ),
            TrainingExample(
                "secretary",
                "When does the hotel I booked for my boss start and end?",
                frozenset({trip, hotel, stay}),
            ),
        ],
        warm_epochs=1000,
        episodes=50,
        now=now,
        progress=False,
    )
    print(f"\nPolicy trained: {report.states} states, {report.episodes} episodes ({report.reward})")
    # The secretary's examples are her artifact: deleting her would drop this policy too.
    status = assistant.policy_status()
    print(f"Store policy trained on the examples of: {', '.join(status.contributors)}")

    question = "What time is my boss's flight to Amsterdam?"
    answer = assistant.answer(question, scope, now=now)
    print(f"\nQ: {question}\nA: {answer.text}")
    print("Selected memories:")
    for hit in answer.memories:
        print(f"  {hit.score:.2f}  {hit.record.text}")
    seen = assistant.select(question, scope, now=now).states[answer.memories[0].record.id]
    print(
        "State of the first (Eq. 1): entity {entity_cos:.2f}, relation {relation_cos:.2f}, "
        "memory {memory_cos:.2f}".format(**seen)
    )

    print("\nAutofill:", assistant.autofill(["name", "mobile number", "passport"], scope, now=now))

    print("\nReminders for the next 7 days:")
    for reminder in assistant.reminders(scope, now=now, horizon=timedelta(days=7)):
        print(f"  {reminder.at:%Y-%m-%d %H:%M}  {reminder.what:8s} {reminder.text}")
    after = datetime(2024, 5, 15, tzinfo=timezone.utc)
    live = [r.text for r in assistant.memories("secretary", now=after)]
    print("\nVoucher still listed on 2024-05-15:", any("voucher" in t for t in live))

    out.mkdir(parents=True, exist_ok=True)
    assistant.export_graph("secretary", out / "secretary_graph.graphml", format="graphml", now=now)
    assistant.draw("secretary", out / "secretary_graph.png", now=now)
    print(f"\nGraph written to {out / 'secretary_graph.graphml'} and {out / 'secretary_graph.png'}")
    assistant.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="emg-")))
