"""EMG-RAG (Wang et al., 2024): an editable memory graph with RL memory selection.

**The graph** (§4.2, Figure 2a), one per user in the engine's graph store
(:attr:`MemoryEngine.graph`; networkx only for export and drawing):

* the root node is the user (node id ``"user"``); a subject such as "I" or "the user" *is*
  the root;
* the **Memory Type Layer**: Relationship, Preference, Event, Attribute (``type:<T>``);
* the **Memory Subclass Layer**: Table 7's subclasses (``sub:<T>/<S>``), extensible with
  ``subclasses=``; each keeps its *partition centre*, the mean embedding of its memories;
* the **Memory Graph Layer**: entity nodes (``ent:<hash>``) and one relation edge per
  memory, ``subject --relation--> object``, whose ``record_id`` is the memory: the in-degree
  node is linked to the memory it came from. Each entity hangs under the subclass nearest to
  the embedding of its name (the paper uses TransE embeddings; we use the engine's sentence
  embedder on entity and subclass names, which needs no training).

Memories are engine records of kind ``"emg_memory"`` (metadata: type, subclass, subject,
relation, object, event time), derived from the user's turns by an engine job.

**Extraction** (appendix A.1 step 2): :data:`~memories_core.prompts.emg.EXTRACT` turns a turn,
an app notification or OCR text (:meth:`EMGMemory.ingest`) into memories, with relative dates
resolved against the message time. If the model's answer cannot be parsed, the text is still
stored as one memory under its nearest subclass, without edges (documented fallback); an LLM
outage leaves the job pending and retried.

**Editing** (§4.2): each new memory is placed in its partition (the subclass the model gave,
else the nearest partition centre); the memories of that partition with the same subject are
compared with it by relation (same name, or relation-name embeddings at least
``relation_match`` apart), the top-1 by embedding decides:

* same relation, same object: a duplicate, nothing is written;
* same relation, another object: **replacement**. The new memory is added; the old one's
  validity ends (``valid_until`` = the new message's time) and it keeps
  ``attrs.replaced_by``. Nothing is destroyed: the old record, its edge and its history stay;
* a new relation with an end of validity: **deletion** (the memory is inserted with
  ``valid_until``; after that time it is never returned);
* otherwise **insertion**.

Every edit is written with the records in one transaction (``Derivation.apply``) and kept in
the engine's update history with its reason (:meth:`EMGMemory.edits`).

**Selection** (§4.3): the question activates the top-``activate`` memories (K=3, Table 6);
from each activated node the agent walks depth first. At each memory reached by a relation
edge it sees a state and includes the memory and continues, or stops the branch (Eq. 2).
The state is Eq. 1's three cosines (question entity vs node entity, question relation vs
edge relation, question vs memory) plus four documented relative features
(:mod:`.policy`). The question's entities and relation are read without a model
(:func:`~memories_core.prompts.emg.question_parts`: the graph's entity names found in the
question, capitalised words, the remaining words as the relation), so no LLM runs before
retrieval, and the question is embedded once. The walk stays inside the ``pool`` memories
nearest to the question (a hub such as the user has an edge per memory; this bounds a
question's cost). The policy is trained by :meth:`EMGMemory.train_policy` and saved as an
artifact per store (or per user); untrained, the selection is the activation ranking's top
memory (``fallback="top1"``, the best fixed K on LoCoMo, so an untrained user never gets
less than top-1), or with ``fallback="threshold"`` the walk that includes a memory when its
cosine to the question reaches ``threshold``. A trained policy's selection is decoded, by
default, as a set (``decode="expected_f1"``, ours, not the paper's): the walk scores every
reachable memory with ``P(required)`` (the warm-start network, Eq. 5, kept with the policy)
and the best-first prefix of highest expected F1 is returned, so the size follows how confident the
top memory is; ``decode="greedy"`` keeps the paper's include/stop walk, which on LoCoMo
always stops at one memory (BENCHMARKS.md, "EMG-RAG: memory selection on LoCoMo").

**Training questions from the user's own memories** (appendix A.1 step 3): no user labels
questions, so :meth:`EMGMemory.generate_questions` has the model write them
(:data:`~memories_core.prompts.emg.QUESTIONS`): the memories in time order, cut into
sessions, each giving question-answer pairs with the memories they need, validated (cited
memories exist, the answer is in them). After a :meth:`~EMGMemory.save`, when a user has
another ``questions_every`` memories, a *pending job* is enqueued (mechanism
``<name>/policy``); saves and recalls never run it. :meth:`EMGMemory.run_training` (from a
worker or a schedule) runs the due jobs: it generates the questions, keeps them as the
user's artifact, and once the store holds ``train_after`` generated examples (and again
after each further ``train_after``) trains the store's policy on them.

**Policies and deletion**: the examples a policy is trained on are kept per user, as that
user's artifact, and the policy lists its contributors. :meth:`EMGMemory.delete_user`
removes the user's examples and own policy, and drops every policy the user contributed to
(it carries their influence), leaving a *stale* mark (:meth:`EMGMemory.policy_status`) until
:meth:`EMGMemory.retrain_policy` trains it again from the remaining users' examples; in the
meantime the untrained fallback serves.

**Applications** (§4.4): :meth:`EMGMemory.answer`, :meth:`EMGMemory.autofill`,
:meth:`EMGMemory.reminders`. The walk is also the candidate source of the retrieval pipeline
(:class:`EMGSource`): by default (``recall_mode="selection"``) :meth:`EMGMemory.recall`
returns the selection itself, at most ``k``, so the generic adapters (retrievers, memory
blocks, middleware) show the variable-size set; ``recall_mode="fused"`` fuses it with dense
and lexical search and cuts to ``k``.

**The package**, one module per concern, each usable alone:

* :mod:`.memory`: :class:`EMGMemory`, the front (settings, saves, extraction jobs);
* :mod:`.schema`: record kinds, node ids, artifact names and the result types;
* :mod:`.taxonomy` and :mod:`.embeddings`: the graph's fixed layers, the name embeddings;
* :mod:`.edits`: insertion, deletion, replacement (:class:`~.edits.GraphEditor`, §4.2);
* :mod:`.selection`: activation, the walk and its decoding (:class:`~.selection.Selector`, §4.3);
* :mod:`.policy`, :mod:`.training`, :mod:`.archive`, :mod:`.questions`, :mod:`.jobs`: the RL
  policy, its training, its artifacts, the generated questions and the training jobs;
* :mod:`.applications`, :mod:`.export`, :mod:`.drawing`: answers, autofill, reminders (§4.4),
  and the graph read out.

``memories_core.mechanisms.emg_policy`` is a deprecated alias of :mod:`.policy`.
"""

from memories_core.mechanisms.emg.archive import PolicyArchive
from memories_core.mechanisms.emg.edits import GraphEditor
from memories_core.mechanisms.emg.embeddings import EmbeddingCache
from memories_core.mechanisms.emg.memory import EMGMemory, EMGSource
from memories_core.mechanisms.emg.policy import (  # noqa: F401 (names the single module had)
    ALL_FEATURES,
    EXTRA_FEATURES,
    HIDDEN,
    PAPER_FEATURES,
    STATE_SIZE,
    Episode,
    SelectionPolicy,
    calibrate,
    expected_f1,
    expected_f1_size,
    reinforce,
    rouge_l,
    selection_f1,
    warm_start,
)
from memories_core.mechanisms.emg.schema import (  # noqa: F401 (names the single module had)
    HOLD_OUT,
    LAST_TRAINING,
    MEMORY_KIND,
    POLICY_ARTIFACT,
    POLICY_JOBS,
    ROOT,
    STALE_ARTIFACT,
    STORE_OWNER,
    TRAINING_GENERATED,
    TRAINING_OWN,
    TRAINING_STORE,
    Answer,
    Edit,
    EditOp,
    PolicyStatus,
    Reminder,
    Selection,
    TrainingExample,
    TrainingReport,
    TrainingRun,
    entity_id,
)
from memories_core.mechanisms.emg.selection import Selector
from memories_core.mechanisms.emg.training import is_held_out
from memories_core.prompts.emg import (  # noqa: F401 (names the single module had)
    ANSWER,
    AUTOFILL,
    EXTRACT,
    MEMORY_TYPES,
    QUESTIONS,
    TABLE7_SUBCLASSES,
    AnswerInput,
    AutofillInput,
    ExtractedMemory,
    ExtractInput,
    MemoryLine,
    QuestionsInput,
    question_parts,
)

__all__ = [
    "HOLD_OUT",
    "LAST_TRAINING",
    "MEMORY_KIND",
    "POLICY_ARTIFACT",
    "POLICY_JOBS",
    "ROOT",
    "STALE_ARTIFACT",
    "STORE_OWNER",
    "TRAINING_GENERATED",
    "TRAINING_OWN",
    "TRAINING_STORE",
    "Answer",
    "EMGMemory",
    "EMGSource",
    "Edit",
    "EmbeddingCache",
    "GraphEditor",
    "PolicyArchive",
    "PolicyStatus",
    "Reminder",
    "Selection",
    "Selector",
    "TrainingExample",
    "TrainingReport",
    "TrainingRun",
    "is_held_out",
]
