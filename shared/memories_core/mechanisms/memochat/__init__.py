"""MemoChat (Lu et al., 2023): structured memos, memo retrieval and chat with memo.

The paper's pipeline (§3.2, Figure 3) is *memorization-retrieval-response*:

* **memo writing** (Table 6): recent dialogue lines are kept in a buffer; when it exceeds a
  budget (the released code: about 1,024 words or 10 lines), or the session ends, the LLM
  partitions the buffer into topics with ``topic``, ``summary``, ``start``, ``end`` over
  numbered lines, and memo
  entries ``{topic, summary, dialogs}`` are stored; the last two lines stay in the buffer;
* **memo retrieval** (Table 7): the LLM is shown the options ``(i) topic. summary`` plus a
  none-of-the-others option (NOTO, at a pseudo-random place among them as in §3.2) and
  answers ``N#M`` (``{"options": [N, M]}`` under schema-constrained decoding, where the model
  offers it);
* **chat with memo** (Table 8): the reply prompt holds the related evidences, the recent
  dialogs and the user input.

Here memos are records of the engine (kind ``"memo"``; text ``"topic. summary"``; metadata
``topic``, ``summary``, ``start``, ``end``; ``source_ids`` = the covered turns). The buffer is
the user's turns that no memo covers yet: a covered turn carries ``attrs[<name>_memo]`` in its
state, written in the transaction that stores the memo. A save that makes the buffer reach
the budget writes a ``write_memo`` job in its own transaction (a session end writes one that
keeps no line); an unparseable answer raises
:class:`~memories_core.engine.JobFailed`, so the job stays pending and is retried with
backoff: lines are never lost.

**Recall follows the model's choice.** With an LLM, :meth:`MemoChatMemory.recall` (what every
generic adapter calls) returns the memos the model chose (:meth:`MemoChatMemory.retrieve`),
each with the dialog lines it covers, and nothing else from the memo: a NOTO answer recalls
no memo. The lines no memo covers yet (the buffer, Table 8's recent dialogs; the model was
not asked about them) follow when they share a content word with the query, so a fact said
a moment ago is found before its memo is written, and an off-topic query recalls nothing.
If the model call fails or its answer cannot be read, the LLM-free selector chooses instead.
LLM-free, recall is the engine's fused search over memos and turns.

**Memos as search keys of the raw turns.** Recall searches memos and turns together; a memo
that ranks brings the dialog lines it covers (its turns are rendered under it), so a query
that matches a topic or a summary but none of the turns' words still finds those turns.
The memo-writing transaction also writes, for every covered turn, a record of kind
``"search_key"`` whose text is the memo's ``"topic. summary"`` and whose
``metadata["key_for"]`` is the turn's id (``metadata["memo_id"]`` the memo's; the key takes
the turn's session, so clearing that session or the user removes it with the turn). The
engine's plain recall can rank a turn by its keys; MemoChat's own searches name their kinds
(``memo``, ``turn``), so the keys never show up as results themselves.

**LLM-free mode** (``llm=None`` or ``mode="llm_free"``): TextTiling-style segmentation by the
embedding similarity of neighbouring exchanges with speaker-turn cues
(:func:`segment_lines`), an extractive topic and summary, and selection by a fused dense +
BM25 score with a threshold and an answer rule (:func:`select_options`). Same records, same
interfaces.
"""

from __future__ import annotations

from memories_core.mechanisms.memochat.memory import SEARCH_KEY_KIND, MemoChatMemory
from memories_core.mechanisms.memochat.options import LLMOptionSource, MemoEntry
from memories_core.mechanisms.memochat.options import choose_memos as choose_memos
from memories_core.mechanisms.memochat.segmenting import _CONTINUATION_CUE as _CONTINUATION_CUE
from memories_core.mechanisms.memochat.segmenting import _SHIFT_CUE as _SHIFT_CUE
from memories_core.mechanisms.memochat.segmenting import (
    DEFAULT_CONTINUATION_CUE as DEFAULT_CONTINUATION_CUE,
)
from memories_core.mechanisms.memochat.segmenting import (
    DEFAULT_DEPTH_CUTOFF as DEFAULT_DEPTH_CUTOFF,
)
from memories_core.mechanisms.memochat.segmenting import DEFAULT_SHIFT_CUE as DEFAULT_SHIFT_CUE
from memories_core.mechanisms.memochat.segmenting import DEFAULT_WINDOW as DEFAULT_WINDOW
from memories_core.mechanisms.memochat.segmenting import depth_boundaries as depth_boundaries
from memories_core.mechanisms.memochat.segmenting import exchanges as exchanges
from memories_core.mechanisms.memochat.segmenting import extractive_memo, segment_lines
from memories_core.mechanisms.memochat.segmenting import gap_similarities as gap_similarities
from memories_core.mechanisms.memochat.signals import _SENTENCE as _SENTENCE
from memories_core.mechanisms.memochat.signals import (
    DEFAULT_ANSWER_PENALTY as DEFAULT_ANSWER_PENALTY,
)
from memories_core.mechanisms.memochat.signals import (
    DEFAULT_BM25_SATURATION as DEFAULT_BM25_SATURATION,
)
from memories_core.mechanisms.memochat.signals import DEFAULT_DENSE_WEIGHT as DEFAULT_DENSE_WEIGHT
from memories_core.mechanisms.memochat.signals import DEFAULT_SMOOTHING as DEFAULT_SMOOTHING
from memories_core.mechanisms.memochat.signals import DEFAULT_THRESHOLD as DEFAULT_THRESHOLD
from memories_core.mechanisms.memochat.signals import _bm25 as _bm25
from memories_core.mechanisms.memochat.signals import _normalise as _normalise
from memories_core.mechanisms.memochat.signals import _tokens as _tokens
from memories_core.mechanisms.memochat.signals import option_scores, select_options, vote

__all__ = [
    "SEARCH_KEY_KIND",
    "LLMOptionSource",
    "MemoChatMemory",
    "MemoEntry",
    "extractive_memo",
    "option_scores",
    "segment_lines",
    "select_options",
    "vote",
]
