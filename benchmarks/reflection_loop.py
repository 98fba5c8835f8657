"""Self-reflective retrieval loop (Yuan et al., §3.2, appendix C.3, Table 19, Table 5).

After retrieval the LLM judges whether the candidates suffice (``<Memory>``: copy the relevant
sentences; the copied candidates become the recall) or not (``<Query>``: keywords extend the
query and retrieval runs again), at most ``max_rounds`` times. This script measures the loop's
mechanics over a ``HistoryMemory`` of LoCoMo raw turns (one record per turn, metadata
``dia_id``), queried with the QA questions, through ``SelfReflectiveMemory``:

(a) scripted judges, for ``max_rounds`` 0, 1, 2: retrieval rounds and LLM calls per query
    (distribution), and recall@k of the evidence turns among the *final* records (the
    selected ones on ``<Memory>``, the last retrieval's otherwise) against ``max_rounds=0``.
    Two judges:
    * ``rule_following``: ``ScriptedLLM(default=rule_following_reply)``: ``<Memory>`` with
      every candidate that shares a word of 4+ letters with the question, else ``<Query>``
      with the question's own words;
    * ``oracle``: a ScriptedLLM scripted per question *with the gold labels*: ``<Memory>``
      copying the evidence turns if any is among the candidates, else ``<Query>`` with the
      gold answer's words. Not a model: it shows what the loop can do when the judge is right.
    Both are mechanics checks, not evidence that the prompt works.
(b) the real local model (``LocalLLM()``, SmolLM2-135M-Instruct) on a few questions with
    ``max_rounds=1``: parse failures (the loop then keeps the candidates), ``<Memory>`` vs
    ``<Query>`` answers, rounds, LLM calls (repair retries included), latency, raw outputs.
    A 135M model: this records what happens, it does not validate the prompt.

    python benchmarks/reflection_loop.py                      # (a) + (b), 12 local queries
    python benchmarks/reflection_loop.py --local-queries 0    # (a) only
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from memories_core import HistoryMemory, Scope, SelfReflectiveMemory, Turn
from memories_core.errors import ParseError
from memories_core.evaluation import CATEGORY_NAMES, LocomoConversation, LocomoQA, load_locomo
from memories_core.interfaces import LLM
from memories_core.llms import ScriptedLLM
from memories_core.llms.base import BaseLLM, LLMResult
from memories_core.prompts.reflection import parse_reflection
from memories_core.prompts.rule_following import rule_following_reply
from memories_core.types import ChatMessage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from locomo_retrieval import CachedEmbedder
from machine_info import datasets_dir, machine, portable_path, save_figure

# First-stage figures (HistoryMemory reranks by default where the rerank extra is).
os.environ.setdefault("LLM_MEMORIES_LATE_INTERACTION", "off")

DATASETS = datasets_dir()
DEFAULT_DATA = DATASETS / "locomo" / "locomo_dev.json"
OUT = Path(__file__).resolve().parent / "out"
STEM = "reflection_loop"
ROUNDS = (0, 1, 2)
_WORD = re.compile(r"[A-Za-z0-9']{3,}")
_STOP = {
    "the",
    "and",
    "for",
    "with",
    "that",
    "this",
    "was",
    "were",
    "are",
    "has",
    "have",
    "had",
    "her",
    "his",
    "she",
    "him",
    "they",
    "their",
    "them",
    "not",
    "but",
    "from",
    "what",
    "when",
    "who",
    "how",
    "why",
    "which",
    "did",
    "does",
    "about",
    "also",
    "been",
    "its",
    "one",
    "out",
}


# --------------------------------------------------------------------------- helpers
class Recording(BaseLLM):
    """Forwards to another LLM and keeps every call's messages, output and wall time."""

    def __init__(self, inner: LLM) -> None:
        super().__init__()
        self.inner = inner
        self.log: list[dict[str, Any]] = []

    @property
    def name(self) -> str:
        return f"recording:{getattr(self.inner, 'name', type(self.inner).__name__)}"

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        t0 = time.perf_counter()
        text = self.inner.generate(
            list(messages), max_tokens=max_tokens, temperature=temperature, stop=stop
        )
        self.log.append(
            {
                "messages": [m.to_dict() for m in messages],
                "output": text,
                "seconds": time.perf_counter() - t0,
                "repair": len(messages) > 2,
            }
        )
        return LLMResult(text)


def verdict_of(output: str, question: str) -> str:
    """``memory``, ``query`` or ``unparsable``, as the library's parser reads the output."""
    try:
        v = parse_reflection(output, question)
    except ParseError:
        return "unparsable"
    return "memory" if v.memory is not None else "query"


def build_memory(conv: LocomoConversation, embedder: CachedEmbedder) -> HistoryMemory:
    """A HistoryMemory of one conversation through the public API (one save per session)."""
    memory = HistoryMemory(embedder=embedder, k=5)
    by_session: dict[int, list[Turn]] = defaultdict(list)
    for turn in conv.turns:
        if not turn.text.strip():
            continue
        start = conv.session_datetime(turn.session) or datetime(2023, 1, 1) + timedelta(
            days=turn.session
        )
        start = start.replace(tzinfo=timezone.utc)
        by_session[turn.session].append(
            Turn(
                "user",
                turn.text,
                speaker=turn.speaker,
                timestamp=start + timedelta(seconds=30 * len(by_session[turn.session])),
                metadata={"dia_id": turn.dia_id},
            )
        )
    for session, turns in sorted(by_session.items()):
        memory.save(turns, Scope(conv.sample_id, f"session_{session}"))
    return memory


def dia_ids(records: Sequence[Any]) -> list[str]:
    return [str(hit.record.metadata.get("dia_id")) for hit in records]


def recall(ids: Sequence[str], evidence: Sequence[str]) -> float:
    wanted = set(evidence)
    return len(wanted.intersection(ids)) / len(wanted)


# --------------------------------------------------------------------------- judges
class OracleJudge:
    """Scripted per question with the gold labels (see the module docstring)."""

    def __init__(self) -> None:
        self.evidence_texts: set[str] = set()
        self.answer = ""

    def set(self, evidence_texts: set[str], answer: str) -> None:
        self.evidence_texts = evidence_texts
        self.answer = answer

    def __call__(self, messages: Sequence[ChatMessage]) -> str:
        body = messages[-1].content
        block = re.search(r"<candidate_memory>\n(.*?)\n</candidate_memory>", body, re.S)
        question = re.search(r"<user_input>\n(.*?)\n</user_input>", body, re.S)
        candidates = [c[2:] for c in (block.group(1) if block else "").splitlines() if c != "NaN"]
        hits = [c for c in candidates if c in self.evidence_texts]
        if hits:
            return "<Memory>: " + " ".join(hits)
        asked = {w.lower() for w in _WORD.findall(question.group(1) if question else "")}
        words = [
            w
            for w in dict.fromkeys(_WORD.findall(self.answer))
            if w.lower() not in asked and w.lower() not in _STOP
        ]
        return "<Query>: " + ", ".join(words[:6] or ["details"])


# --------------------------------------------------------------------------- (a)
def run_scripted(
    memories: dict[str, HistoryMemory],
    convs: Sequence[LocomoConversation],
    judge_name: str,
    max_rounds: int,
    k: int,
) -> dict[str, Any]:
    oracle = OracleJudge()
    script: Callable[[Sequence[ChatMessage]], str] = (
        oracle if judge_name == "oracle" else rule_following_reply
    )
    llm = Recording(ScriptedLLM(default=script))
    rounds: Counter[int] = Counter()
    calls: Counter[int] = Counter()
    verdicts: Counter[str] = Counter()
    finals: list[int] = []
    per_cat: dict[int, list[float]] = defaultdict(list)
    failed = 0
    mismatched_calls = 0
    for conv in convs:
        memory = memories[conv.sample_id]
        reflective = SelfReflectiveMemory(memory, llm, max_rounds=max_rounds)
        texts = {t.dia_id: t.render() for t in conv.turns}
        scope = Scope(conv.sample_id)
        for qa in conv.qa:
            if not qa.evidence:
                continue
            oracle.set({texts[d] for d in qa.evidence if d in texts}, qa.answer)
            before_log = len(llm.log)
            before_calls = llm.usage.calls
            result_recall = reflective.recall(qa.question, scope, k=k)
            result = reflective.last_result
            assert result is not None
            made = llm.usage.calls - before_calls
            if made != result.llm_calls:
                mismatched_calls += 1
            rounds[result.rounds] += 1
            calls[made] += 1
            for entry in llm.log[before_log:]:
                verdicts[verdict_of(entry["output"], qa.question)] += 1
            failed += int(result.failed)
            finals.append(len(result_recall.records))
            per_cat[qa.category].append(recall(dia_ids(result_recall.records), qa.evidence))
    everything = [v for vs in per_cat.values() for v in vs]
    n = len(everything)
    return {
        "judge": judge_name,
        "max_rounds": max_rounds,
        "k": k,
        "queries": n,
        "rounds_distribution": {str(r): rounds[r] for r in sorted(rounds)},
        "llm_calls_distribution": {str(c): calls[c] for c in sorted(calls)},
        "mean_rounds": sum(r * c for r, c in rounds.items()) / n,
        "mean_llm_calls": sum(r * c for r, c in calls.items()) / n,
        "verdicts": dict(verdicts),
        "failed": failed,
        "llm_calls_field_mismatch": mismatched_calls,
        "mean_final_records": statistics.fmean(finals),
        "recall": statistics.fmean(everything),
        "recall_by_category": {
            CATEGORY_NAMES.get(c, str(c)): statistics.fmean(vs) for c, vs in sorted(per_cat.items())
        },
    }


# --------------------------------------------------------------------------- (b)
def pick_questions(conv: LocomoConversation, n: int) -> list[LocomoQA]:
    """Round-robin over the categories, in file order: a few questions of each kind."""
    by_cat: dict[int, list[LocomoQA]] = defaultdict(list)
    for qa in conv.qa:
        if qa.evidence:
            by_cat[qa.category].append(qa)
    picked: list[LocomoQA] = []
    i = 0
    while len(picked) < n and any(i < len(v) for v in by_cat.values()):
        for cat in sorted(by_cat):
            if i < len(by_cat[cat]) and len(picked) < n:
                picked.append(by_cat[cat][i])
        i += 1
    return picked


def run_local(
    memory: HistoryMemory,
    conv: LocomoConversation,
    n: int,
    k: int,
    max_new_tokens: int,
) -> dict[str, Any]:
    from memories_core.llms import LocalLLM

    local = LocalLLM(max_new_tokens=max_new_tokens)
    t0 = time.perf_counter()
    local.load()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    local.generate([ChatMessage("user", "Say hello.")], max_tokens=8)
    warmup_s = time.perf_counter() - t0
    llm = Recording(local)
    reflective = SelfReflectiveMemory(memory, llm, max_rounds=1)
    scope = Scope(conv.sample_id)
    rows: list[dict[str, Any]] = []
    for qa in pick_questions(conv, n):
        before_log = len(llm.log)
        before = local.usage
        t0 = time.perf_counter()
        base = memory.recall(qa.question, scope, k=k)
        got = reflective.recall(qa.question, scope, k=k)
        seconds = time.perf_counter() - t0
        result = reflective.last_result
        assert result is not None
        after = local.usage
        calls = [
            {
                "output": e["output"],
                "verdict": verdict_of(e["output"], qa.question),
                "repair": e["repair"],
                "seconds": round(e["seconds"], 1),
            }
            for e in llm.log[before_log:]
        ]
        rows.append(
            {
                "question": qa.question,
                "category": qa.category_name,
                "evidence": list(qa.evidence),
                "answer": qa.answer,
                "rounds": result.rounds,
                "queries": result.queries,
                "llm_calls": after.calls - before.calls,
                "reflection_rounds_counted": result.llm_calls,
                "prompt_tokens": after.prompt_tokens - before.prompt_tokens,
                "completion_tokens": after.completion_tokens - before.completion_tokens,
                "failed": result.failed,
                "memory_copied": result.memory,
                "seconds": round(seconds, 1),
                "candidates": len(base.records),
                "final_records": len(got.records),
                "recall_before": recall(dia_ids(base.records), qa.evidence),
                "recall_after": recall(dia_ids(got.records), qa.evidence),
                "calls": calls,
            }
        )
        print(
            f"  [{len(rows)}] {qa.category_name:11} rounds={result.rounds} "
            f"calls={rows[-1]['llm_calls']} failed={result.failed} "
            f"verdicts={[c['verdict'] for c in calls]} {seconds:.0f}s",
            flush=True,
        )
    first = Counter(r["calls"][0]["verdict"] for r in rows if r["calls"])
    all_verdicts = Counter(c["verdict"] for r in rows for c in r["calls"])
    secs = [r["seconds"] for r in rows]
    return {
        "model": local.name,
        "backend": local.backend,
        "max_new_tokens": max_new_tokens,
        "k": k,
        "load_seconds": round(load_s, 1),
        "warmup_seconds": round(warmup_s, 1),
        "queries": len(rows),
        "first_call_verdicts": dict(first),
        "all_call_verdicts": dict(all_verdicts),
        "failed_queries": sum(r["failed"] for r in rows),
        "rounds_distribution": dict(Counter(str(r["rounds"]) for r in rows)),
        "llm_calls_distribution": dict(Counter(str(r["llm_calls"]) for r in rows)),
        "mean_llm_calls": statistics.fmean(r["llm_calls"] for r in rows),
        "median_seconds": statistics.median(secs),
        "max_seconds": max(secs),
        "mean_prompt_tokens": statistics.fmean(r["prompt_tokens"] for r in rows),
        "mean_completion_tokens": statistics.fmean(r["completion_tokens"] for r in rows),
        "mean_final_records": statistics.fmean(r["final_records"] for r in rows),
        "recall_before": statistics.fmean(r["recall_before"] for r in rows),
        "recall_after": statistics.fmean(r["recall_after"] for r in rows),
        "rows": rows,
    }


# --------------------------------------------------------------------------- report
def scripted_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| judge | max_rounds | queries | retrieval rounds: distribution (mean) | "
        "LLM calls / query: distribution (mean) | verdicts (memory/query/unparsable) | "
        "final records (mean) | recall@k of evidence | Δ vs max_rounds=0 |",
        "|" + " --- |" * 9,
    ]
    base = {r["judge"]: r["recall"] for r in rows if r["max_rounds"] == 0}
    for r in rows:
        dist = ", ".join(f"{k}: {v}" for k, v in r["rounds_distribution"].items())
        cdist = ", ".join(f"{k}: {v}" for k, v in r["llm_calls_distribution"].items())
        v = r["verdicts"]
        lines.append(
            f"| {r['judge']} | {r['max_rounds']} | {r['queries']} | {dist} ({r['mean_rounds']:.2f})"
            f" | {cdist} ({r['mean_llm_calls']:.2f}) | {v.get('memory', 0)}/{v.get('query', 0)}/"
            f"{v.get('unparsable', 0)} | {r['mean_final_records']:.2f} | {r['recall']:.3f} | "
            f"{r['recall'] - base[r['judge']]:+.3f} |"
        )
    return "\n".join(lines)


def category_table(rows: list[dict[str, Any]]) -> str:
    cats = list(rows[0]["recall_by_category"])
    lines = [
        "| judge | max_rounds | " + " | ".join(cats) + " |",
        "|" + " --- |" * (2 + len(cats)),
    ]
    for r in rows:
        lines.append(
            f"| {r['judge']} | {r['max_rounds']} | "
            + " | ".join(f"{r['recall_by_category'][c]:.3f}" for c in cats)
            + " |"
        )
    return "\n".join(lines)


def local_table(local: dict[str, Any]) -> str:
    lines = [
        "| # | category | rounds | LLM calls | verdicts (1st call, repair) | fallback | "
        "seconds | candidates → final | recall@k before → after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(local["rows"], start=1):
        verdicts = ", ".join(c["verdict"] for c in r["calls"])
        lines.append(
            f"| {i} | {r['category']} | {r['rounds']} | {r['llm_calls']} | {verdicts} | "
            f"{'yes' if r['failed'] else 'no'} | {r['seconds']} | {r['candidates']} → "
            f"{r['final_records']} | {r['recall_before']:.2f} → {r['recall_after']:.2f} |"
        )
    return "\n".join(lines)


def local_summary(local: dict[str, Any]) -> str:
    return (
        f"`{local['model']}` ({local['backend']} runtime), "
        f"max_new_tokens={local['max_new_tokens']}, "
        f"k={local['k']}, max_rounds=1; load {local['load_seconds']}s, warm-up call "
        f"{local['warmup_seconds']}s. {local['queries']} queries: first-call verdicts "
        f"{local['first_call_verdicts']}, all calls {local['all_call_verdicts']}; "
        f"{local['failed_queries']} queries fell back to the candidates after a failed "
        f"(unparsable even after the repair retry) reflection; retrieval rounds "
        f"{local['rounds_distribution']}; LLM calls / query {local['llm_calls_distribution']} "
        f"(mean {local['mean_llm_calls']:.2f}); latency median {local['median_seconds']}s, max "
        f"{local['max_seconds']}s per query; mean prompt {local['mean_prompt_tokens']:.0f} / "
        f"completion {local['mean_completion_tokens']:.0f} tokens per query; recall@k of "
        f"evidence {local['recall_before']:.3f} (candidates) → {local['recall_after']:.3f} "
        f"(final), final records {local['mean_final_records']:.2f}."
    )


def examples(local: dict[str, Any], n: int = 3) -> list[str]:
    """A few raw first-call outputs: one per verdict kind first, then in order."""
    rows = [r for r in local["rows"] if r["calls"]]
    chosen: list[dict[str, Any]] = []
    for kind in ("memory", "query", "unparsable"):
        match = next((r for r in rows if r["calls"][0]["verdict"] == kind), None)
        if match is not None:
            chosen.append(match)
    chosen += [r for r in rows if r not in chosen]
    out = []
    for r in chosen[:n]:
        raw = r["calls"][0]["output"].strip().replace("\n", " ⏎ ")
        if len(raw) > 400:
            raw = raw[:400] + " …"
        out.append(f'- Q: "{r["question"]}" → ({r["calls"][0]["verdict"]}) `{raw}`')
    return out


def plot(rows: list[dict[str, Any]], local: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    judges = sorted({r["judge"] for r in rows})
    width = 0.35
    for j, judge in enumerate(judges):
        sub = [r for r in rows if r["judge"] == judge]
        xs = [r["max_rounds"] + (j - 0.5) * width for r in sub]
        axes[0].bar(xs, [r["mean_llm_calls"] for r in sub], width, label=f"{judge}: LLM calls")
        axes[0].plot(
            [r["max_rounds"] for r in sub],
            [r["mean_rounds"] for r in sub],
            marker="o",
            label=f"{judge}: retrieval rounds",
        )
        axes[1].plot(
            [r["max_rounds"] for r in sub], [r["recall"] for r in sub], marker="o", label=judge
        )
    if local is not None:
        axes[0].scatter(
            [1],
            [local["mean_llm_calls"]],
            marker="*",
            s=150,
            color="black",
            label="SmolLM2-135M: LLM calls",
        )
        axes[1].scatter(
            [1],
            [local["recall_after"]],
            marker="*",
            s=150,
            color="black",
            label=f"SmolLM2-135M ({local['queries']} q)",
        )
        axes[1].scatter([0], [local["recall_before"]], marker="*", s=150, color="grey")
    axes[0].set_xticks(list(ROUNDS))
    axes[0].set_xlabel("max_rounds")
    axes[0].set_ylabel("mean per query")
    axes[0].legend(fontsize=7)
    axes[0].set_title("reflection cost")
    axes[1].set_xticks(list(ROUNDS))
    axes[1].set_xlabel("max_rounds")
    axes[1].set_ylabel(f"recall@{rows[0]['k']} of evidence (final records)")
    axes[1].set_ylim(0, 1)
    axes[1].legend(fontsize=7)
    axes[1].set_title("recall of the final records")
    fig.suptitle("Self-reflective retrieval over LoCoMo raw turns (scripted judges = mechanics)")
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    parser.add_argument("--out", type=Path, default=OUT, help="output folder")
    parser.add_argument("--k", type=int, default=5, help="records recalled per search")
    parser.add_argument(
        "--conversations", type=int, default=0, help="(a): first N conversations (0 = all)"
    )
    parser.add_argument("--local-queries", type=int, default=12, help="(b): 0 to skip")
    parser.add_argument("--local-max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--from-json", type=Path, default=None, help="only re-render PNG/Markdown from a JSON"
    )
    args = parser.parse_args(argv)
    if args.from_json is not None:
        write_outputs(json.loads(args.from_json.read_text(encoding="utf-8")), args.out)
        return 0
    # The loop logs each failed reflection with its traceback; they are counted here instead.
    logging.getLogger("memories_core").setLevel(logging.ERROR)
    info = machine()
    convs = load_locomo(args.data)
    if args.conversations:
        convs = convs[: args.conversations]
    from memories_core.embedders import SentenceTransformerEmbedder

    inner = SentenceTransformerEmbedder()
    embedder = CachedEmbedder(inner, args.out / f"{STEM}_cache")
    seed = OUT / "cache" / embedder.file.name
    if seed.exists():
        data = np.load(seed)
        for key in data.files:
            embedder.vectors.setdefault(key, data[key])
    embedder.warm([t.render() for c in convs for t in c.turns if t.text.strip()], query=False)
    embedder.save()
    memories = {c.sample_id: build_memory(c, embedder) for c in convs}

    started = time.perf_counter()
    rows = [
        run_scripted(memories, convs, judge, rounds, args.k)
        for judge in ("rule_following", "oracle")
        for rounds in ROUNDS
    ]
    scripted_s = time.perf_counter() - started
    embedder.save()
    print(scripted_table(rows))
    print()
    print(category_table(rows))
    local = None
    if args.local_queries:
        print(f"(b) LocalLLM on {args.local_queries} questions of {convs[0].sample_id}:")
        local = run_local(
            memories[convs[0].sample_id],
            convs[0],
            args.local_queries,
            args.k,
            args.local_max_new_tokens,
        )
        print(local_summary(local))
        print(local_table(local))
        print("\n".join(examples(local)))

    command = "python benchmarks/reflection_loop.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    report = {
        "data": portable_path(args.data),
        "conversations": [c.sample_id for c in convs],
        "embedder": inner.name,
        "k": args.k,
        "machine": info,
        "command": command.strip(),
        "scripted_seconds": round(scripted_s, 1),
        "scripted": rows,
        "local": local,
    }
    write_outputs(report, args.out)
    return 0


def write_outputs(report: dict[str, Any], out: Path) -> None:
    """JSON, PNG and the Markdown snippet (also used by ``--from-json``)."""
    out.mkdir(parents=True, exist_ok=True)
    rows, local, info = report["scripted"], report["local"], report["machine"]
    (out / f"{STEM}.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    plot(rows, local, out / f"{STEM}.png")
    n_q = rows[0]["queries"]
    convs = report["conversations"]
    md = [
        "## Self-reflective retrieval loop (mechanics)",
        "",
        f"- machine: {info['nproc']} CPUs ({info['cpu']}), {info['ram']} RAM, {info['os']}, "
        f"Python {info['python']}; load average {info['load_avg_1min_at_start']} at start "
        "(shared machine: other benchmarks ran at the same time, so latencies are noisy)",
        f"- code: {info['code']}",
        f"- command: `{report['command']}`",
        f"- memory: `HistoryMemory` (library default hybrid search) of the LoCoMo raw turns of "
        f"{len(convs)} conversation(s) ({', '.join(convs)}), "
        f"`SelfReflectiveMemory` around it, k={report['k']} records per search; {n_q} "
        f"questions with evidence; embedder `{report['embedder']}`",
        "- judges in (a) are scripted, so (a) checks mechanics: `rule_following` = "
        "`ScriptedLLM(default=rule_following_reply)`; `oracle` = scripted per question with "
        "the gold evidence and answer (copies evidence candidates, else asks for the answer's "
        "words, which leaks the answer into the query: an upper bound, not a result). Neither "
        "says anything about how well a real model follows the prompt.",
        "- recall@k is over the *final* records (selected ones after `<Memory>`, else the "
        "last search's), so selection can only keep or lower it; a `<Query>` round can raise "
        'it. "LLM calls" are counted on the model (repair retries included).',
        f"- time: (a) {report['scripted_seconds']:.0f}s for {len(rows)} runs",
        "",
        scripted_table(rows),
        "",
        f"recall@{report['k']} per category:",
        "",
        category_table(rows),
        "",
    ]
    if local is not None:
        counted = sum(r["reflection_rounds_counted"] for r in local["rows"])
        made = sum(r["llm_calls"] for r in local["rows"])
        md += [
            "### (b) the real local model (SmolLM2-135M-Instruct): what happened",
            "",
            "A 135M-parameter model: these numbers describe its behaviour on this prompt, not "
            "the prompt's quality.",
            "",
            local_summary(local),
            "",
            f"`ReflectionResult.llm_calls` summed to {counted} over these queries while the "
            f"model counted {made} calls: the field counts reflection rounds, not the repair "
            "retries `generate_parsed` makes.",
            "",
            local_table(local),
            "",
            "Raw outputs (first reflection call; ⏎ = newline):",
            "",
            *examples(local),
            "",
        ]
    (out / f"{STEM}.md").write_text("\n".join(md), encoding="utf-8")
    print(f"wrote {out / STEM}.json/.png/.md")


if __name__ == "__main__":
    raise SystemExit(main())
