"""Benchmark: rows per second of a filter-and-project plan through the gated source and sink,
against the same query written with Spark's own Kafka connector (spark-sql-kafka-0-10, jars
from Maven Central), same data, same Spark session, same broker.

Target (issue 3): at least 0.8x Spark's connector.  Results: bench/results/run_speed.json.

Run: ``make bench-run`` (starts the local broker if KAFKA_BOOTSTRAP is not set).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ROWS = int(os.environ.get("BENCH_ROWS", "400000"))


def bootstrap() -> str:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return os.environ["KAFKA_BOOTSTRAP"]
    out = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1].split("=", 1)[1]


def produce(bs: str, topic: str, n: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from bench.feed import produce_orders

    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    produce_orders(bs, topic, n, 3)


def make_topic(bs: str, name: str, parts: int = 3) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bs})  # keep the handle alive until done
    admin.create_topics([NewTopic(name, parts, 1)])[name].result(30)
    return name


def count(bs: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": "bench-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed"})
    total = 0
    for p in range(3):
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        total += hi - lo
    c.close()
    return total


def plan_doc(src: str, out: str, delivery: str) -> dict:
    return {
        "format": "theseus.plan/1", "query": f"bench_{uuid.uuid4().hex[:6]}",
        "config": {"state_partitions": 2},
        "nodes": [
            {"id": "orders", "step": "source", "version": 1, "topic": src, "partitions": 3,
             "format": "json", "role": "stream",
             "schema": [{"name": "order_id", "type": "string"},
                        {"name": "amount", "type": "double"}, {"name": "qty", "type": "int"},
                        {"name": "region", "type": "string"},
                        {"name": "ts", "type": "timestamp"}]},
            {"id": "f", "step": "filter", "version": 1, "inputs": ["orders"],
             "predicate": "region <> 'test' AND amount > 10"},
            {"id": "p", "step": "project", "version": 1, "inputs": ["f"],
             "columns": [{"name": "order_id", "expr": "order_id"},
                         {"name": "total", "expr": "amount * qty"},
                         {"name": "region", "expr": "upper(region)"}]},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["p"], "topic": out,
             "format": "json", "key_columns": [], "mode": "append", "delivery": delivery},
        ]}


def run_theseus(spark, bs: str, src: str, delivery: str, tmp: Path) -> tuple[float, int]:
    out = make_topic(bs, f"bench-out-{uuid.uuid4().hex[:8]}")
    return run_plan(spark, bs, plan_doc(src, out, delivery), tmp), count(bs, out)


def run_plan(spark, bs: str, doc: dict, tmp: Path) -> float:
    """Seconds of the plan ``doc`` run available-now through the gated source and sink
    (what bench/avro_speed.py measures too)."""
    from compat.infer import analyze
    from compat.serde import from_doc
    from migrate.build import Builder, BuildOptions

    plan = from_doc(doc)
    analyze(plan)
    opts = BuildOptions(bootstrap=bs, query=plan.query, available_now=True,
                        checkpoint=str(tmp / plan.query), max_records_per_batch=200_000)
    t = time.perf_counter()
    q = Builder(spark, plan, opts).start()
    q.awaitTermination()
    elapsed = time.perf_counter() - t
    assert q.exception() is None, q.exception()
    return elapsed


def run_connector(spark, bs: str, src: str, tmp: Path) -> tuple[float, int]:
    out = make_topic(bs, f"bench-out-{uuid.uuid4().hex[:8]}")
    _q, elapsed = connector_query(spark, bs, src, out, tmp, 200_000)
    return elapsed, count(bs, out)


def connector_query(spark, bs: str, src: str, out: str, tmp: Path, max_offsets: int):
    """The benchmark's query written with Spark's own Kafka connector, run to the end
    (availableNow): the finished query and the seconds it took."""
    from pyspark.sql import functions as F  # noqa: N812

    schema = "order_id STRING, amount DOUBLE, qty INT, region STRING, ts TIMESTAMP"
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bs)
          .option("subscribe", src).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", max_offsets).load()
          .select(F.from_json(F.col("value").cast("string"), schema).alias("v")).select("v.*")
          .where("region <> 'test' AND amount > 10")
          .selectExpr("order_id", "amount * qty AS total", "upper(region) AS region")
          .select(F.to_json(F.struct("*")).alias("value")))
    t = time.perf_counter()
    q = (df.writeStream.format("kafka").option("kafka.bootstrap.servers", bs)
         .option("topic", out).option("checkpointLocation", str(tmp / f"conn-{out}"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    elapsed = time.perf_counter() - t
    assert q.exception() is None, q.exception()
    return q, elapsed


def main() -> int:
    from migrate.run import spark_env

    spark_env()
    bs = bootstrap()
    from migrate.adopt.jars import connector_jars

    jars = connector_jars()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("theseus-bench")
             .config("spark.ui.enabled", "false").config("spark.jars", ",".join(jars))
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "3g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    src = f"bench-in-{uuid.uuid4().hex[:8]}"
    t = time.perf_counter()
    produce(bs, src, ROWS)
    print(f"produced {ROWS} rows in {time.perf_counter() - t:.1f}s", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-"))
    result: dict = {"note": "rows_written = offsets in the output topic; exactly-once "
                            "transactions add one commit marker per partition each",
                    "rows": ROWS, "spark": spark.version, "connector_jars": [Path(j).name
                                                                            for j in jars]}
    # warm-up (JIT, Python workers) on both paths, not measured
    run_theseus(spark, bs, src, "at_least_once", tmp)
    try:
        run_connector(spark, bs, src, tmp)
        connector_ok = True
    except Exception as e:  # a connector built for another Spark version may not load
        connector_ok = False
        result["connector_error"] = str(e).splitlines()[0][:300]
    runs = {}
    for name, fn in (("theseus_at_least_once", lambda: run_theseus(spark, bs, src,
                                                                     "at_least_once", tmp)),
                     ("theseus_exactly_once", lambda: run_theseus(spark, bs, src,
                                                                    "exactly_once", tmp)),
                     ("spark_connector", (lambda: run_connector(spark, bs, src, tmp))
                      if connector_ok else None)):
        if fn is None:
            continue
        elapsed, written = fn()
        runs[name] = {"seconds": round(elapsed, 2), "rows_written": written,
                      "input_rows_per_s": round(ROWS / elapsed)}
        print(name, runs[name], flush=True)
    result["runs"] = runs
    if "spark_connector" in runs:
        base = runs["spark_connector"]["input_rows_per_s"]
        for k in ("theseus_at_least_once", "theseus_exactly_once"):
            result[f"{k}_over_connector"] = round(runs[k]["input_rows_per_s"] / base, 2)
        result["target_over_connector"] = 0.8
    out = ROOT / "bench" / "results" / "run_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
