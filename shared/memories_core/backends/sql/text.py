"""Query terms for lexical search, the same for every backend's full-text index.

SQLite ranks with FTS5's BM25 and PostgreSQL with ``ts_rank`` over a ``tsvector``; both get
the query's terms from :func:`query_terms`, OR-ed, so a record needs only one of them.
"""

from __future__ import annotations

import re

__all__ = ["ENGLISH_STOPWORDS", "query_terms"]

#: English function words dropped from lexical queries. They carry no topic, and in an OR
#: query they would match nearly every record and drown the informative terms.
ENGLISH_STOPWORDS: frozenset[str] = frozenset(
    """
    a about above after again against all am an and any are aren as at be because been
    before being below between both but by can cannot could couldn did didn do does doesn
    doing don down during each few for from further had hadn has hasn have haven having he
    her here hers herself him himself his how if in into is isn it its itself just let ll me
    might more most must my myself no nor not now of off on once only or other ought our ours
    ourselves out over own re same shall she should shouldn so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    upon us ve very was wasn we were weren what when where which while who whom whose why
    will with won would wouldn you your yours yourself yourselves
    """.split()  # noqa: SIM905 - a word list reads better than 150 quoted strings
)

# FTS5's unicode61 tokenizer keeps letters, digits and private-use characters and splits on
# everything else (underscore included); this pattern mirrors it so that query terms line up
# with indexed tokens.
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def query_terms(text: str, stopwords: frozenset[str] = ENGLISH_STOPWORDS) -> list[str]:
    """Split a query into lexical search terms.

    Lower-cases, splits like FTS5's ``unicode61`` tokenizer, and drops stopwords, one-character
    tokens and repeats (first occurrence kept).

    Args:
        text: The query.
        stopwords: Words to drop.

    Returns:
        The terms in query order.
    """
    seen: dict[str, None] = {}
    for token in _WORD.findall(text.lower()):
        if len(token) > 1 and token not in stopwords:
            seen.setdefault(token, None)
    return list(seen)
