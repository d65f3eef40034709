"""Experiment (issue 31): the normalisation of a table with its state kept per *bucket* of
keys instead of per key, against source version 3's operator, on the same query, data and
session.

Source version 3 keys PySpark's ``transformWithState`` by the table key: every key of a
load costs three synchronous round trips to the task's state server (``set_implicit_key``,
the value's ``get``, its ``update``; ``bench/results/tables.md``), and PySpark 4.3 has no
call that reads or writes the state of many keys at once.  Keyed instead by
``pmod(xxhash64(key), BENCH_BUCKETS)``, one call of the processor gets every change of the
bucket's keys in the micro-batch and the three round trips are per bucket and batch: the
bucket's value is a JSON object of its keys' current rows, read once, changed in Python and
written once.  The price is that a batch rewrites every bucket it touches in full (RocksDB
writes its whole value), so the bucket count has to grow with the table, and it is part of
the state's layout (a new step version's: this is the prototype, patched over
``migrate.build.changelog.normalise`` for the run; the plan format has it since as source
version 4, ``state_buckets``, which ``make bench-tables`` measures as the ``.buckets``
queries).

Each query runs its initial load (``BENCH_KEYS`` keys) on a fresh checkpoint, then
``BENCH_UPDATES`` random upserts and deletes, in micro-batches of ``BENCH_BATCH`` offsets,
``local[2]``, 2 state partitions, after one untimed run of each on a small table; the stock
and the bucketed operator one after the other,
``BENCH_REPEATS`` times; ``BENCH_UPDATE_BATCH`` sets the updates' batch size apart;
every output is checked against plain Python over the final table.
``BENCH_QUERIES``: ``table_aggregate.rows`` (default) and/or ``table_table_join.rows`` (its
join operator stays per key).  Figures appended to ``bench/results/table_buckets.json``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
KEYS = int(os.environ.get("BENCH_KEYS", "100000"))
UPDATES = int(os.environ.get("BENCH_UPDATES", "30000"))
BUCKETS = int(os.environ.get("BENCH_BUCKETS", "64"))
REPEATS = int(os.environ.get("BENCH_REPEATS", "1"))
QUERIES = os.environ.get("BENCH_QUERIES", "table_aggregate.rows").split(",")
#: the updates' offsets per micro-batch (default BENCH_BATCH): small batches show what a
#: bucket costs when few of its keys change (the whole bucket is read and written)
UPDATE_BATCH = int(os.environ.get("BENCH_UPDATE_BATCH", "0"))
TABLE_KEY = "_theseus_tk"


def normalise_bucket(key: tuple, changes: Iterable[tuple], state: Any) -> list[tuple[str, int]]:
    """The experiment's processor is source version 4's now: one bucket's changes as
    (table key, offset, deleted, row), its state one JSON object of the bucket's rows."""
    from migrate.build.changelog import _normalise_bucket

    return _normalise_bucket(key, changes, state)


def normalise_buckets(b: Any, df: Any, key_columns: tuple[str, ...], names: tuple[str, ...],
                      columns: tuple[tuple[str, str], ...], state_name: str,
                      rows: bool = False) -> Any:
    """``migrate.build.changelog.normalise``'s signature, the operator keyed by bucket."""
    from gates.source import DELETED_COLUMN, OFFSET_COLUMN
    from migrate.build import changelog as C

    F = b.F
    tk = C._pack(b, list(key_columns))
    packed = df.select(F.pmod(F.xxhash64(tk), F.lit(BUCKETS)).cast("string").alias(C.KEY),
                       tk.alias(TABLE_KEY), C._pack(b, names).alias(C.ROW),
                       F.col(OFFSET_COLUMN), F.col(DELETED_COLUMN))
    out = C._stateful(packed, normalise_bucket,
                      (TABLE_KEY, OFFSET_COLUMN, DELETED_COLUMN, C.ROW),
                      "rows string", state_name, True)
    return C.unpack(b, out, columns, names)


@contextmanager
def bucketed(on: bool):
    from migrate.build import changelog

    stock = changelog.normalise
    if on:
        changelog.normalise = normalise_buckets
    try:
        yield
    finally:
        changelog.normalise = stock


def main() -> int:
    import tables

    from bench.run_speed import bootstrap
    from migrate.run import spark_session

    assert not set(QUERIES) - set(tables.NAMES), QUERIES
    bs = bootstrap()
    started = {"load_average_1m": tables.load_average(),
               "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    spark = spark_session("local[2]", 2)
    rng = random.Random(7)
    tag = uuid.uuid4().hex[:8]
    topics = {t: tables.make_topic(bs, f"bench-bkt-{t}-{tag}") for t in ("users", "profiles")}
    table = {f"u{i}": tables.user(rng, i) for i in range(KEYS)}
    profiles = {f"u{i}": {"user_id": f"u{i}", "tier": rng.choice("abc")} for i in range(KEYS)}
    p = tables.producer(bs)
    tables.send(p, topics["users"], table.items())
    tables.send(p, topics["profiles"], profiles.items())
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-buckets-"))
    for on in (False, True):  # untimed: neither mode pays the session's first query
        with bucketed(on):
            tables.warm_up(spark, bs, QUERIES)
    runs = [(q, mode, rep) for rep in range(REPEATS) for q in QUERIES
            for mode in ("per_key", "buckets")]
    docs, out = {}, {}
    result: dict = {**started, "keys": KEYS, "updates": UPDATES, "buckets": BUCKETS,
                    "batch_offsets": tables.BATCH,
                    "update_batch_offsets": UPDATE_BATCH or tables.BATCH,
                    "spark": spark.version, "runs": []}
    for q, mode, rep in runs:
        topic = tables.make_topic(bs, f"bench-bkt-out-{uuid.uuid4().hex[:8]}")
        out[(q, mode, rep)] = topic
        docs[(q, mode, rep)] = tables.plans(topics, {q: topic})[q]
    for q, mode, rep in runs:
        at = tables.load_average()
        with bucketed(mode == "buckets"):
            secs = tables.run(spark, docs[(q, mode, rep)], bs, tmp / f"{q}-{mode}-{rep}")
        row = {"query": q, "mode": mode, "repeat": rep, "load_average_1m_at_load": at,
               "initial_load_seconds": round(secs, 2),
               "initial_load_keys_per_s": round(KEYS / secs)}
        result["runs"].append(row)
        print(json.dumps(row), flush=True)
    batch = list(tables.updates(rng, UPDATES)) if UPDATES else []
    if batch:
        tables.BATCH = UPDATE_BATCH or tables.BATCH
        tables.send(p, topics["users"], batch)
        for k, v in batch:
            if v is None:
                table.pop(k, None)
            else:
                table[k] = v
        for (q, mode, rep), row in zip(runs, result["runs"]):
            at = tables.load_average()
            with bucketed(mode == "buckets"):
                secs = tables.run(spark, docs[(q, mode, rep)], bs, tmp / f"{q}-{mode}-{rep}")
            row.update(load_average_1m_at_updates=at, updates_seconds=round(secs, 2),
                       updates_per_s=round(UPDATES / secs))
            print(json.dumps(row), flush=True)
    for (q, mode, rep), row in zip(runs, result["runs"]):
        row["output_equal"] = tables.verify(bs, {q: out[(q, mode, rep)]}, table, profiles)[q]
    print("outputs equal the oracle:", [r["output_equal"] for r in result["runs"]], flush=True)
    path = ROOT / "bench" / "results" / "table_buckets.json"
    kept = json.loads(path.read_text())["runs"] if path.exists() else []
    path.write_text(json.dumps({"note": __doc__.split("\n\n")[0], "runs": kept + [result]},
                               indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
