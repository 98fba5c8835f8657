"""A three-topic chat (physics, Japanese business etiquette, algebra) for MemoChat tests.

Twelve lines, two per exchange: the LLM-free segmenter and the rule-following model both cut it
into three memos, so tests of memo writing, retrieval and prompt overrides share one scenario.
"""

from __future__ import annotations

CHAT: list[tuple[str, str]] = [
    ("user", "I am reading about quantum entanglement and qubits."),
    ("assistant", "Entangled qubits share one quantum state, even far apart."),
    ("user", "Does quantum superposition mean a qubit is both zero and one?"),
    ("assistant", "A qubit in superposition has amplitudes for zero and one."),
    ("user", "Next week I meet business partners in Japan. How should I bow?"),
    ("assistant", "In Japan a business bow is about fifteen degrees; hand cards with both hands."),
    ("user", "Is a gift expected at a Japanese business meeting?"),
    ("assistant", "A modest wrapped gift is polite at Japanese business meetings."),
    ("user", "Can you factor the polynomial x squared minus five x plus six?"),
    ("assistant", "The polynomial factors as (x - 2)(x - 3)."),
    ("user", "So the polynomial has roots two and three?"),
    ("assistant", "Yes, the polynomial is zero at x = 2 and x = 3."),
]
