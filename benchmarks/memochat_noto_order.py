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
answered NOTO, the share of answers that include the option shown last (position bias),
failed calls and seconds per query. Every answer is appended to a JSON-lines file as it comes
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

from memochat_eval import DEFAULT_ITEMS, f1, retrieval_items

from memories_core.errors import LLMError, ParseError
from memories_core.prompts.memochat import MEMO_RETRIEVAL, RetrievalInput, noto_position
from memories_core.prompts.spec import run_spec

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
    """One memo-retrieval call; the answer mapped back to the item's own option numbers."""
    numbers = [i for i in range(1, len(item["options"]) + 1) if i != item["noto"]]
    real = [item["options"][i - 1] for i in numbers]
    at = place(item, order)
    inputs = RetrievalInput(item["query"], tuple(real), noto_at=at)
    noto = inputs.noto()
    started = time.perf_counter()
    error = None
    picked: list[int] = []
    try:
        picked = list(run_spec(llm, MEMO_RETRIEVAL, inputs))
    except (LLMError, ParseError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    seconds = time.perf_counter() - started
    shown_last = len(real) + 1
    shown = range(1, len(real) + 2)
    chosen = sorted(
        {numbers[(p - 1) if p < noto else (p - 2)] for p in picked if p in shown and p != noto}
    )
    return {
        "key": key(item, order),
        "order": order,
        "noto_at": noto,
        "picked": picked,
        "chosen": chosen,
        "picked_last": shown_last in picked,
        "error": error,
        "seconds": seconds,
    }


def score(items: Sequence[dict[str, Any]], answers: dict[str, dict[str, Any]], order: str) -> dict:
    f1s, noto_hit, other_noto, last, secs, failed = [], [], [], [], [], 0
    for item in items:
        a = answers.get(key(item, order))
        if a is None:
            continue
        pred = set(a["chosen"]) or {item["noto"]}
        f1s.append(f1(pred, item["gold"]))
        (noto_hit if item["gold"] == {item["noto"]} else other_noto).append(not a["chosen"])
        last.append(bool(a["picked_last"]))
        secs.append(a["seconds"])
        failed += a["error"] is not None
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
        "picked_shown_last": share(last),
        "failed": failed,
        "seconds_per_query": mean(secs) if secs else float("nan"),
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| NOTO shown | answered | option F1 | NOTO items answered NOTO | other items answered "
        "NOTO | answers naming the last line | failed | s / query |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    body = [
        f"| {r['order']} | {r['answered']} | {r['f1']:.3f} | {r['noto_items_answered_noto']:.2f} "
        f"({r['noto_items']}) | {r['other_items_answered_noto']:.2f} ({r['other_items']}) | "
        f"{r['picked_shown_last']:.2f} | {r['failed']} | {r['seconds_per_query']:.1f} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = [r["order"] for r in rows]
    width = 0.27
    series = [
        ("option F1", "f1"),
        ("NOTO items answered NOTO", "noto_items_answered_noto"),
        ("answers naming the last line", "picked_shown_last"),
    ]
    for n, (label, field) in enumerate(series):
        xs = [i + (n - 1) * width for i in range(len(rows))]
        ax.bar(xs, [r[field] for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), names)
    ax.set_xlabel("where NOTO is shown")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title("MemoChat memo retrieval by NOTO position", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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

    results = [score(items, answers, o) for o in orders]
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
