"""MemoChat memo retrieval: where the none-of-the-others option goes, measured with a real model.

MemoChat's retrieval prompt (Lu et al., 2023, §3.2, Table 7) shows the memo options with a
"none of the others" (NOTO) option inserted at a random place, so that a model cannot learn
to skip or pick the last line. The library shows NOTO at a reproducible pseudo-random place
(:func:`memories_core.prompts.memochat.noto_position`). This script asks the same model the
same questions with NOTO at each of these places and scores the answers:

* ``last``: NOTO after the last option (the library before it followed §3.2);
* ``hashed``: :func:`~memories_core.prompts.memochat.noto_position` (the library's default);
* ``reference``: where the test item itself shows it (the released data's own random place).

Items: every ``retrieval_*`` item of MemoChat's test set whose reference answer is NOTO, plus
the first ``--sample / 2`` other items of each source. Per order it prints the paper's option
F1 (NOTO included; an answer that names no real option counts as NOTO, as in
``memochat_eval.py``), the share of NOTO items answered NOTO, the share of other items
answered NOTO, how many items score better / worse than under the first order given (and
whose choice changed), failed calls and seconds per query. The choice is asked through the
library's :func:`~memories_core.mechanisms.memochat.choose_memos` (its ``noto_at`` sets the
place), as every MemoChat recall asks it. Every answer is appended to a JSON-lines file as it comes
(``--resume`` reuses them), so an interrupted run loses nothing.

    python benchmarks/memochat_noto_order.py [ITEMS] [--sample 20] [--model qwen2.5-1.5b]
        [--orders last,hashed,reference] [--resume]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import save_figure
from memochat_eval import DEFAULT_ITEMS, f1, retrieval_items

from memories_core.mechanisms.memochat import choose_memos
from memories_core.prompts.memochat import noto_position

OUT = Path(__file__).resolve().parent / "out"
ORDERS = ("last", "hashed", "reference")


def sample(items: Sequence[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Every NOTO-reference item, then the first ``n // 2`` other items of each source."""
    noto = [it for it in items if it["gold"] == {it["noto"]}]
    sources = sorted({it["source"] for it in items})
    others = [
        it
        for s in sources
        for it in [x for x in items if x["source"] == s and x["gold"] != {x["noto"]}][: n // 2]
    ]
    return noto + others


def place(item: dict[str, Any], order: str) -> int:
    """1-based NOTO position among the item's real options for ``order``."""
    real = [o for i, o in enumerate(item["options"], 1) if i != item["noto"]]
    if order == "last":
        return len(real) + 1
    if order == "hashed":
        return noto_position(item["query"], real)
    if order == "reference":
        return int(item["noto"])
    raise ValueError(f"unknown order {order!r}; known: {', '.join(ORDERS)}")


def key(item: dict[str, Any], order: str) -> str:
    return f"{item['source']}:{item['position']}:{order}"


def ask(llm: Any, item: dict[str, Any], order: str) -> dict[str, Any]:
    """One memo choice (the library's ``choose_memos``), in the item's own option numbers."""
    numbers = [i for i in range(1, len(item["options"]) + 1) if i != item["noto"]]
    real = [item["options"][i - 1] for i in numbers]
    at = place(item, order)
    started = time.perf_counter()
    chosen = choose_memos(llm, item["query"], real, noto_at=at)
    return {
        "key": key(item, order),
        "order": order,
        "noto_at": at,
        "chosen": None if chosen is None else sorted(numbers[c] for c in chosen),
        "seconds": time.perf_counter() - started,
    }


def _chosen(answer: dict[str, Any]) -> list[int]:
    return answer["chosen"] or []  # a failed choice (None) chose nothing


def score(
    items: Sequence[dict[str, Any]], answers: dict[str, dict[str, Any]], order: str, base: str
) -> dict[str, Any]:
    """One order's figures, and per item against the order ``base`` (F1 better / worse)."""
    f1s: list[float] = []
    noto_hit: list[bool] = []
    other_noto: list[bool] = []
    secs: list[float] = []
    failed = better = worse = changed = 0
    for item in items:
        a, b = answers.get(key(item, order)), answers.get(key(item, base))
        if a is None:
            continue
        mine = f1(set(_chosen(a)) or {item["noto"]}, item["gold"])
        f1s.append(mine)
        (noto_hit if item["gold"] == {item["noto"]} else other_noto).append(not _chosen(a))
        secs.append(a["seconds"])
        failed += a["chosen"] is None
        if b is not None:
            theirs = f1(set(_chosen(b)) or {item["noto"]}, item["gold"])
            better += mine > theirs
            worse += mine < theirs
            changed += _chosen(a) != _chosen(b)
    mean = statistics.fmean

    def share(xs: list[bool]) -> float:
        return mean(xs) if xs else float("nan")

    return {
        "order": order,
        "answered": len(f1s),
        "f1": mean(f1s) if f1s else float("nan"),
        "noto_items_answered_noto": share(noto_hit),
        "noto_items": len(noto_hit),
        "other_items_answered_noto": share(other_noto),
        "other_items": len(other_noto),
        "against": base,
        "better": better,
        "worse": worse,
        "changed": changed,
        "failed": failed,
        "seconds_per_query": mean(secs) if secs else float("nan"),
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    base = rows[0]["against"] if rows else ""
    head = (
        "| NOTO shown | answered | option F1 | NOTO items answered NOTO | other items answered "
        f"NOTO | against {base}: items better / worse (choice changed) | failed | s / query |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    body = [
        f"| {r['order']} | {r['answered']} | {r['f1']:.3f} | {r['noto_items_answered_noto']:.2f} "
        f"({r['noto_items']}) | {r['other_items_answered_noto']:.2f} ({r['other_items']}) | "
        f"{r['better']} / {r['worse']} ({r['changed']}) | {r['failed']} | "
        f"{r['seconds_per_query']:.1f} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = [r["order"] for r in rows]
    width = 0.4
    series = [
        ("option F1", "f1"),
        ("NOTO items answered NOTO", "noto_items_answered_noto"),
    ]
    for n, (label, field) in enumerate(series):
        xs = [i + (n - 0.5) * width for i in range(len(rows))]
        ax.bar(xs, [r[field] for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), names)
    ax.set_xlabel("where NOTO is shown")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title("MemoChat memo retrieval by NOTO position", fontsize=9)
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("items", nargs="?", default=str(DEFAULT_ITEMS))
    parser.add_argument(
        "--sample",
        type=int,
        default=20,
        help="items whose answer is not NOTO, half from each source",
    )
    parser.add_argument("--model", default="qwen2.5-1.5b", help="LocalLLM model name")
    parser.add_argument("--orders", default=",".join(ORDERS))
    parser.add_argument("--out", type=Path, default=OUT / "memochat_noto_order")
    parser.add_argument("--resume", action="store_true", help="reuse the answers already kept")
    args = parser.parse_args(argv)
    orders = [o for o in args.orders.split(",") if o]
    for order in orders:
        if order not in ORDERS:
            parser.error(f"unknown order {order!r}; known: {', '.join(ORDERS)}")

    rows = [json.loads(line) for line in Path(args.items).read_text().splitlines() if line.strip()]
    items = sample(retrieval_items(rows), args.sample)
    args.out.mkdir(parents=True, exist_ok=True)
    kept = args.out / "answers.jsonl"
    answers: dict[str, dict[str, Any]] = {}
    if args.resume and kept.exists():
        for line in kept.read_text().splitlines():
            if line.strip():
                a = json.loads(line)
                answers[a["key"]] = a
    elif kept.exists():
        kept.unlink()

    from tqdm import tqdm

    from memories_core.llms import LocalLLM

    llm = LocalLLM(model=args.model)
    todo = [(it, o) for it in items for o in orders if key(it, o) not in answers]
    with kept.open("a", encoding="utf-8") as sink:
        for item, order in tqdm(todo, desc="memo choices", unit="call"):
            a = ask(llm, item, order)
            answers[a["key"]] = a
            sink.write(json.dumps(a) + "\n")
            sink.flush()

    results = [score(items, answers, o, orders[0]) for o in orders]
    text = table(results)
    print(f"model {llm.name}; {len(items)} items")
    print(text)
    out = {
        "model": llm.name,
        "items": len(items),
        "noto_reference_items": sum(it["gold"] == {it["noto"]} for it in items),
        "results": results,
    }
    (args.out / "memochat_noto_order.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.out / "memochat_noto_order.md").write_text(text + "\n")
    plot(results, args.out / "memochat_noto_order.png")


if __name__ == "__main__":
    main()
