"""Entity reranking: person names and quoted phrases of the question, matched exactly.

"What did Melanie paint?" is about Melanie, not about whoever else painted; "what is
'Becoming Nicole' about?" names a title that must appear as written. Dense retrieval blurs
both, and BM25 weighs a name like any other rare word. Hybrid memory systems for long
conversations boost candidates that contain the question's names and quoted phrases;
:class:`EntityBoost` does that after fusion, without a model.

:func:`query_entities` extracts them: phrases in double quotes (or single quotes around
several words), and capitalised words that are not the question's first word, a pronoun,
a month or weekday, or a common question word. A possessive ``'s`` is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memories_core.errors import ConfigurationError
from memories_core.retrieval.base import RecallContext, RecallRequest
from memories_core.retrieval.fusion import Ranking

__all__ = ["DEFAULT_ENTITY_WEIGHT", "EntityBoost", "QueryEntities", "query_entities"]

_QUOTED = re.compile(r"\"([^\"]{2,80})\"|“([^”]{2,80})”|(?<!\w)'([^']{2,80}\s[^']{1,80})'(?!\w)")
_WORD = re.compile(r"[A-Z][\w\-]*(?:'s|’s)?")
_NOT_NAMES = frozenset(
    """
    i i'm i've i'd i'll me my you your he she it we they him her his its our their them
    what when where which who whom whose why how is are was were do does did can could
    would should will shall has have had the a an and or but if in on at of for to from by
    with about after before during since this that these those there here yes no not
    mr mrs ms dr
    monday tuesday wednesday thursday friday saturday sunday
    january february march april may june july august september october november december
    """.split()  # noqa: SIM905 (a word list reads better as text)
)


@dataclass(frozen=True)
class QueryEntities:
    """What :func:`query_entities` found: names (lower case) and quoted phrases."""

    names: tuple[str, ...]
    phrases: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.names or self.phrases)


def query_entities(query: str) -> QueryEntities:
    """Person-like names and quoted phrases of ``query``."""
    phrases = tuple(
        dict.fromkeys(
            next(g for g in match.groups() if g).strip().lower()
            for match in _QUOTED.finditer(query)
        )
    )
    names: list[str] = []
    for sentence in re.split(r"(?<=[.?!])\s+", query.strip()):
        for position, match in enumerate(_WORD.finditer(sentence)):
            raw = match.group(0)
            word = re.sub(r"(?:'s|’s)$", "", raw)
            first = position == 0 and not sentence[: match.start()].strip()
            if first and word == raw:
                # A sentence's first word is capitalised anyway: a name only if possessive.
                continue
            if word.lower() in _NOT_NAMES or len(word) < 2:
                continue
            names.append(word.lower())
    return QueryEntities(tuple(dict.fromkeys(names)), phrases)


def _contains_word(text: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


#: Weight of the entity boost in the default pipeline (``FusionConfig.entity_weight``): off.
#: On LoCoMo dev, leave-one-conversation-out cross-validation over 0 / 0.1 / 0.3 (with the
#: other knobs) picks entity 0.1 with context 0.6/0.4 and temporal 2 when only overall recall
#: counts (held-out R@10 0.776), but that lowers multi-hop and open-domain R@5; under the
#: "no category worse" rule every fold picked 0 (BENCHMARKS.md, "Retrieval quality").
#: Switch it on with ``FusionConfig(entity_weight=0.1)``.
DEFAULT_ENTITY_WEIGHT = 0.0


@dataclass(frozen=True)
class EntityBoost:
    """Reranker: boost candidates that contain the question's names and quoted phrases.

    A candidate gets ``spread * (name_weight * share of names it contains + phrase_weight *
    share of quoted phrases it contains)``, where ``spread`` is the score range of the best
    ``depth`` candidates (so bonuses are on the scale of the fused scores). Matching is
    case-insensitive, on whole words for names and on the exact phrase for quotes. A
    question without names or quotes is left unchanged.

    Cost: a regex over the question; loads the ``depth`` best candidates (cached for the
    load stage) only when it has entities.

    Attributes:
        name_weight: Bonus for containing every name; 0 = off.
        phrase_weight: Bonus for containing every quoted phrase; 0 = off.
        depth: Candidates considered (the rest keep their order below them).
    """

    name_weight: float = 0.1
    phrase_weight: float = 0.5
    depth: int = 50

    name = "entity"

    def __post_init__(self) -> None:
        for value in (self.name_weight, self.phrase_weight):
            if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
                raise ConfigurationError("entity weights must be finite numbers >= 0")
        if self.depth < 1:
            raise ConfigurationError("depth must be >= 1")

    def rerank(
        self, ranking: Ranking, request: RecallRequest, ctx: RecallContext
    ) -> list[tuple[str, float]]:
        """Return the ranking with entity-matching candidates boosted."""
        items = list(dict.fromkeys(item for item, _ in ranking))
        scores = dict(reversed(ranking))
        entities = query_entities(request.query)
        if len(items) < 2 or not entities or (self.name_weight == 0 and self.phrase_weight == 0):
            return [(item, float(scores[item])) for item in items]
        head = items[: self.depth]
        values = [float(scores[item]) for item in head]
        spread = max(values) - min(values)
        records = ctx.load(head, user_id=request.user_id)
        boosted: dict[str, float] = {}
        for item in head:
            bonus = 0.0
            record = records.get(item)
            if record is not None:
                text = record.text.lower()
                if entities.names:
                    found = sum(_contains_word(text, name) for name in entities.names)
                    bonus += self.name_weight * found / len(entities.names)
                if entities.phrases:
                    found = sum(phrase in text for phrase in entities.phrases)
                    bonus += self.phrase_weight * found / len(entities.phrases)
            boosted[item] = float(scores[item]) + spread * bonus
        order = {item: n for n, item in enumerate(items)}
        ranked = sorted(boosted.items(), key=lambda pair: (-pair[1], order[pair[0]]))
        # Boosts only raise scores, so the rest stay below the head in their order.
        return ranked + [(item, float(scores[item])) for item in items[self.depth :]]
