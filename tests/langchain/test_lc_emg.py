"""EMG-RAG through LangChain: the selection as a retriever in a chain, the apps as agent tools."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from lc_fakes import chat_model

from emg_scenario import QUESTION, spread_policy, story_memory
from langchain_memories import create_emg_tools, emg_retriever
from memories_core import EMGMemory, InvalidInputError, MissingUserError
from memories_core.embedders import HashingEmbedder


def call(name: str, args: dict[str, Any], cid: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": cid}])


def tool_replies(agent: Any, user: str) -> list[str]:
    state = agent.invoke({"messages": [HumanMessage("help")]}, context={"user_id": user})
    return [m.text for m in state["messages"] if isinstance(m, ToolMessage)]


def test_chain_sees_the_policys_variable_size_selection() -> None:
    memory = story_memory()
    retriever = emg_retriever(memory, "ann", k=3)
    model = chat_model("ok", "ok")
    prompt = ChatPromptTemplate.from_template("Memories:\n{context}\n\nQuestion: {question}")

    def join(docs: list[Any]) -> str:
        return "\n".join(d.page_content for d in docs)

    chain = {"context": retriever | join, "question": RunnablePassthrough()} | prompt | model
    chain = chain | StrOutputParser()
    chain.invoke(QUESTION)
    # Untrained: the activation ranking's top memory only, not a fixed k of 3.
    shown = model.prompts[-1][0].text
    assert shown.count("\n") == 3 and "01:30" in shown and "Crowne Plaza" not in shown
    # A policy whose probability is spread selects several; the retriever returns them, <= k.
    memory.save_policy(spread_policy())
    selected = [h.record.id for h in memory.select(QUESTION, "ann").memories]
    assert len(selected) > 3
    assert [d.id for d in retriever.invoke(QUESTION)] == selected[:3]
    assert [d.id for d in retriever.invoke(QUESTION, k=10)] == selected
    assert {d.metadata["user_id"] for d in retriever.invoke(QUESTION, k=10)} == {"ann"}


def test_retriever_refuses_a_fused_memory() -> None:
    fused = EMGMemory(recall_mode="fused", embedder=HashingEmbedder(), llm=story_memory().llm)
    with pytest.raises(InvalidInputError):
        emg_retriever(fused, "ann")


def test_agent_answers_autofills_and_lists_reminders_for_the_runs_user() -> None:
    memory = story_memory()
    mine = {r.id for r in memory.memories("ann")}
    model = chat_model(
        call("answer_from_memory", {"question": QUESTION}, "c1"),
        call("autofill_form", {"fields": ["phone number", "passport number"]}, "c2"),
        call("upcoming_reminders", {"days": 7}, "c3"),
        "done",
    )
    agent = create_agent(model=model, tools=create_emg_tools(memory))
    answer, form, reminders = tool_replies(agent, "ann")
    used = answer.split("(memories used: ")[1].rstrip(")").split(", ")
    assert "01:30" in answer and set(used) <= mine
    assert json.loads(form) == {"phone number": "+31 6 1234 5678", "passport number": None}
    (reminder,) = [json.loads(line) for line in reminders.splitlines()]
    assert reminder["what"] == "event" and "EK349" in reminder["text"]
    # Bob's run sees only bob's memories.
    model = chat_model(call("answer_from_memory", {"question": QUESTION}, "c1"), "done")
    (bobs,) = tool_replies(create_agent(model=model, tools=create_emg_tools(memory)), "bob")
    assert (
        "01:30" not in bobs and not set(bobs.split("(memories used: ")[1][:-1].split(", ")) & mine
    )


def test_tools_without_a_user_return_an_error_to_the_model() -> None:
    memory = story_memory()
    with pytest.raises(MissingUserError):
        create_emg_tools(memory, user_id="")
    tools = {t.name: t for t in create_emg_tools(memory)}
    with pytest.raises(MissingUserError):
        tools["upcoming_reminders"].invoke({"days": 3})
    fixed = {t.name: t for t in create_emg_tools(memory, user_id="ann")}
    assert "EK349" in fixed["upcoming_reminders"].invoke({"days": 3})
    error = fixed["autofill_form"].invoke({"fields": ["  "]})
    assert "field" in error  # a tool error message, nothing raised into the agent
