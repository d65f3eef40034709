"""Benchmark: tables read as changelogs — a table aggregation and a table-table (left) join —
on the old step versions' operators (source 2, aggregate 1, join 1:
``transformWithStateInPandas``), the new ones' (source 3, aggregate 2, join 2: PySpark's
row-based ``transformWithState``), the bucketed normalisation's (source 4: its state per
bucket of table keys, ``BENCH_BUCKETS`` of them, else the plan format's default) and, for the
join, the bucketed join's too (``table_table_join.join_buckets``: sources 4 and join 3, its
state per bucket of join keys, as many), against
issue 31's baseline: **Spark's own update-mode
aggregation over the same change records read as a plain stream** (a stream source on the
same topic, ``groupBy(region).agg(...)``, an update-mode sink), through the same gated
source and exactly-once sink, in the same run.

``BENCH_KEYS`` keys are loaded (every query's first run on its checkpoint: the initial
load), then ``BENCH_UPDATES`` random upserts and deletes of the same table are produced and
every query runs again on its checkpoint (the updates), in micro-batches of ``BENCH_BATCH``
offsets.  Ratios are rows per second over the baseline's in the same phase: the baseline
reads the same records (it skips a tombstone, as a stream does).  Every changelog query's
output is checked against plain Python over the final tables.

Each invocation appends its figures and the load average at its start to
``bench/results/tables.json`` (``BENCH_OUT`` elsewhere); ``BENCH_RESET=1`` starts the list
afresh.  ``BENCH_QUERIES`` (a comma list of ``NAMES``, e.g.
``table_aggregate.rows,table_table_join.rows``) runs only those changelog queries, with the
baseline always (the ratios are over it), so that a run of many keys fits its time.  Every
query first runs once, untimed, on a small table (``BENCH_WARMUP=0``: not; the runs before
this knob had no warm-up, so their baseline's load held the session's first-query
costs).  Run:
``make bench-tables`` (starts the local broker if KAFKA_BOOTSTRAP is not set).
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
#: run every query once on a small table first, untimed (``warm_up``); 0: not
WARMUP = os.environ.get("BENCH_WARMUP", "1") != "0"
REGIONS = [f"r{i}" for i in range(50)]
#: the targets of issue 31 (ratios to the baseline; keys per second of the initial load)
TARGETS = {"table_aggregate": 0.5, "table_table_join": 0.3, "initial_load_keys_per_s": 20000}
#: the step versions of the changelog operators: old (pandas), rows (row-based),
#: buckets (row-based, the normalisation's state per bucket of keys) and join_buckets (the
#: join's state per bucket of join keys too; the join query's alone)
VERSIONS = {"old": {"source": 2, "aggregate": 1, "join": 1},
            "rows": {"source": 3, "aggregate": 2, "join": 2},
            "buckets": {"source": 4, "aggregate": 2, "join": 2},
            "join_buckets": {"source": 4, "aggregate": 2, "join": 3}}
#: the versions each changelog query runs on
QUERY_VERSIONS = {"table_aggregate": ("old", "rows", "buckets"),
                  "table_table_join": ("old", "rows", "buckets", "join_buckets")}
#: the bucketed sources' and join's ``state_buckets`` (none: the plan format's default)
BUCKETS = int(os.environ["BENCH_BUCKETS"]) if os.environ.get("BENCH_BUCKETS") else None
BASELINE = "baseline_stream_aggregate"
#: every query of a run: the baseline, then each changelog query per versions
NAMES = [BASELINE] + [f"{q}.{v}" for q, vs in QUERY_VERSIONS.items() for v in vs]


def selected(text: str | None) -> list[str]:
    """The queries of a run: ``NAMES`` in their order, or the baseline and those of the comma
    list ``text``; a name not in ``NAMES`` is refused (a typo would silently measure less)."""
    if not text:
        return list(NAMES)
    asked = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(asked - set(NAMES))
    if unknown:
        raise SystemExit(f"BENCH_QUERIES: unknown {', '.join(unknown)}; expected a comma list "
                         f"of {', '.join(NAMES)}")
    return [n for n in NAMES if n == BASELINE or n in asked]


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
    from bench.feed import put

    n = 0
    for key, value in records:
        k = json.dumps({"user_id": key}).encode()
        v = None if value is None else json.dumps(value).encode()
        put(p, topic, v, key=k)
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
    doc = {"id": id_, "step": "source", "version": version, "topic": topic,
           "partitions": 3, "format": "json", "role": role, "key_columns": key,
           "schema": [{"name": n, "type": t} for n, t in schema]}
    if version >= 4 and BUCKETS is not None:
        doc["state_buckets"] = BUCKETS
    return doc


USER = [("user_id", "string"), ("region", "string"), ("score", "bigint")]
PROFILE = [("user_id", "string"), ("tier", "string")]


def plans(topics: dict[str, str], out: dict[str, str]) -> dict[str, dict]:
    """The queries of ``NAMES`` that ``out`` gives an output topic: the baseline, each
    changelog query on the old and on the new versions."""
    def plan(name: str, nodes: list[dict], top: str, key: list[str]) -> dict:
        return {"format": "theseus.plan/1", "query": f"bench_{name}_{uuid.uuid4().hex[:6]}",
                "config": {"state_partitions": 2}, "nodes": nodes + [
                    {"id": "out", "step": "sink", "version": 1, "inputs": [top],
                     "topic": out.get(name, "-"), "format": "json", "key_columns": key,
                     "mode": "update", "delivery": "exactly_once"}]}

    aggs = [{"name": "n", "function": "count", "args": ["*"]},
            {"name": "total", "function": "sum", "args": ["score"]},
            {"name": "hi", "function": "max", "args": ["score"]}]
    docs = {BASELINE: plan(BASELINE, [
        source("users", topics["users"], USER, "stream", 1, []),
        {"id": "a", "step": "aggregate", "version": 1, "inputs": ["users"],
         "group_by": [{"name": "region", "expr": "region"}], "aggregates": aggs}],
        "a", ["region"])}
    for tag, v in VERSIONS.items():
        users = source("users", topics["users"], USER, "table", v["source"], ["user_id"])
        if tag in QUERY_VERSIONS["table_aggregate"]:
            docs[f"table_aggregate.{tag}"] = plan(f"table_aggregate.{tag}", [users, {
                "id": "a", "step": "aggregate", "version": v["aggregate"],
                "inputs": ["users"], "group_by": [{"name": "region", "expr": "region"}],
                "aggregates": aggs}], "a", ["region"])
        join = {"id": "j", "step": "join", "version": v["join"], "inputs": ["users", "profiles"],
                "type": "left", "left_keys": ["user_id"], "right_keys": ["user_id"]}
        if v["join"] >= 3 and BUCKETS is not None:
            join["state_buckets"] = BUCKETS
        docs[f"table_table_join.{tag}"] = plan(f"table_table_join.{tag}", [
            users, source("profiles", topics["profiles"], PROFILE, "table", v["source"],
                          ["user_id"]), join], "j", ["user_id"])
    for d in docs.values():
        d["query"] = d["query"].replace(".", "_")
    return {n: d for n, d in docs.items() if n in out}


def run(spark, doc: dict, bs: str, ck: Path) -> float:
    """``doc`` run with available-now on its checkpoint ``ck``; the seconds it took, its
    start and stop included."""
    return run_phases(spark, doc, bs, ck)[0]


def run_phases(spark, doc: dict, bs: str, ck: Path) -> tuple[float, dict]:
    """:func:`run`'s seconds and where they went, from the query's own progress (Spark's
    ``durationMs``): ``batches`` the micro-batches' ``triggerExecution`` summed, ``count``
    of them, ``first_planning`` the first batch's ``queryPlanning``, ``start_stop`` the rest
    of the run (the query's start before its first batch, its stop after the last).  What a
    (re)start pays once is ``start_stop`` plus ``first_planning``: PySpark starts a fresh
    Python process in the driver for each Python data source (at the start) and for each
    Python stateful operator (to read its state schema, in the first batch's planning);
    ``steady`` is the batches without that planning, the rate a query that runs on
    sustains."""
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
    return elapsed, phases(q.recentProgress, elapsed)


def phases(progress: list[dict], elapsed: float) -> dict:
    """:func:`run_phases`' figures from a query's progress list and its run's seconds; a
    batch that read nothing (available-now's last, empty trigger) is not one."""
    batches = [p for p in progress if p.get("numInputRows")]
    total = sum(p["durationMs"].get("triggerExecution", 0) for p in batches) / 1000
    first = batches[0]["durationMs"].get("queryPlanning", 0) / 1000 if batches else 0.0
    return {"count": len(batches), "batches": round(total, 2),
            "first_planning": round(first, 2), "start_stop": round(elapsed - total, 2),
            "steady": round(total - first, 2)}


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
    return {name: view(topic) == (agg if name.startswith("table_aggregate") else join)
            for name, topic in out.items() if name.startswith("table_")}


def warm_up(spark, bs: str, names: list[str], keys: int = 2_000) -> float:
    """Each of ``names`` once, untimed, over a small table of its own topics: the session's
    first query pays class loading, code generation and the first Python workers, which
    would otherwise count in the first timed query's load (the baseline's, before
    ``BENCH_WARMUP``).  Returns the seconds it took."""
    t = time.perf_counter()
    rng = random.Random(1)
    tag = uuid.uuid4().hex[:8]
    topics = {t: make_topic(bs, f"bench-tbl-warm-{t}-{tag}") for t in ("users", "profiles")}
    p = producer(bs)
    send(p, topics["users"], ((f"u{i}", user(rng, i)) for i in range(keys)))
    send(p, topics["profiles"], ((f"u{i}", {"user_id": f"u{i}", "tier": "a"})
                                 for i in range(keys)))
    out = {n: make_topic(bs, f"bench-tbl-warm-out-{n}-{tag}") for n in names}
    ck = Path(tempfile.mkdtemp(prefix="theseus-bench-tables-warm-"))
    for name, doc in plans(topics, out).items():
        run(spark, doc, bs, ck / name)
    return round(time.perf_counter() - t, 2)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def main() -> int:
    from bench.run_speed import bootstrap
    from migrate.run import spark_session

    names = selected(os.environ.get("BENCH_QUERIES"))
    bs = bootstrap()
    started = {"load_average_1m": load_average(), "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    spark = spark_session("local[2]", 2)
    rng = random.Random(100)
    tag = uuid.uuid4().hex[:8]
    topics = {t: make_topic(bs, f"bench-tbl-{t}-{tag}") for t in ("users", "profiles")}
    out = {n: make_topic(bs, f"bench-tbl-out-{n}-{tag}") for n in names}
    p = producer(bs)
    table = {f"u{i}": user(rng, i) for i in range(KEYS)}
    profiles = {f"u{i}": {"user_id": f"u{i}", "tier": rng.choice("abc")} for i in range(KEYS)}
    send(p, topics["users"], table.items())
    send(p, topics["profiles"], profiles.items())
    docs = plans(topics, out)
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-tables-"))
    result: dict = {**started, "keys": KEYS, "updates": UPDATES, "batch_offsets": BATCH,
                    "spark": spark.version, "versions": VERSIONS, "queries": {}}
    if any(n.endswith("buckets") for n in names):  # .buckets, .join_buckets
        from compat.steps.source import DEFAULT_BUCKETS

        result["state_buckets"] = BUCKETS or DEFAULT_BUCKETS
    if WARMUP:
        result["warm_up_seconds"] = warm_up(spark, bs, names)
    runs = result["queries"]
    for name in names:
        started_at = load_average()
        secs, split = run_phases(spark, docs[name], bs, tmp / name)
        runs[name] = {"load_average_1m_at_load": started_at,
                      "initial_load_seconds": round(secs, 2),
                      "initial_load_keys_per_s": round(KEYS / secs),
                      "initial_load_phases": split,
                      "initial_load_keys_per_s_steady": round(KEYS / split["steady"])}
        print(name, "loaded", runs[name], flush=True)
    batch = list(updates(rng, UPDATES))
    send(p, topics["users"], batch)
    for k, v in batch:
        if v is None:
            table.pop(k, None)
        else:
            table[k] = v
    for name in names:
        started_at = load_average()
        secs, split = run_phases(spark, docs[name], bs, tmp / name)
        runs[name].update(load_average_1m_at_updates=started_at, seconds=round(secs, 2),
                          updates_per_s=round(UPDATES / secs), update_phases=split,
                          updates_per_s_steady=round(UPDATES / split["steady"]))
        print(name, runs[name], flush=True)
    base = runs[BASELINE]
    for name in names[1:]:
        r = runs[name]
        r["updates_over_baseline"] = round(r["updates_per_s"] / base["updates_per_s"], 3)
        r["load_over_baseline"] = round(r["initial_load_keys_per_s"]
                                        / base["initial_load_keys_per_s"], 3)
        # the same ratio without what each query's (re)start pays once (``run_phases``)
        r["updates_over_baseline_steady"] = round(r["updates_per_s_steady"]
                                                  / base["updates_per_s_steady"], 3)
        kind = name.split(".")[0]
        r["target_met"] = {"updates": r["updates_over_baseline"] >= TARGETS[kind],
                           "initial_load": r["initial_load_keys_per_s"]
                           >= TARGETS["initial_load_keys_per_s"],
                           "updates_steady": r["updates_over_baseline_steady"]
                           >= TARGETS[kind],
                           "initial_load_steady": r["initial_load_keys_per_s_steady"]
                           >= TARGETS["initial_load_keys_per_s"]}
    result["results_equal"] = verify(bs, {n: out[n] for n in names[1:]}, table, profiles)
    print("outputs equal the oracle:", result["results_equal"], flush=True)
    path = Path(os.environ.get("BENCH_OUT", ROOT / "bench" / "results" / "tables.json"))
    kept = []
    if path.exists() and not os.environ.get("BENCH_RESET"):
        old = json.loads(path.read_text())
        kept = old.get("runs", []) if "targets" in old else []
    doc = {"targets": TARGETS,
           "note": ("updates_per_s / initial_load_keys_per_s: input changes per second of a "
                    "query's run; *_over_baseline: over Spark's own update-mode aggregation of "
                    "the same records read as a stream, in the same run; *_steady and "
                    "*_phases: the same without what a (re)start pays once (the query's start "
                    "and stop, the first batch's planning: bench/tables.py run_phases); "
                    "load_average_1m: os.getloadavg() at the start of the run and of each "
                    "query's run (a shared 2-core machine)"),
           "runs": kept + [result]}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
