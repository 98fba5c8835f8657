"""DPeM in LangChain: rounds through a legacy ConversationChain, the STM cut in an LCEL chain."""

from __future__ import annotations

from langchain_classic.chains import ConversationChain
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from lc_fakes import chat_model

from langchain_memories import LegacyChainMemory, dpem_retriever
from memories_core import DualProcessMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.dpem import dpem_reply


def _memory(**options: object) -> DualProcessMemory:
    return DualProcessMemory(
        llm=ScriptedLLM(default=dpem_reply),
        embedder=HashingEmbedder(),
        **options,  # type: ignore[arg-type]
    )


def test_three_exchanges_in_a_conversation_chain_are_three_rounds() -> None:
    memory = _memory(theta=3)
    chain = ConversationChain(
        llm=chat_model("Noted.", "Noted.", "Noted."),
        memory=LegacyChainMemory(memory=memory, user_id="ann"),
    )
    for _ in range(3):
        chain.invoke({"input": "I have type 2 diabetes."})
    assert memory.rounds("ann") == 3
    assert "The user said: I have type 2 diabetes." in [i.text for i in memory.ltm("ann")]


def _joined(found: list[Document]) -> str:
    return "\n".join(d.page_content for d in found) or "(nothing)"


def test_stm_cut_keeps_unrelated_items_out_of_an_lcel_chain() -> None:
    memory = _memory(theta=9, stm_cut=0.4)
    for text in ("My feet tingle at night.", "I am thirsty all the time."):
        memory.save([Turn("user", text), Turn("assistant", "Okay.")], Scope("ann"))
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Known:\n{context}"), ("human", "{question}")]
    )
    docs = dpem_retriever(memory, "ann", k=3) | RunnableLambda(_joined)
    model = chat_model("Hm.", "Hm.")
    chain = {"context": docs, "question": RunnablePassthrough()} | prompt | model
    chain.invoke("zebra stripes")
    assert model.prompts[-1][0].content == "Known:\n(nothing)"
    chain.invoke("my feet tingle at nite")
    system = model.prompts[-1][0].content
    assert "feet tingle" in system and "thirsty" not in system
