"""Benchmark: streaming recursion (the descendants plan, fixtures/qtt/recursive_descendants)
against Spark SQL's batch ``WITH RECURSIVE`` over the same edges, in the same Spark session.

A random forest of ``BENCH_NODES`` nodes (default 100000), depth at most ``BENCH_DEPTH``
(20); its child -> parent edges in random order in one topic.  The streaming plan runs with
available-now and ``BENCH_BATCH`` edges per micro-batch (default a tenth of the edges): rows/s
through the recursive step (edges in / loop time), the time to settle after the last edge
(the last loop batch, which holds it, plus the output query), and the whole run.  The batch
query computes the same closure and counts (its recursion level and row limits raised); both
results are compared with each other (an oracle, not just a timing).  Also the two costs the
mechanism was chosen by: one loop iteration inside a micro-batch against one micro-batch of a
plain query through the gated source and sink (what a feedback topic pays per loop level).

Results: bench/results/recursion.json.  Run: ``make bench-recursion``.
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run_speed import bootstrap, make_topic  # noqa: E402

NODES = int(os.environ.get("BENCH_NODES", "100000"))
DEPTH = int(os.environ.get("BENCH_DEPTH", "20"))
BATCH = int(os.environ.get("BENCH_BATCH", "0")) or max(1000, NODES // 10)
PLAN = ROOT / "fixtures" / "qtt" / "recursive_descendants" / "plan.json"


def forest(n: int, depth: int, rng: random.Random) -> list[tuple[str, str]]:
    """(child, parent) edges of random trees, no node deeper than ``depth``."""
    level = [0] * n
    open_: list[int] = []  # nodes that may still take children
    edges = []
    for i in range(n):
        if open_ and rng.random() < 0.97:
            p = open_[rng.randrange(len(open_))]
            level[i] = level[p] + 1
            edges.append((f"n{i}", f"n{p}"))
        if level[i] < depth:
            open_.append(i)
    rng.shuffle(edges)
    return edges


def produce(bs: str, topic: str, edges: list[tuple[str, str]]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bs, "linger.ms": 20, "batch.size": 1_000_000,
                  "queue.buffering.max.messages": 1_000_000})
    for i, (c, par) in enumerate(edges):
        v = json.dumps({"child": c, "parent": par}).encode()
        while True:
            try:
                p.produce(topic, v, partition=i % 2)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def read_table(bs: str, topic: str) -> dict[str, int]:
    """The last value per node (read-committed, to the end of every partition: the last
    offset of a transactional topic is a commit marker, never a record, so the end is told
    by the consumer's end-of-partition event)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": "bench-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    parts = list(c.list_topics(topic, timeout=30).topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out: dict[str, int] = {}
    todo = set(parts)
    deadline = time.monotonic() + 300
    while todo and time.monotonic() < deadline:
        for m in c.consume(10000, timeout=1.0):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(m.partition())
                continue
            if m.value() is not None:
                v = json.loads(m.value())
                out[v["node"]] = v["descendants"]
    c.close()
    return out


def main() -> None:
    from compat.infer import analyze
    from compat.serde import from_doc
    from migrate.build import Builder, BuildOptions
    from migrate.run import spark_session

    bs = bootstrap()
    rng = random.Random(2026)
    edges = forest(NODES, DEPTH, rng)
    tag = uuid.uuid4().hex[:8]
    src, out = make_topic(bs, f"bench-edges-{tag}", 2), make_topic(bs, f"bench-desc-{tag}", 2)
    produce(bs, src, edges)
    spark = spark_session("local[2]", 2)
    spark.conf.set("spark.sql.cteRecursionLevelLimit", "-1")
    spark.conf.set("spark.sql.cteRecursionRowLimit", "-1")

    # 1. Streaming: the descendants plan with available-now.
    doc = json.loads(PLAN.read_text())
    for n in doc["nodes"]:
        if n["step"] == "source":
            n["topic"] = src
        if n["step"] == "sink":
            n["topic"] = out
    plan = from_doc(doc)
    analyze(plan)
    ck = tempfile.mkdtemp(prefix="bench-rec-")
    opts = BuildOptions(bootstrap=bs, query=f"bench-rec-{tag}", available_now=True,
                        checkpoint=ck, max_records_per_batch=BATCH)
    t0 = time.monotonic()
    chain = Builder(spark, plan, opts).start()
    notes: list[str] = []
    loop_done = None
    while chain.isActive:
        notes += chain.notes()
        if loop_done is None and len(chain.queries) > 1:
            loop_done = time.monotonic()
        time.sleep(0.1)
    notes += chain.notes()
    assert chain.exception() is None, chain.exception()
    total = time.monotonic() - t0
    loop_done = loop_done or total + t0
    batches = [(int(m.group(1)), int(m.group(2)), int(m.group(3)))
               for m in (re.search(r"(\d+) new rows in (\d+) iteration\(s\), (\d+) ms", n)
                         for n in notes) if m]
    last_ms = batches[-1][2] / 1000 if batches else 0.0
    output_s = t0 + total - loop_done
    streamed = read_table(bs, out)
    closure_rows = sum(b[0] for b in batches)
    iteration_ms = [b[2] / b[1] for b in batches if b[1]]

    # 2. Batch: Spark SQL WITH RECURSIVE over all edges, same session.
    spark.createDataFrame(edges, "child string, parent string").createOrReplaceTempView(
        "bench_edges")
    t1 = time.monotonic()
    rows = spark.sql("""
        WITH RECURSIVE closure(anc, node) AS (
          SELECT parent, child FROM bench_edges
          UNION ALL
          SELECT e.parent, c.node FROM closure c JOIN bench_edges e ON c.anc = e.child)
        SELECT anc AS node, count(node) AS descendants FROM closure GROUP BY anc""").collect()
    batch_s = time.monotonic() - t1
    batched = {r["node"]: r["descendants"] for r in rows}

    # 3. What a feedback topic pays per loop level: one micro-batch of a plain query
    # through the gated source and sink (the same plan's base projection alone).
    per_batch = _plain_batch_seconds(spark, bs, src, tag)

    result = {
        "nodes": NODES, "depth_limit": DEPTH, "edges": len(edges),
        "edges_per_batch": BATCH, "loop_batches": len(batches),
        "closure_rows": closure_rows,
        "stream_seconds": round(total, 2),
        "stream_loop_seconds": round(loop_done - t0, 2),
        "stream_edges_per_s": round(len(edges) / (loop_done - t0)),
        "stream_closure_rows_per_s": round(closure_rows / (loop_done - t0)),
        "settle_after_last_edge_seconds": round(last_ms + output_s, 2),
        "batch_with_recursive_seconds": round(batch_s, 2),
        "stream_over_batch": round(total / batch_s, 2),
        "results_equal": streamed == batched,
        "nodes_with_descendants": len(batched),
        "loop_iteration_ms_median": round(statistics.median(iteration_ms), 1)
        if iteration_ms else None,
        "plain_micro_batch_ms_median": round(per_batch * 1000, 1),
        "iterations_per_batch": [b[1] for b in batches],
    }
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "recursion.json").write_text(json.dumps(result, indent=2)
                                                               + "\n")
    print(json.dumps(result, indent=2))
    assert result["results_equal"], "streaming and batch recursion disagree"


def _plain_batch_seconds(spark, bs: str, src: str, tag: str) -> float:
    """Median trigger time of micro-batches of a projection through the gated source and
    the exactly-once sink, 2000 edges per batch."""
    from compat.infer import analyze
    from compat.serde import from_doc
    from migrate.build import Builder, BuildOptions

    doc = json.loads(PLAN.read_text())
    doc["nodes"] = [n for n in doc["nodes"] if n["id"] in ("edges", "base")] + [
        {"id": "out", "step": "sink", "version": 1, "inputs": ["base"],
         "topic": make_topic(bs, f"bench-plain-{tag}", 2), "format": "json",
         "key_columns": [], "mode": "append", "delivery": "exactly_once"}]
    doc["nodes"][0]["topic"] = src
    plan = from_doc(doc)
    analyze(plan)
    opts = BuildOptions(bootstrap=bs, query=f"bench-plain-{tag}", available_now=True,
                        checkpoint=tempfile.mkdtemp(prefix="bench-plain-"),
                        max_records_per_batch=2000)
    q = Builder(spark, plan, opts).start()
    deadline = time.monotonic() + 60
    while q.isActive and len(q.recentProgress) < 12 and time.monotonic() < deadline:
        time.sleep(0.2)
    q.stop()
    took = [p["durationMs"]["triggerExecution"] / 1000 for p in q.recentProgress[1:]]
    return statistics.median(took)


if __name__ == "__main__":
    main()
