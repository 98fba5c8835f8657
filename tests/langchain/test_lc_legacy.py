from __future__ import annotations

import pytest
from langchain_classic.chains import ConversationChain, LLMChain
from langchain_core.messages import SystemMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from lc_fakes import RecordingLLM, chat_model, history_memory

from langchain_memories import LegacyChainMemory
from memories_core import HistoryMemory, Scope

FACT = "I am allergic to peanuts"


def legacy(memory: HistoryMemory, user: str = "alice", **kwargs: object) -> LegacyChainMemory:
    return LegacyChainMemory(memory=memory, user_id=user, **kwargs)  # type: ignore[arg-type]


def test_conversation_chains_share_one_core_memory() -> None:
    memory = history_memory()
    first = ConversationChain(llm=chat_model("Noted, no peanuts."), memory=legacy(memory))
    first.invoke({"input": FACT})

    model = chat_model("No peanuts in the satay then.")
    second = ConversationChain(llm=model, memory=legacy(memory))
    assert second.invoke({"input": "Can I eat satay with peanuts?"})["response"].startswith("No")
    sent = model.prompts[-1][0].text
    assert FACT in sent
    assert "Noted, no peanuts." in sent  # the assistant's turn was saved too

    other = chat_model()
    ConversationChain(llm=other, memory=legacy(memory, "bob")).invoke({"input": "peanuts?"})
    assert "allergic" not in other.prompts[-1][0].text


def test_llm_chain_with_custom_keys() -> None:
    memory = history_memory()
    prompt = PromptTemplate.from_template("Known facts:\n{facts}\nQ: {question}\nA:")
    llm = RecordingLLM(responses=["Understood.", "Avoid peanuts."])
    chain_kwargs = {"memory_key": "facts", "input_key": "question"}
    LLMChain(llm=llm, prompt=prompt, memory=legacy(memory, **chain_kwargs)).invoke(
        {"question": FACT}
    )
    out = LLMChain(llm=llm, prompt=prompt, memory=legacy(memory, **chain_kwargs)).invoke(
        {"question": "What should I avoid eating?"}
    )
    assert out["text"] == "Avoid peanuts."
    facts = llm.prompts[-1].split("Known facts:\n", 1)[1].split("\nQ:", 1)[0]
    assert any(line.endswith(f"] user: {FACT}") for line in facts.splitlines())


def test_return_messages_for_chat_prompts() -> None:
    memory = history_memory()
    mem = legacy(memory, return_messages=True)
    assert mem.load_memory_variables({"input": "peanuts"}) == {"history": []}
    mem.save_context({"input": FACT}, {"response": "Noted."})
    history = mem.load_memory_variables({"input": "peanut allergy"})["history"]
    assert len(history) == 1
    assert isinstance(history[0], SystemMessage)
    assert FACT in history[0].text

    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{input}")]
    )
    model = chat_model()
    LLMChain(llm=model, prompt=prompt, memory=mem).invoke({"input": "What am I allergic to?"})
    assert [m.type for m in model.prompts[-1]] == ["system", "human"]


def test_empty_texts_are_skipped_not_raised() -> None:
    memory = history_memory()
    mem = legacy(memory)
    mem.save_context({"input": "   "}, {"response": ""})
    assert memory.turns(Scope("alice")) == []
    mem.save_context({"input": FACT}, {"response": " "})
    assert [t.role for t in memory.turns(Scope("alice"))] == ["user"]
    assert mem.load_memory_variables({"input": " "}) == {"history": ""}


def test_key_inference_errors() -> None:
    mem = legacy(history_memory())
    with pytest.raises(ValueError, match="One input key expected"):
        mem.load_memory_variables({"a": "x", "b": "y"})
    with pytest.raises(ValueError, match="output_key"):
        mem.save_context({"input": FACT}, {"a": "x", "b": "y"})


def test_clear_forgets_the_user_only() -> None:
    memory = history_memory()
    alice, bob = legacy(memory), legacy(memory, "bob")
    alice.save_context({"input": FACT}, {"response": "Noted."})
    bob.save_context({"input": "I love peanuts"}, {"response": "Great."})
    alice.clear()
    assert alice.load_memory_variables({"input": "peanuts"}) == {"history": ""}
    assert "peanuts" in bob.load_memory_variables({"input": "peanuts"})["history"]


def test_missing_user_is_rejected() -> None:
    with pytest.raises(ValueError, match="user_id"):
        legacy(history_memory(), "")


async def test_async_chain() -> None:
    memory = history_memory()
    mem = legacy(memory, session_id="s1")
    await mem.asave_context({"input": FACT}, {"response": "Noted."})
    assert FACT in (await mem.aload_memory_variables({"input": "allergy"}))["history"]
    model = chat_model()
    await ConversationChain(llm=model, memory=mem).ainvoke({"input": "Any peanut allergy?"})
    assert FACT in model.prompts[-1][0].text
    assert len(memory.turns(Scope("alice", "s1"))) == 4
