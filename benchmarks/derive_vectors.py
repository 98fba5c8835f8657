"""Upgrading a store's token vectors to 128 dimensions by deriving them, not encoding them.

A store written before the 128-dimension default keeps the bundled model's unprojected
384-dimension rows. ``rebuild_token_vectors`` with today's default encoder derives each
record's 128-dimension row from its stored row (unit rows, projected onto the shipped
basis, unit again, int8 again) where the text still matches, so no model pass runs.

This script copies a kept store (``late_persist.py --keep-store DIR`` with the 384-dimension
encoder; the copy is worked on, the original is left alone), then:

* times ``rebuild_token_vectors`` on the copy (records per second, the file's size before
  and after), and, for a sample of records (``--sample``), times encoding them afresh with
  the model: what the same upgrade costs without derivation;
* compares each sampled record's derived row with the row a fresh encoding stores: the
  cosine of matching token vectors, and MaxSim against ``--queries`` generated queries
  (mean and largest absolute difference, and how many queries' top 10 of the sample is
  the same set).

    python benchmarks/derive_vectors.py --store /data/late10k --name derive_vectors_10k
    python benchmarks/derive_vectors.py --store /data/late100k --work /data/late100k_d128 \\
        --name derive_vectors_100k
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import (
    add_output_options,
    command_line,
    make_queries,
    real_embedder,
    run_or_redraw,
)
from machine_info import folder_bytes, machine, repo_state, save_figure

TARGET = "target-user"


def compare(
    encoder: Any, derived: dict[str, Any], texts: dict[str, str], queries: list[str]
) -> dict[str, Any]:
    """Derived rows against fresh encodings of the same texts (see the module docstring)."""
    from memories_core.retrieval.late_interaction import maxsim
    from memories_core.token_vectors import quantize

    ids = sorted(derived)
    start = time.perf_counter()
    fresh = {i: quantize(i, "0" * 32, "1" * 32, encoder.encode_document(texts[i])) for i in ids}
    encode_s = time.perf_counter() - start
    cosines = []
    for i in ids:
        a, b = derived[i].floats(), fresh[i].floats()
        if a.shape != b.shape:
            raise SystemExit(f"record {i}: derived {a.shape} but encoded {b.shape}")
        cosines.extend(
            np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        )
    differences: list[float] = []
    same_top = 0
    for query in queries:
        vectors = np.asarray(encoder.encode_query(query), dtype=np.float32)
        old = np.array([maxsim(vectors, derived[i].floats()) for i in ids])
        new = np.array([maxsim(vectors, fresh[i].floats()) for i in ids])
        differences.extend(np.abs(old - new).tolist())
        same_top += set(np.argsort(-old)[:10]) == set(np.argsort(-new)[:10])
    return {
        "records": len(ids),
        "tokens": len(cosines),
        "encode_s": round(encode_s, 2),
        "encode_records_per_s": round(len(ids) / encode_s, 1),
        "token_cosine_mean": round(float(np.mean(cosines)), 5),
        "token_cosine_min": round(float(np.min(cosines)), 4),
        "maxsim_abs_diff_mean": round(statistics.fmean(differences), 5),
        "maxsim_abs_diff_max": round(max(differences), 4),
        "queries": len(queries),
        "queries_same_top10": same_top,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Copy the store, derive its vectors, compare a sample with fresh encodings."""
    from memories_core import HistoryMemory
    from memories_core.retrieval.late_interaction import (
        late_interaction_pipeline,
        late_interaction_reranker,
    )
    from memories_core.retrieval.late_vectors import engine_backend, rebuild_token_vectors
    from memories_core.token_vectors import TokenVectorStore, text_digest

    source = Path(args.store) / "late"
    if not (source / "records.sqlite3").is_file():
        raise SystemExit(f"{source} holds no store: build one with late_persist.py --keep-store")
    work = (
        Path(args.work)
        if args.work
        else Path(args.store).with_name(Path(args.store).name + "_derived")
    )
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(source, work / "late")
    bytes_before = folder_bytes(work / "late")
    reranker = late_interaction_reranker()
    memory = HistoryMemory(
        path=work / "late",
        embedder=real_embedder(1),
        pipeline=late_interaction_pipeline(reranker=reranker),
    )
    store = memory.engine.store
    assert isinstance(store, TokenVectorStore)
    records = memory.engine.records(TARGET)
    old_rows = {row.encoder for row in store.token_vector_rows(TARGET)}
    start = time.perf_counter()
    made = rebuild_token_vectors(memory, users=[TARGET], progress=True)
    rebuild_s = time.perf_counter() - start
    rows = {row.record_id: row for row in store.token_vector_rows(TARGET)}
    encoders = {row.encoder for row in rows.values()}
    sample = random.Random(args.seed).sample(sorted(rows), min(args.sample, len(rows)))
    by_id = {r.id: r for r in records}
    chosen = [by_id[i] for i in sample]
    texts = reranker.pair_texts(engine_backend(memory.engine), TARGET, chosen)
    pairs = dict(zip(sample, texts, strict=True))
    name = reranker.encoder.name
    if any(rows[i].digest != text_digest(name, pairs[i]) for i in sample):
        raise SystemExit("a derived row is not of its record's text: nothing to compare")
    quality = compare(
        reranker.encoder,
        {i: rows[i] for i in sample},
        pairs,
        make_queries(args.queries, args.seed),
    )
    memory.close()
    return {
        "command": command_line(),
        "machine": machine(),
        "code": repo_state(),
        "records": len(records),
        "encoders_before": len(old_rows),
        "encoder_after": sorted(encoders),
        "rows_after": len(rows),
        "rebuild": {
            "rows_made": made,
            "seconds": round(rebuild_s, 1),
            "records_per_s": round(len(records) / rebuild_s, 1),
            "bytes_before": bytes_before,
            "bytes_after": folder_bytes(work / "late"),
            "dims_after": sorted({row.dim for row in rows.values()}),
        },
        "sample": quality,
        "load_average": os.getloadavg(),
    }


def report(result: dict[str, Any]) -> str:
    """The run as a markdown table."""
    rebuild, sample = result["rebuild"], result["sample"]
    encode_rate = sample["encode_records_per_s"]
    return (
        "\n".join(
            [
                result["command"],
                "",
                "| records | rebuild s | records/s derived | records/s encoded (sample) "
                "| store MB before / after | token cosine mean (min) | MaxSim abs diff mean (max) "
                "| queries with the same top 10 |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
                f"| {result['records']} | {rebuild['seconds']} | {rebuild['records_per_s']} | "
                f"{encode_rate} | {rebuild['bytes_before'] / 1e6:.0f} / "
                f"{rebuild['bytes_after'] / 1e6:.0f} | {sample['token_cosine_mean']} "
                f"({sample['token_cosine_min']}) | {sample['maxsim_abs_diff_mean']} "
                f"({sample['maxsim_abs_diff_max']}) | {sample['queries_same_top10']} of "
                f"{sample['queries']} |",
                "",
                f"{rebuild['rows_made']} rows made, widths after: {rebuild['dims_after']}; the "
                f"sample is {sample['records']} records ({sample['tokens']} token vectors).",
            ]
        )
        + "\n"
    )


def plot(result: dict[str, Any], path: Path) -> None:
    """Records per second: derived (the whole store) against encoded (the sample)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - the figure is optional
        return
    rates = [result["rebuild"]["records_per_s"], result["sample"]["encode_records_per_s"]]
    fig, ax = plt.subplots(figsize=(6, 2.4))
    ax.barh(["derived from 384-d rows", "encoded with the model"], rates, color="#4477aa")
    ax.set_xscale("log")
    ax.set_xlim(1, 2 * max(rates))  # bars from 1 record/s: the log scale's lengths compare
    ax.set_xlabel("records per second (log scale)")
    ax.set_title(f"upgrading {result['records']} records to 128 dimensions")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="a late_persist.py --keep-store folder")
    parser.add_argument("--work", help="where the copy goes (default: <store>_derived)")
    parser.add_argument("--sample", type=int, default=300, help="records compared")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--seed", type=int, default=5)
    add_output_options(parser, "derive_vectors")
    run_or_redraw(parser.parse_args(argv), run, report, plot)


if __name__ == "__main__":
    main()
