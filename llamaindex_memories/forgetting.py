"""MemoryBank's forgetting curve (Zhong et al., §2.3) as a node postprocessor for any index.

The curve and the re-weighting rule live in :mod:`memories_core.mechanisms.forgetting`; this
module only converts nodes.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from llamaindex_memories.memory_block import MemoryBlock
from memories_core.clock import resolve_now
from memories_core.mechanisms.forgetting import ForgettingCurve, apply_forgetting
from memories_core.mechanisms.memorybank import MemoryBankMemory

__all__ = ["ForgettingCurvePostprocessor", "MemoryBankBlock"]

_HIDDEN = ["retention"]


class ForgettingCurvePostprocessor(BaseNodePostprocessor):
    """Re-weight (``score x R``) or drop retrieved nodes by the forgetting curve ``R = exp(-t/S)``.

    Works on the nodes of ANY index whose metadata carries a timestamp: ``created_at`` or
    ``timestamp`` (ISO 8601 string, datetime or Unix seconds), and optionally ``strength``
    (default 1) and ``last_recalled_at`` (``t`` counts from it). Nodes without a timestamp
    pass unchanged. Kept nodes are copies whose metadata adds ``retention`` (hidden from the
    LLM and the embedder); the originals are never touched.

    Reinforcement (§2.3: ``S += 1``, ``t`` reset) is written back for kept nodes that come
    from our store (metadata ``record_id`` and ``user_id``, as
    :class:`~llamaindex_memories.MemoryRetriever` writes them) when ``memory`` is given.
    Give ``memory`` only for nodes that did not come through ``memory.recall``, which
    reinforces by itself.

    Key init args:
        unit: One unit of ``t`` (default: a day).
        scale: Curve stretch (1: the paper's curve).
        reweight: Multiply scores by ``R`` and re-sort (``False``: only drop).
        min_retention: Drop nodes with ``R`` below this (0: drop nothing).
        memory: A ``MemoryBankMemory`` to write reinforcement back to.
        now: Fixed time of the evaluation (default: the memory's clock, else the wall clock).

    Use in a query engine:
        .. code-block:: python

            from llamaindex_memories import ForgettingCurvePostprocessor

            engine = index.as_query_engine(
                node_postprocessors=[ForgettingCurvePostprocessor(min_retention=0.05)]
            )
    """

    unit: timedelta = Field(default=timedelta(days=1), description="One unit of t.")
    scale: float = Field(default=1.0, gt=0, description="Stretch of the curve exp(-t/(scale*S)).")
    reweight: bool = Field(default=True, description="Multiply scores by the retention.")
    min_retention: float = Field(
        default=0.0, ge=0, le=1, description="Drop nodes whose retention is below this."
    )
    memory: Any = Field(
        default=None, exclude=True, description="MemoryBankMemory to write reinforcement to."
    )
    now: datetime | None = Field(default=None, description="Fixed evaluation time.")

    @classmethod
    def class_name(cls) -> str:
        """Name of the component, as LlamaIndex components report it."""
        return "ForgettingCurvePostprocessor"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        now = resolve_now(self.now, getattr(self.memory, "clock", None))
        curve = ForgettingCurve(unit=self.unit, scale=self.scale)
        kept = apply_forgetting(
            [(n.score, n.node.metadata) for n in nodes],
            curve=curve,
            now=now,
            reweight=self.reweight,
            min_retention=self.min_retention,
        )
        out: list[NodeWithScore] = []
        recalled: dict[str, list[str]] = defaultdict(list)
        for item in kept:
            hit = nodes[item.index]
            node = hit.node
            if item.retention is not None:
                node = node.model_copy(
                    update={
                        "metadata": {**node.metadata, "retention": item.retention},
                        "excluded_llm_metadata_keys": _hide(node.excluded_llm_metadata_keys),
                        "excluded_embed_metadata_keys": _hide(node.excluded_embed_metadata_keys),
                    }
                )
            out.append(NodeWithScore(node=node, score=item.score if self.reweight else hit.score))
            meta = hit.node.metadata
            if isinstance(meta.get("record_id"), str) and isinstance(meta.get("user_id"), str):
                recalled[meta["user_id"]].append(meta["record_id"])
        if self.memory is not None:
            for user_id, ids in recalled.items():
                self.memory.reinforce_records(user_id, ids, now)
        return out


def _hide(keys: list[str]) -> list[str]:
    return [*keys, *(k for k in _HIDDEN if k not in keys)]


class MemoryBankBlock(MemoryBlock):
    """A :class:`~llamaindex_memories.MemoryBlock` for a core ``MemoryBankMemory``.

    Messages that ``Memory`` flushes (or :meth:`~llamaindex_memories.MemoryBlock.flush` at the
    end of a session) are saved with their timestamps; a new day rolls the old one over into
    its daily summary and personality note (Zhong et al. §2.1). Before each model call the
    block recalls for the latest user message: the relevant memories (re-weighted by the
    forgetting curve if the memory's ``forgetting_weight`` > 0) and reinforced (§2.2-2.3),
    plus the global portrait and global event summary, as SiliconFriend's prompt has them
    (§3). Memories the memory has archived (``forget``, or ``archive_below`` at
    consolidation) are not recalled until ``memory.restore(...)``.

    Instantiate and use in a chat engine:
        .. code-block:: python

            from llama_index.core.chat_engine import SimpleChatEngine
            from llama_index.core.memory import Memory
            from llamaindex_memories import MemoryBankBlock
            from memories_core import MemoryBankMemory

            block = MemoryBankBlock(memory=MemoryBankMemory(path="./memories"), user_id="gary")
            memory = Memory.from_defaults(session_id="day-1", memory_blocks=[block])
            engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    """

    name: str = Field(default="memory_bank", description="Name of the block in the prompt.")
    memory: MemoryBankMemory = Field(
        exclude=True, description="The core MemoryBank memory that stores, forgets and recalls."
    )

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialization."""
        return "MemoryBankBlock"
