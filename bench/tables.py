"""Benchmark: updates per second through tables read as changelogs — a table aggregation and
a table-table join — against a stream-static join that re-reads the same table (a snapshot)
at every micro-batch.  100k keys (``BENCH_KEYS``), then ``BENCH_UPDATES`` random upserts and
deletes, in micro-batches of ``BENCH_BATCH`` offsets.

Each changelog query first loads the table (its state: the first run), then the updates are
produced and the same query runs again on its checkpoint: that second run is the one timed.
The stream-static query reads as many stream records, in batches of the same size, each
batch re-reading the whole table.  Results: bench/results/tables.json.

Run: ``make bench-tables`` (starts the local broker if KAFKA_BOOTSTRAP is not set).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
KEYS = int(os.environ.get("BENCH_KEYS", "100000"))
UPDATES = int(os.environ.get("BENCH_UPDATES", "100000"))
BATCH = int(os.environ.get("BENCH_BATCH", "25000"))
REGIONS = [f"r{i}" for i in range(50)]


def producer(bs: str):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bs, "linger.ms": 20, "batch.size": 1_000_000,
                     "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000,
                     "partitioner": "murmur2_random"})


def make_topic(bs: str, name: str, parts: int = 3) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic(name, parts, 1)])[name].result(30)
    return name


def send(p, topic: str, records) -> int:
    n = 0
    for key, value in records:
        k = json.dumps({"user_id": key}).encode()
        v = None if value is None else json.dumps(value).encode()
        while True:
            try:
                p.produce(topic, v, key=k)
                break
            except BufferError:
                p.poll(0.05)
        n += 1
        if n % 50_000 == 0:
            p.poll(0)
    p.flush(120)
    return n


def user(rng: random.Random, i: int) -> dict:
    return {"user_id": f"u{i}", "region": rng.choice(REGIONS), "score": rng.randint(0, 1000)}


def updates(rng: random.Random, n: int):
    for _ in range(n):
        i = rng.randrange(KEYS)
        yield f"u{i}", (None if rng.random() < 0.05 else user(rng, i))


def source(id_: str, topic: str, schema: list[tuple[str, str]], role: str, version: int,
           key: list[str]) -> dict:
    return {"id": id_, "step": "source", "version": version, "topic": topic,
            "partitions": 3, "format": "json", "role": role, "key_columns": key,
            "schema": [{"name": n, "type": t} for n, t in schema]}


USER = [("user_id", "string"), ("region", "string"), ("score", "bigint")]
PROFILE = [("user_id", "string"), ("tier", "string")]


def plans(topics: dict[str, str], out: dict[str, str]) -> dict[str, dict]:
    def plan(name: str, nodes: list[dict], top: str, key: list[str]) -> dict:
        return {"format": "theseus.plan/1", "query": f"bench_{name}_{uuid.uuid4().hex[:6]}",
                "config": {"state_partitions": 2}, "nodes": nodes + [
                    {"id": "out", "step": "sink", "version": 1, "inputs": [top],
                     "topic": out[name], "format": "json", "key_columns": key,
                     "mode": "update" if name != "stream_static" else "append",
                     "delivery": "exactly_once"}]}

    users = source("users", topics["users"], USER, "table", 2, ["user_id"])
    return {
        "table_aggregate": plan("table_aggregate", [users, {
            "id": "a", "step": "aggregate", "version": 1, "inputs": ["users"],
            "group_by": [{"name": "region", "expr": "region"}],
            "aggregates": [{"name": "n", "function": "count", "args": ["*"]},
                           {"name": "total", "function": "sum", "args": ["score"]},
                           {"name": "hi", "function": "max", "args": ["score"]}]}],
            "a", ["region"]),
        "table_table_join": plan("table_table_join", [
            users, source("profiles", topics["profiles"], PROFILE, "table", 2, ["user_id"]),
            {"id": "j", "step": "join", "version": 1, "inputs": ["users", "profiles"],
             "type": "left", "left_keys": ["user_id"], "right_keys": ["user_id"]}],
            "j", ["user_id"]),
        "stream_static": plan("stream_static", [
            source("events", topics["events"], USER, "stream", 1, []),
            source("users", topics["users"], USER, "table", 1, ["user_id"]),
            {"id": "j", "step": "join", "version": 1, "inputs": ["events", "users"],
             "type": "inner", "left_keys": ["user_id"], "right_keys": ["user_id"]}],
            "j", []),
    }


def run(spark, doc: dict, bs: str, ck: Path) -> float:
    from compat.infer import analyze
    from compat.serde import from_doc
    from migrate.build import Builder, BuildOptions

    plan = from_doc(doc)
    analyze(plan)
    opts = BuildOptions(bootstrap=bs, query=plan.query, available_now=True,
                        checkpoint=str(ck), max_records_per_batch=BATCH)
    t = time.perf_counter()
    q = Builder(spark, plan, opts).start()
    q.awaitTermination()
    elapsed = time.perf_counter() - t
    assert q.exception() is None, q.exception()
    return elapsed


def verify(bs: str, out: dict[str, str], table: dict[str, dict],
           profiles: dict[str, dict]) -> dict[str, bool]:
    """The changelog queries' compacted outputs against plain Python over the final tables
    (the timed runs are only worth their figure if their results are right)."""
    from gates.reconcile import latest_per_key

    def view(topic: str) -> dict[str, dict]:
        return {json.dumps(json.loads(k), sort_keys=True): json.loads(v)
                for k, v in latest_per_key(bs, topic).items() if v is not None}

    groups: dict[str, list[int]] = {}
    for u in table.values():
        groups.setdefault(u["region"], []).append(u["score"])
    agg = {json.dumps({"region": r}): {"region": r, "n": len(s), "total": sum(s),
                                       "hi": max(s)} for r, s in groups.items()}
    join = {json.dumps({"user_id": k}): {**u, "tier": profiles[k]["tier"]}
            for k, u in table.items()}
    return {"table_aggregate": view(out["table_aggregate"]) == agg,
            "table_table_join": view(out["table_table_join"]) == join}


def main() -> int:
    from bench.run_speed import bootstrap
    from migrate.run import spark_session

    bs = bootstrap()
    spark = spark_session("local[2]", 2)
    rng = random.Random(100)
    tag = uuid.uuid4().hex[:8]
    topics = {t: make_topic(bs, f"bench-tbl-{t}-{tag}") for t in ("users", "profiles", "events")}
    out = {n: make_topic(bs, f"bench-tbl-out-{n}-{tag}")
           for n in ("table_aggregate", "table_table_join", "stream_static")}
    p = producer(bs)
    t = time.perf_counter()
    table = {f"u{i}": user(rng, i) for i in range(KEYS)}
    profiles = {f"u{i}": {"user_id": f"u{i}", "tier": rng.choice("abc")} for i in range(KEYS)}
    send(p, topics["users"], table.items())
    send(p, topics["profiles"], profiles.items())
    print(f"loaded {KEYS} keys in {time.perf_counter() - t:.1f}s", flush=True)
    docs = plans(topics, out)
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-tables-"))
    result: dict = {"keys": KEYS, "updates": UPDATES, "batch_offsets": BATCH,
                    "spark": spark.version, "runs": {}}
    for name in ("table_aggregate", "table_table_join"):
        load = run(spark, docs[name], bs, tmp / name)
        result["runs"][name] = {"initial_load_seconds": round(load, 2),
                                "initial_load_keys_per_s": round(KEYS / load)}
        print(name, "loaded", result["runs"][name], flush=True)
    # the updates: upserts and deletes of the users table (both changelog queries read
    # them), and as many stream records for the stream-static join
    t = time.perf_counter()
    batch = list(updates(rng, UPDATES))
    send(p, topics["users"], batch)
    for k, v in batch:
        if v is None:
            table.pop(k, None)
        else:
            table[k] = v
    send(p, topics["events"], ((k, v or {"user_id": k}) for k, v in batch))
    print(f"produced {UPDATES} updates in {time.perf_counter() - t:.1f}s", flush=True)
    for name in ("table_aggregate", "table_table_join", "stream_static"):
        secs = run(spark, docs[name], bs, tmp / name)
        result["runs"].setdefault(name, {}).update(
            seconds=round(secs, 2), updates_per_s=round(UPDATES / secs))
        print(name, result["runs"][name], flush=True)
    base = result["runs"]["stream_static"]["updates_per_s"]
    for name in ("table_aggregate", "table_table_join"):
        result["runs"][name]["over_stream_static"] = round(
            result["runs"][name]["updates_per_s"] / base, 2)
    result["results_equal"] = verify(bs, out, table, profiles)
    print("outputs equal the oracle:", result["results_equal"], flush=True)
    result["note"] = ("updates_per_s: input changes per second of the timed run; the "
                      "stream-static join re-reads the whole table (KEYS rows) at each of its "
                      f"{-(-UPDATES // BATCH)} micro-batches, the changelog queries touch "
                      "only the changed keys' state")
    path = ROOT / "bench" / "results" / "tables.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
