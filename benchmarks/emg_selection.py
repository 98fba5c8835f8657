"""EMG-RAG memory selection on LoCoMo dev (Wang et al., 2024, §4.3), and retrieval latency.

Memories: every LoCoMo ``observation`` fact, with its ``dia_id``, loaded into one EMG per
conversation (one user each). Entities and relations come from the rule-based stand-in
extractor (``memories_core.prompts.emg.emg_reply``; no LLM offline). Required memories of a
question: the observations whose dia_id is in its ``evidence``.

**Cross-validation by conversation**: each of the five dev conversations is the test set once;
the policy is trained (warm start + REINFORCE with the offline selection-F1 reward,
``EMGMemory.train_policy``'s defaults) on the other four. Reported on the pooled test
questions, and per fold (mean, min, max of the five fold F1s): selection precision / recall /
F1 of

* the trained policy with every state feature (the paper's three cosines of Eq. 1 plus our
  four relative features, ``memories_core.mechanisms.emg.policy``),
* the trained policy with the paper's three features only,

each with both decodes of ``EMGMemory.select``: the expected-F1 set of the warm-start
``P(required)`` (the default, variable size) and the greedy include/stop walk (Eq. 2);
* the untrained fallback (cosine threshold),
* fixed top-K, K = 1..10, of the activation ranking the walk starts from,
* two reference rows: the expected-F1 decode of REINFORCE's ``π(include)`` (why the decode
  reads the warm-start head), and the oracle size per question on the default ranking (an
  upper bound for any size rule, not a selector),

then the folds where each beats top-1, the distribution of selection sizes, F1 by number of
required memories and by LoCoMo category (where variable size wins or loses against the best
fixed K), and recall@k of the evidence.

Each question's walk environment (activation search, graph edges, states) is built once with
``EMGMemory.selector.environment`` and reused by every fold and selector; that it gives exactly what
the public ``EMGMemory.select`` gives is checked on a sample of questions before the run.

Latency: ``EMGMemory.select`` (``answer``'s retrieval step) at 1k and 10k memories per user
(synthetic facts), without the LLM, after a warm-up; the question's embedding (one MiniLM
call) is timed apart as well.

**Generated questions** (``--generated stand-in|local``, appendix A.1 step 3): no LoCoMo question
trains anything. Questions are written from each conversation's own memories by
``EMGMemory.generate_questions`` (sessions of consecutive observations, validated pairs), with
the rule-based stand-in writer (``emg_reply``) or the offline default model (``local``:
``memories_core.engine.default_llm()``, Qwen2.5-Coder-1.5B with the extra ``qwen``, else
SmolLM2-135M; slow here, so ``--sessions`` and ``--budget`` bound it, taking the
conversations' sessions round robin). The policy is trained
on them (every conversation's, as a store-wide policy is; and, as a check, leave one
conversation out) and tested on LoCoMo's real questions, against the untrained default (top-1)
and fixed top-K. Writes ``benchmarks/out/emg_generated_<writer>.{json,md}``.

Run: ``python benchmarks/emg_selection.py [DATASETS]`` (default: ``../shared/datasets`` next to
the repository). Writes ``benchmarks/out/emg_selection.{json,md,png}``; embeddings are cached
under ``benchmarks/out/cache/``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo_retrieval import CachedEmbedder
from machine_info import command_line, datasets_dir, machine
from tqdm.auto import tqdm

from memories_core import FixedClock
from memories_core.embedders import SentenceTransformerEmbedder
from memories_core.mechanisms.emg import EMGMemory, TrainingExample, is_held_out
from memories_core.mechanisms.emg.policy import ALL_FEATURES, PAPER_FEATURES, SelectionPolicy
from memories_core.mechanisms.emg.selection import Selector
from memories_core.mechanisms.emg.training import beats_top1, held_out_check, train_on
from memories_core.prompts.emg import EXTRACT, ExtractInput, parse_extract

OUT = Path(__file__).resolve().parent / "out"
NOW = datetime(2024, 1, 1, tzinfo=timezone.utc)
#: Not a selector: the best prefix size per question on the default decode's ranking, knowing
#: the required memories (how much a perfect size choice could add).
ORACLE = "oracle size on the default ranking (upper bound, not a selector)"
#: The expected-F1 decode applied to REINFORCE's π(include) instead of the warm-start head.
PI_DECODED = "trained policy, expected-F1 of REINFORCE's π (no warm-start head)"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


def extract(text: str) -> list[Any]:
    """The stand-in extractor's memories of one observation (one statement at least)."""
    inputs = ExtractInput(text, NOW)
    found = parse_extract(EXTRACT.stand_in(inputs), inputs)
    return found[:1]


def load(memory: EMGMemory, sample: dict[str, Any]) -> dict[str, str]:
    """Load a conversation's observations in one batch; returns memory id -> dia_ids."""
    user = sample["sample_id"]
    batch: list[Any] = []
    dias: list[str] = []
    for facts in sample["observation"].values():
        for _speaker, items in facts.items():
            for text, dia in items:
                found = extract(text)
                if found:
                    batch.append(found[0])
                    dias.append(dia if isinstance(dia, str) else ",".join(dia))
    edits = memory.add_memories(user, batch, at=NOW, edit=False)
    return {e.record_id: d for e, d in zip(edits, dias, strict=True) if e.record_id}


def examples(sample: dict[str, Any], ids: dict[str, str]) -> list[tuple[TrainingExample, int]]:
    """The conversation's questions with required memories, with their LoCoMo category."""
    by_dia: dict[str, set[str]] = {}
    for rid, dias in ids.items():
        for dia in dias.split(","):
            by_dia.setdefault(dia.strip(), set()).add(rid)
    out = []
    for qa in sample["qa"]:
        evidence = [e.strip() for e in qa.get("evidence", []) for e in str(e).split(";")]
        required = frozenset(r for e in evidence for r in by_dia.get(e, ()))
        if required and qa.get("question"):
            example = TrainingExample(
                sample["sample_id"], qa["question"], required, str(qa.get("answer"))
            )
            out.append((example, int(qa.get("category", 0))))
    return out


def prf(selected: Sequence[str], required: frozenset[str]) -> tuple[float, float, float]:
    hits = len(set(selected) & required)
    p = hits / len(selected) if selected else 0.0
    r = hits / len(required)
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def summarise(rows: list[tuple[float, float, float, int]]) -> dict[str, float]:
    return {
        "precision": statistics.mean(r[0] for r in rows),
        "recall": statistics.mean(r[1] for r in rows),
        "f1": statistics.mean(r[2] for r in rows),
        "mean_size": statistics.mean(r[3] for r in rows),
    }


def cross_validate(
    memory: EMGMemory,
    data: list[tuple[TrainingExample, int]],
    envs: list[Any],
    users: list[str],
    train_kwargs: dict[str, Any],
) -> dict[str, Any]:
    """Leave-one-conversation-out: per-question results of every selector, per fold."""
    per_q: dict[str, list[tuple[float, float, float, int]]] = {}
    fold_of: list[int] = []
    order: list[int] = []
    training: list[dict[str, Any]] = []
    selectors: dict[str, Callable[[Any, TrainingExample], list[str]]] = {}

    def top(k: int) -> Callable[[Any, TrainingExample], list[str]]:
        return lambda env, ex: list(env.pool)[:k]

    for k in range(1, 11):
        selectors[f"top-{k}"] = top(k)
    selectors["untrained fallback"] = lambda env, ex: [
        h.record.id for h in memory.selector.choose(env, None).memories
    ]
    for fold, user in enumerate(users):
        test = [i for i, (ex, _) in enumerate(data) if ex.user_id == user]
        train = [i for i, (ex, _) in enumerate(data) if ex.user_id != user]
        policies: dict[str, SelectionPolicy] = {}
        for name, features in (
            ("trained policy", ALL_FEATURES),
            ("trained policy (paper's 3 features)", PAPER_FEATURES),
        ):
            started = time.perf_counter()
            policy = SelectionPolicy.initial(0, features)
            report = train_on(
                memory.selector,
                policy,
                [data[i][0] for i in train],
                [envs[i] for i in train],
                when=NOW,
                reward_llm=None,
                progress=False,
                **train_kwargs,
            )
            policies[name] = policy
            training.append(
                {
                    "fold": fold,
                    "test_conversation": user,
                    "selector": name,
                    "train_questions": len(train),
                    "test_questions": len(test),
                    "states": report.states,
                    "positives": report.positives,
                    "mean_return": report.mean_return,
                    "seconds": time.perf_counter() - started,
                }
            )
        for i in test:
            ex, env = data[i][0], envs[i]
            fold_of.append(fold)
            order.append(i)
            for name, choose in selectors.items():
                chosen = choose(env, ex)
                per_q.setdefault(name, []).append((*prf(chosen, ex.required), len(chosen)))
            policy = policies["trained policy"]
            walk = memory.selector.traverse(env, Selector.scorer(policy))
            ranked = sorted({v.record_id: v.score for v in walk}.items(), key=lambda x: -x[1])
            ids = [rid for rid, _ in ranked][: memory.max_select]
            f1s = [prf(ids[:k], ex.required)[2] for k in range(1, len(ids) + 1)] or [0.0]
            best = ids[: 1 + f1s.index(max(f1s))]
            per_q.setdefault(ORACLE, []).append((*prf(best, ex.required), len(best)))
            bare = SelectionPolicy.from_json(policy.to_json())
            bare.meta = {}  # no warm-start head, no Platt map: REINFORCE's π(include) itself
            chosen = [
                h.record.id for h in memory.selector.choose(env, bare, "expected_f1").memories
            ]
            per_q.setdefault(PI_DECODED, []).append((*prf(chosen, ex.required), len(chosen)))
            for name, policy in policies.items():
                for decode, label in (
                    ("expected_f1", name),
                    ("greedy", f"{name}, greedy walk"),
                ):
                    chosen = [
                        h.record.id for h in memory.selector.choose(env, policy, decode).memories
                    ]
                    per_q.setdefault(label, []).append((*prf(chosen, ex.required), len(chosen)))
    return {"per_question": per_q, "fold": fold_of, "order": order, "training": training}


def generated_run(
    memory: EMGMemory,
    data: list[tuple[TrainingExample, int]],
    envs: list[Any],
    users: list[str],
    loaded: dict[str, list[str]],
    train_kwargs: dict[str, Any],
    writer: str,
    sessions: int | None,
    budget: float | None = None,
) -> dict[str, Any]:
    """Train on questions generated from the memories; test on LoCoMo's real questions."""
    from memories_core.llms import ScriptedLLM
    from memories_core.prompts.emg import emg_reply

    if writer == "local":
        import torch

        from memories_core.engine import default_llm

        torch.set_num_threads(os.cpu_count() or 1)  # the model is the only work now
        llm: Any = default_llm()
        writer_label = f"offline default model {getattr(llm, 'name', type(llm).__name__)}"
    else:
        llm = ScriptedLLM(default=emg_reply)
        writer_label = "stand-in emg_reply"
    generated: list[TrainingExample] = []
    made: dict[str, Any] = {
        u: {"sessions": 0, "sessions_without_a_usable_pair": 0, "questions": 0, "seconds": 0.0}
        for u in users
    }
    chunks: dict[str, list[list[Any]]] = {}
    for user in users:
        by_id = {r.id: r for r in memory.engine.get(user, loaded[user])}
        records = [by_id[rid] for rid in loaded[user]]  # LoCoMo's order (sessions in time)
        size = memory.session_size
        chunks[user] = [records[i : i + size] for i in range(0, len(records), size)]
    rounds = max(len(c) for c in chunks.values())
    if sessions is not None:
        rounds = min(rounds, sessions)
    started = time.perf_counter()
    # Round robin over the conversations (their first sessions first), so that a time budget
    # cut leaves every conversation with about as many sessions.
    for index in tqdm(range(rounds), desc="question sessions (rounds)"):
        if budget is not None and time.perf_counter() - started > budget:
            break
        for user in users:
            if index >= len(chunks[user]):
                continue
            t0 = time.perf_counter()
            found, sent, rejected = memory.generate_questions(
                user, memories=chunks[user][index], llm=llm, now=NOW
            )
            generated.extend(found)
            row = made[user]
            row["sessions"] += sent
            row["sessions_without_a_usable_pair"] += rejected
            row["questions"] += len(found)
            row["seconds"] += time.perf_counter() - t0
            row.setdefault("examples", []).extend(
                {"question": e.question, "answer": e.answer, "required": len(e.required)}
                for e in found[: max(0, 5 - len(row.get("examples", [])))]
            )
    for user in users:
        mine = [e for e in generated if e.user_id == user]
        made[user]["multi_memory_questions"] = sum(len(e.required) > 1 for e in mine)
    generation_seconds = time.perf_counter() - started
    gen_envs = [
        memory.selector.environment(e.question, e.user_id, NOW, memory.activate)
        for e in tqdm(generated, desc="generated environments")
    ]
    per_q: dict[str, list[tuple[float, float, float, int]]] = {}
    fold_of: list[int] = []

    def train(indices: list[int]) -> SelectionPolicy | None:
        if not indices:
            return None
        policy = SelectionPolicy.initial(0, ALL_FEATURES)
        try:
            train_on(
                memory.selector,
                policy,
                [generated[i] for i in indices],
                [gen_envs[i] for i in indices],
                when=NOW,
                reward_llm=None,
                progress=False,
                **train_kwargs,
            )
        except Exception as exc:  # e.g. no reachable memory: report it, keep the fallback
            print(f"training failed: {exc}")
            return None
        return policy

    def check(policy: SelectionPolicy | None, indices: list[int]) -> dict[str, float]:
        """``train_and_check``'s held-out check (its keep rule is ``beats_top1``)."""
        if policy is None or not indices:
            return {"questions": float(len(indices)), "policy_f1": 0.0, "top1_f1": 0.0}
        return held_out_check(
            memory.selector,
            policy,
            [generated[i] for i in indices],
            envs=[gen_envs[i] for i in indices],
        )

    held = [i for i, e in enumerate(generated) if is_held_out(e)]
    rest = [i for i, e in enumerate(generated) if not is_held_out(e)]
    everyone = train(rest)
    gates = {"all conversations": check(everyone, held)}
    for fold, user in enumerate(users):
        others = train([i for i in rest if generated[i].user_id != user])
        gates[f"without {user}"] = check(others, [i for i in held if generated[i].user_id != user])
        for (ex, _), env in zip(data, envs, strict=True):
            if ex.user_id != user:
                continue
            fold_of.append(fold)
            rows: dict[str, list[str]] = {
                "top-1": list(env.pool)[:1],
                "top-2": list(env.pool)[:2],
                "top-3": list(env.pool)[:3],
                "untrained default (top-1 fallback)": [
                    h.record.id for h in memory.selector.choose(env, None).memories
                ],
            }
            for name, policy, gate in (
                ("all conversations", everyone, gates["all conversations"]),
                ("other conversations only", others, gates[f"without {user}"]),
            ):
                label = f"trained on generated questions ({name})"
                chosen = (
                    []
                    if policy is None
                    else [h.record.id for h in memory.selector.choose(env, policy).memories]
                )
                greedy = (
                    []
                    if policy is None
                    else [
                        h.record.id for h in memory.selector.choose(env, policy, "greedy").memories
                    ]
                )
                rows[label] = chosen
                rows[f"{label}, greedy walk"] = greedy
                kept = policy is not None and beats_top1(gate)
                rows[f"automatic ({name}): policy if it beats top-1 on held-out generated"] = (
                    chosen if kept else rows["untrained default (top-1 fallback)"]
                )
            for name, chosen in rows.items():
                per_q.setdefault(name, []).append((*prf(chosen, ex.required), len(chosen)))
    pooled = {name: summarise(rows) for name, rows in per_q.items()}
    fold_f1 = {
        name: [
            statistics.mean(r[2] for r, f in zip(rows, fold_of, strict=True) if f == fold)
            for fold in range(len(users))
        ]
        for name, rows in per_q.items()
    }
    return {
        "writer": writer_label,
        "sessions_per_conversation": sessions,
        "generation_budget_s": budget,
        "session_size": memory.session_size,
        "questions_per_session": memory.questions_per_session,
        "generated_questions": len(generated),
        "generation_seconds": generation_seconds,
        "per_conversation": made,
        "pooled": pooled,
        "fold_f1": fold_f1,
        "held_out_checks": gates,
        "test_questions": len(data),
    }


def generated_markdown(result: dict[str, Any]) -> str:
    gen = result["generated"]
    lines = [
        f"Writer: {gen['writer']}; {gen['generated_questions']} generated questions "
        f"({sum(v['multi_memory_questions'] for v in gen['per_conversation'].values())} with 2+ "
        f"memories) from {sum(v['sessions'] for v in gen['per_conversation'].values())} sessions "
        f"of {gen['session_size']} memories in {gen['generation_seconds']:.0f} s; tested on "
        f"{gen['test_questions']} LoCoMo questions.",
        "",
        "| selector | precision | recall | F1 | mean size | fold F1 mean [min, max] |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in gen["pooled"].items():
        folds = gen["fold_f1"][name]
        lines.append(
            f"| {name} | {row['precision']:.3f} | {row['recall']:.3f} | {row['f1']:.3f} | "
            f"{row['mean_size']:.2f} | {statistics.mean(folds):.3f} "
            f"[{min(folds):.3f}, {max(folds):.3f}] |"
        )
    lines += ["", "| held-out generated questions | questions | policy F1 | top-1 F1 | kept |"]
    lines += ["|---|---|---|---|---|"]
    for name, gate in gen["held_out_checks"].items():
        kept = beats_top1(gate)
        lines.append(
            f"| {name} | {int(gate['questions'])} | {gate['policy_f1']:.3f} | "
            f"{gate['top1_f1']:.3f} | {'yes' if kept else 'no'} |"
        )
    return "\n".join(lines)


def report_tables(
    cv: dict[str, Any], data: list[tuple[TrainingExample, int]], folds: int
) -> dict[str, Any]:
    per_q, fold_of, order = cv["per_question"], cv["fold"], cv["order"]
    pooled = {name: summarise(rows) for name, rows in per_q.items()}
    fold_f1 = {
        name: [
            statistics.mean(r[2] for r, f in zip(rows, fold_of, strict=True) if f == fold)
            for fold in range(folds)
        ]
        for name, rows in per_q.items()
    }
    fixed = [f"top-{k}" for k in range(1, 11)]
    best_fixed_per_fold = [max(fixed, key=lambda n: fold_f1[n][fold]) for fold in range(folds)]
    wins = {
        name: sum(
            fold_f1[name][fold] > fold_f1[best_fixed_per_fold[fold]][fold] for fold in range(folds)
        )
        for name in per_q
        if name.startswith("trained")
    }
    beats_top1 = {
        name: sum(fold_f1[name][fold] > fold_f1["top-1"][fold] for fold in range(folds))
        for name in per_q
        if name.startswith("trained")
    }
    sizes = {
        name: {
            label: sum(1 for r in rows if key(r[3])) / len(rows)
            for label, key in (
                ("1", lambda n: n == 1),
                ("2", lambda n: n == 2),
                ("3", lambda n: n == 3),
                ("4+", lambda n: n >= 4),
            )
        }
        for name, rows in per_q.items()
        if name.startswith("trained") or name == "untrained fallback"
    }
    groups: dict[str, Callable[[int], str]] = {
        "required memories": lambda i: str(min(len(data[i][0].required), 4)).replace("4", "4+"),
        "category": lambda i: CATEGORIES.get(data[i][1], str(data[i][1])),
    }
    breakdown: dict[str, dict[str, dict[str, float]]] = {}
    for title, key in groups.items():
        table: dict[str, dict[str, float]] = {}
        for pos, i in enumerate(order):
            group = key(i)
            for name, rows in per_q.items():
                table.setdefault(group, {}).setdefault(name, 0.0)
                table[group][name] += rows[pos][2]
            table[group].setdefault("_n", 0.0)
            table[group]["_n"] += 1
        for _group, vals in table.items():
            n = vals.pop("_n")
            for name in vals:
                vals[name] /= n
            vals["questions"] = n
        breakdown[title] = dict(sorted(table.items()))
    return {
        "pooled": pooled,
        "fold_f1": fold_f1,
        "best_fixed_per_fold": best_fixed_per_fold,
        "folds_beating_best_fixed": wins,
        "folds_beating_top1": beats_top1,
        "size_distribution": sizes,
        "breakdown": breakdown,
    }


def latency(embedder: Any, sizes: tuple[int, ...], questions: int = 30) -> dict[str, Any]:
    """Median / p90 time of ``select`` (answer's retrieval step) per memory count."""
    rng = random.Random(0)
    people = ["Anna", "Ben", "Carla", "Dev", "Elif", "Femi", "Gus", "Hana", "Ivo", "Jun"]
    places = ["Amsterdam", "Berlin", "Cairo", "Denver", "Oslo", "Lima", "Porto", "Seoul"]
    verbs = ["visited", "booked", "likes", "called", "met", "bought", "sold", "painted"]
    things = ["a blue bike", "the EK349 flight", "a new phone", "tickets", "a guitar", "a cake"]
    out: dict[str, Any] = {}
    for size in sizes:
        memory = EMGMemory(llm=_NoLLM(), embedder=embedder, clock=FixedClock(NOW))  # type: ignore[arg-type]
        facts = []
        for i in range(size):
            who, verb, what, where = (
                rng.choice(people),
                rng.choice(verbs),
                rng.choice(things),
                rng.choice(places),
            )
            facts.append(f"{who} {verb} {what} in {where} on day {i}.")
        for start in tqdm(range(0, size, 500), desc=f"load {size}"):
            batch = [m for text in facts[start : start + 500] for m in extract(text)]
            memory.add_memories("bench", batch, at=NOW, edit=False)
        qs = [
            f"What did {rng.choice(people)} do in {rng.choice(places)} on day {rng.randrange(size)}"
            for _ in range(questions)
        ]
        inner = embedder.inner
        for q in qs:  # warm: the model is loaded, names and relations are cached
            memory.select(q, "bench", now=NOW)
        times, embed_times = [], []
        for q in qs:
            start = time.perf_counter()
            memory.select(q, "bench", now=NOW)
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
            inner.embed_query(q)
            embed_times.append(time.perf_counter() - start)
        # Uncached questions: the benchmark's embedder memoises texts; time the real path too.
        fresh = [f"Which place did {p} visit with {t}?" for p in people for t in things][:questions]
        uncached = []
        for q in fresh:
            embedder.vectors.pop(embedder.key("q", q), None)
            start = time.perf_counter()
            memory.select(q, "bench", now=NOW)
            uncached.append(time.perf_counter() - start)
        times.sort()
        uncached.sort()
        out[str(size)] = {
            "median_s": statistics.median(times),
            "p90_s": times[int(0.9 * (len(times) - 1))],
            "median_uncached_question_s": statistics.median(uncached),
            "p90_uncached_question_s": uncached[int(0.9 * (len(uncached) - 1))],
            "median_question_embedding_s": statistics.median(embed_times),
            "questions": questions,
        }
        memory.close()
    return out


class _NoLLM:
    """The selection never calls a model; any call is a bug in the benchmark."""

    name = "none"

    def generate(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("selection must not call the LLM")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = result["tables"]["pooled"]
    ks = list(range(1, 11))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
    ax.plot(ks, [sel[f"top-{k}"]["f1"] for k in ks], "o-", label="fixed top-K F1")
    ax.plot(ks, [sel[f"top-{k}"]["precision"] for k in ks], ".:", label="fixed top-K precision")
    ax.plot(ks, [sel[f"top-{k}"]["recall"] for k in ks], ".:", label="fixed top-K recall")
    for name, style in (
        ("trained policy", "r"),
        ("trained policy, greedy walk", "orange"),
        ("trained policy (paper's 3 features)", "m"),
        ("untrained fallback", "g"),
    ):
        row = sel[name]
        ax.scatter(
            [row["mean_size"]],
            [row["f1"]],
            c=style,
            marker="*",
            s=180,
            zorder=5,
            label=f"{name} F1 (mean size {row['mean_size']:.2f})",
        )
    ax.set_xlabel("memories selected (K, or mean selection size)")
    ax.set_ylabel("score")
    ax.set_title("Selection on LoCoMo dev, 5-fold leave-one-conversation-out")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    by_req = result["tables"]["breakdown"]["required memories"]
    groups = list(by_req)
    width = 0.2
    for j, (name, colour) in enumerate(
        (
            ("top-1", "#1f77b4"),
            ("top-2", "#aec7e8"),
            ("trained policy, greedy walk", "#ff9896"),
            ("trained policy", "r"),
        )
    ):
        bx.bar(
            [g + (j - 1.5) * width for g in range(len(groups))],
            [by_req[g][name] for g in groups],
            width,
            label=name,
            color=colour,
        )
    bx.set_xticks(range(len(groups)))
    bx.set_xticklabels([f"{g}\n(n={int(by_req[g]['questions'])})" for g in groups])
    bx.set_xlabel("required memories of the question")
    bx.set_ylabel("F1")
    bx.set_title("Where variable size helps: F1 by required memories")
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3, axis="y")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    tables = result["tables"]
    lines = [
        "| selector | precision | recall | F1 | mean size | fold F1 mean [min, max] |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in tables["pooled"].items():
        folds = tables["fold_f1"][name]
        lines.append(
            f"| {name} | {row['precision']:.3f} | {row['recall']:.3f} | {row['f1']:.3f} | "
            f"{row['mean_size']:.2f} | {statistics.mean(folds):.3f} "
            f"[{min(folds):.3f}, {max(folds):.3f}] |"
        )
    lines += [
        "",
        f"Best fixed K per fold: {', '.join(tables['best_fixed_per_fold'])}; folds where the "
        "policy's F1 beats that fold's best fixed K: "
        + ", ".join(f"{k}: {v}/5" for k, v in tables["folds_beating_best_fixed"].items()),
    ]
    lines += [
        "",
        "Folds where the F1 beats top-1's (strictly): "
        + ", ".join(f"{k}: {v}/5" for k, v in tables["folds_beating_top1"].items()),
        "",
        "| selector | size 1 | size 2 | size 3 | size 4+ |",
        "|---|---|---|---|---|",
    ]
    for name, dist in tables["size_distribution"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.1%}" for v in dist.values()) + " |")
    shown = ["top-1", "top-2", "top-3", "trained policy", "trained policy, greedy walk"]
    for title, table in tables["breakdown"].items():
        lines += ["", f"| F1 by {title} | questions | " + " | ".join(shown) + " |"]
        lines += ["|---|---|" + "---|" * len(shown)]
        for group, vals in table.items():
            lines.append(
                f"| {group} | {int(vals['questions'])} | "
                + " | ".join(f"{vals[n]:.3f}" for n in shown)
                + " |"
            )
    lines += ["", "| k | recall@k |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in result["recall_at_k"].items()]
    lines += [
        "",
        "| memories per user | median select (s) | p90 (s) | median, uncached question (s) "
        "| of which question embedding (s) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {n} | {v['median_s']:.4f} | {v['p90_s']:.4f} | {v['median_uncached_question_s']:.4f} "
        f"| {v['median_question_embedding_s']:.4f} |"
        for n, v in result["latency"].items()
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "datasets",
        nargs="?",
        default=str(datasets_dir()),
    )
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--warm-epochs", type=int, default=300)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument(
        "--generated",
        default=None,
        help="comma-separated writers (stand-in, local): train on questions generated from "
        "the memories (not LoCoMo's), test on LoCoMo's, and stop",
    )
    parser.add_argument(
        "--conversations", type=int, default=None, help="only the first N conversations"
    )
    parser.add_argument("--sessions", type=int, default=None, help="sessions per conversation")
    parser.add_argument(
        "--budget", type=float, default=None, help="stop generating after this many seconds"
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # 2 shared cores; more threads only contend
    OUT.mkdir(parents=True, exist_ok=True)
    data_file = Path(args.datasets) / "locomo" / "locomo_dev.json"
    conversations = json.loads(data_file.read_text())[: args.conversations]
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), OUT / "cache")
    memory = EMGMemory(llm=_NoLLM(), embedder=embedder, clock=FixedClock(NOW))  # type: ignore[arg-type]
    data: list[tuple[TrainingExample, int]] = []
    users = []
    loaded: dict[str, list[str]] = {}
    for sample in tqdm(conversations, desc="load conversations"):
        ids = load(memory, sample)
        data.extend(examples(sample, ids))
        users.append(sample["sample_id"])
        loaded[sample["sample_id"]] = list(ids)
    embedder.save()
    envs = [
        memory.selector.environment(ex.question, ex.user_id, NOW, memory.activate)
        for ex, _ in tqdm(data, desc="walk environments")
    ]
    embedder.save()
    # The cached environments give what the public select gives (threshold and a policy).
    probe = SelectionPolicy.initial(1, ALL_FEATURES)
    probe.trained = True
    for i in random.Random(0).sample(range(len(data)), 5 if args.generated else 20):
        ex = data[i][0]
        for policy in (None, probe):
            public = memory.select(ex.question, ex.user_id, now=NOW, policy=policy)
            cached = memory.selector.choose(envs[i], policy)
            assert [h.record.id for h in public.memories] == [
                h.record.id for h in cached.memories
            ], ex.question
    recall_at: dict[int, list[float]] = {k: [] for k in (1, 3, 5, 10, 20)}
    for (ex, _), env in zip(data, envs, strict=True):
        ranked = list(env.pool)
        for k in recall_at:
            recall_at[k].append(len(set(ranked[:k]) & ex.required) / len(ex.required))
    train_kwargs = {
        "warm_epochs": args.warm_epochs,
        "episodes": args.episodes,
        "batch": 16,
        "lr": 1e-3,
        "warm_lr": 1e-2,
        "balance": False,
        "seed": 0,
    }
    if args.generated:
        for writer in args.generated.split(","):
            if writer not in ("stand-in", "local"):
                raise SystemExit(f"unknown writer {writer!r}")
            gen = generated_run(
                memory,
                data,
                envs,
                users,
                loaded,
                train_kwargs,
                writer,
                args.sessions,
                args.budget,
            )
            embedder.save()
            out = {
                "command": command_line("benchmarks/emg_selection.py", sys.argv[1:]),
                "conversations": users,
                "train_settings": train_kwargs,
                "generated": gen,
                "machine": machine(),
            }
            name = f"emg_generated_{writer}"
            (OUT / f"{name}.json").write_text(json.dumps(out, indent=1, default=str))
            text = generated_markdown(out)
            (OUT / f"{name}.md").write_text(text + "\n")
            print(text, flush=True)
        memory.close()
        return
    started = time.perf_counter()
    cv = cross_validate(memory, data, envs, users, train_kwargs)
    result: dict[str, Any] = {
        "command": command_line("benchmarks/emg_selection.py", sys.argv[1:]),
        "questions": len(data),
        "train_settings": train_kwargs,
        "threshold": memory.threshold,
        "tables": report_tables(cv, data, len(users)),
        "training": cv["training"],
        "cv_seconds": time.perf_counter() - started,
        "recall_at_k": {k: statistics.mean(v) for k, v in recall_at.items()},
    }
    memory.close()
    result["latency"] = (
        {} if args.skip_latency else latency(embedder, tuple(int(s) for s in args.sizes.split(",")))
    )
    embedder.save()
    result["machine"] = machine()
    (OUT / "emg_selection.json").write_text(json.dumps(result, indent=1, default=str))
    plot(result, OUT / "emg_selection.png")
    text = markdown(result)
    (OUT / "emg_selection.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
