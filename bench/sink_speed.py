"""Benchmark: rows per second through the gated Kafka sink (``gates.sink.make_writer``), for
a batch of ``BENCH_SINK_ROWS`` rows (200,000 by default), exactly-once and at-least-once.

Each delivery writes one warm-up batch (producer, transactions, JVM code paths), then the
same cached DataFrame three times; the best of the three is the figure.  The topic's end
offsets are checked against what was written (every row once, plus at most one commit
marker per partition per exactly-once batch), so a figure is only kept when it is right.
This was the integration test ``test_sink_throughput_200k`` (1.6 M records written in every
CI run); ``test_sink_throughput_counts_every_row`` keeps a 20k-row run asserting the same
counting.
Results: bench/results/sink_speed.json.

Run: ``make bench-sink`` (starts the local broker if KAFKA_BOOTSTRAP is not set).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ROWS = int(os.environ.get("BENCH_SINK_ROWS", "200000"))
PARTITIONS = 3
TIMED = (1, 2, 3)  # batch ids of the timed writes; batch 0 is the warm-up


def make_topic(bs: str, name: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    return name


def end_offsets(bs: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": f"bench-{uuid.uuid4().hex[:6]}"})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                   for p in range(PARTITIONS))
    finally:
        c.close()


def main() -> int:
    from pyspark.sql import functions as F

    from bench.run_speed import bootstrap
    from gates.sink import make_writer
    from migrate.run import spark_session

    bs = bootstrap()
    spark = spark_session("local[2]", 2)
    out = make_topic(bs, f"bench-sink-{uuid.uuid4().hex[:8]}")
    df = spark.range(ROWS).select(
        F.col("id"), F.concat(F.lit("ship-"), (F.col("id") % 1000).cast("string")).alias("ship_id"),
        (F.col("id") * 0.25).alias("weight"), F.timestamp_seconds(F.col("id")).alias("ts")).cache()
    df.count()
    result: dict = {"rows_per_batch": ROWS, "partitions": PARTITIONS, "spark": spark.version,
                    "rows_per_s": {}, "best_seconds": {}}
    for delivery in ("exactly_once", "at_least_once"):
        w = make_writer(bs, out, ["ship_id"], f"bench-sink-{uuid.uuid4().hex[:6]}", delivery)
        w(df, 0)
        best = None
        for bid in TIMED:
            t0 = time.perf_counter()
            w(df, bid)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        w.close()
        result["rows_per_s"][delivery] = round(ROWS / best)
        result["best_seconds"][delivery] = round(best, 3)
        print(delivery, result["rows_per_s"][delivery], "rows/s", flush=True)
    df.unpersist()
    written = 2 * (1 + len(TIMED)) * ROWS
    markers = (1 + len(TIMED)) * PARTITIONS
    total = end_offsets(bs, out)
    if not written <= total <= written + markers:
        print(f"end offsets sum to {total}, expected {written} records plus at most "
              f"{markers} commit markers: figures not kept", file=sys.stderr)
        return 1
    dest = ROOT / "bench" / "results" / "sink_speed.json"
    dest.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {dest.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
