"""Benchmark: the gated source and sink on the Spark standalone cluster (``make cluster``)
and the three-broker Kafka cluster (``make kafka BROKERS=3``), against Spark's own Kafka
connector on the same cluster and topics: 6 and 24 source partitions, one and two
executors (``spark.cores.max`` 1 or 2; each worker has one core).

For each run it records the input rate and where the time of the micro-batches went
(Spark's ``durationMs``: ``latestOffset`` + ``queryPlanning`` on the driver, ``addBatch``:
the batch itself, which for the gated sink includes collecting the encoded rows to the
driver and producing them there).

For the gated sink it also records, per batch, what the sink itself measures
(``KafkaSink.last_stats``): ``encode_seconds``, the Spark job that reads, filters and encodes
the batch on the executors and collects it to the driver as Arrow, and ``produce_seconds``,
the driver alone producing the rows and committing the transaction: the driver's share of
the data path.

Results: bench/results/cluster_speed.json.  Env: BENCH_ROWS (200000), SPARK_MASTER
(default: start scripts/spark_cluster.sh, stopped at the end), CLUSTER_BOOTSTRAP (default:
start the three-node cluster of ``make kafka BROKERS=3``, stopped at the end; never
$KAFKA_BOOTSTRAP, the one-broker default of the other benchmarks).  ``--quick``: 100000
rows, and the gated exactly-once sink against the connector only (no at-least-once runs).
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
sys.path.insert(0, str(ROOT / "bench"))
QUICK = "--quick" in sys.argv[1:]
ROWS = int(os.environ.get("BENCH_ROWS", "100000" if QUICK else "200000"))

from run_speed import connector_query, plan_doc  # noqa: E402

#: every gated-sink batch's own measurements (KafkaSink.last_stats), in order
SINK_STATS: list[dict] = []


def record_sink_stats() -> None:
    from gates.sink import KafkaSink

    call = KafkaSink.__call__

    def measured(self, df, batch_id):
        call(self, df, batch_id)
        SINK_STATS.append(dict(self.last_stats))

    KafkaSink.__call__ = measured


def last_line(args: list[str], env: dict) -> str:
    out = subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "KAFKA_BOOTSTRAP": "", **env}).stdout
    return out.strip().splitlines()[-1].split("=", 1)[1]


def produce(bs: str, topic: str, parts: int, n: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic(topic, parts, -1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bs, "linger.ms": 20, "batch.size": 1_000_000,
                  "compression.type": "lz4", "acks": "all",
                  "queue.buffering.max.messages": 1_000_000})
    regions = ["eu", "us", "apac", "latam", "test"]
    for i in range(n):
        v = json.dumps({"order_id": f"o{i}", "amount": (i % 1000) / 3.0, "qty": i % 7,
                        "region": regions[i % 5], "ts": "2026-01-01T00:00:00Z"})
        while True:
            try:
                p.produce(topic, v.encode(), partition=i % parts)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def out_topic(bs: str, parts: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"bench-cl-out-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bs})  # kept alive until the topic exists
    admin.create_topics([NewTopic(name, parts, -1)])[name].result(30)
    return name


def phases(q) -> dict:
    total: dict = {}
    for p in q.recentProgress:
        for k, v in (p.get("durationMs") or {}).items():
            total[k] = total.get(k, 0) + v
    return {k: total[k] for k in ("triggerExecution", "latestOffset", "queryPlanning",
                                   "addBatch", "walCommit", "commitOffsets") if k in total}


def run_theseus(spark, bs, src, parts, delivery, tmp):
    from compat.infer import analyze
    from compat.serde import from_doc
    from migrate.build import Builder, BuildOptions

    doc = plan_doc(src, out_topic(bs, 3), delivery)
    doc["nodes"][0]["partitions"] = parts
    plan = from_doc(doc)
    analyze(plan)
    opts = BuildOptions(bootstrap=bs, query=plan.query, available_now=True,
                        checkpoint=str(tmp / plan.query), max_records_per_batch=100_000)
    SINK_STATS.clear()
    t = time.perf_counter()
    q = Builder(spark, plan, opts).start()
    q.awaitTermination()
    elapsed = time.perf_counter() - t
    assert q.exception() is None, q.exception()
    ph = phases(q)
    written = [b for b in SINK_STATS if not b.get("skipped")]
    ph["sink_encode_and_collect"] = round(1000 * sum(b.get("encode_seconds", 0)
                                                      for b in written))
    ph["sink_produce_on_driver"] = round(1000 * sum(b.get("produce_seconds", 0)
                                                     for b in written))
    ph["rows_collected_to_driver"] = sum(b.get("rows", 0) for b in written)
    return elapsed, ph


def run_connector(spark, bs, src, tmp):
    q, elapsed = connector_query(spark, bs, src, out_topic(bs, 3), tmp, 100_000)
    return elapsed, phases(q)


def session(master: str, cores: int, jars: list[str]):
    from pyspark.sql import SparkSession

    from migrate.run import ship_code

    s = (SparkSession.builder.master(master).appName(f"theseus-bench-{cores}")
         .config("spark.ui.enabled", "false").config("spark.jars", ",".join(jars))
         .config("spark.cores.max", str(cores)).config("spark.executor.cores", "1")
         .config("spark.executor.memory", "512m").config("spark.driver.memory", "1g")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.pyspark.python", sys.executable)
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    ship_code(s)
    from gates.source import register

    register(s)
    return s


def summary(runs: list[dict]) -> list[str]:
    """One line per executors x partitions: each path's rows/s against the connector's, and
    the share of the gated sink's batch time spent producing on the driver."""
    lines = []
    cells = sorted({(r["executors"], r["partitions"]) for r in runs})
    for cores, parts in cells:
        here = {r["path"]: r for r in runs if (r["executors"], r["partitions"]) == (cores, parts)
                and "error" not in r}
        conn = here.get("spark_connector")
        words = [f"{cores} executor(s), {parts} partitions:"]
        for name, r in here.items():
            words.append(f"{name} {r['rows_per_s']:,} rows/s")
            if conn is not None and name != "spark_connector":
                words.append(f"({r['rows_per_s'] / conn['rows_per_s']:.2f}x the connector)")
            d = r["durationMs"]
            if d.get("triggerExecution") and "sink_produce_on_driver" in d:
                words.append(f"[driver producing {d['sink_produce_on_driver'] / 1000:.1f} s = "
                             f"{d['sink_produce_on_driver'] / d['triggerExecution']:.0%} of "
                             f"the batches' time; executors' job + collect "
                             f"{d['sink_encode_and_collect'] / 1000:.1f} s]")
        lines.append(" ".join(words))
    return lines


KAFKA3 = {"BROKERS": "3", "KAFKA_PORT": "29092", "KAFKA_CONTROLLER_PORT": "29100",
          "KAFKA_STATE": str(ROOT / ".cache" / "kafka-3")}


def main() -> int:
    from migrate.adopt.jars import connector_jars
    from migrate.run import spark_env

    spark_env()
    record_sink_stats()
    started = []
    try:
        master = os.environ.get("SPARK_MASTER")
        if not master:
            started.append((["bash", "scripts/spark_cluster.sh", "stop"], {}))
            master = last_line(["bash", "scripts/spark_cluster.sh", "start"], {})
        bs = os.environ.get("CLUSTER_BOOTSTRAP")
        if not bs:
            started.append((["bash", "scripts/kafka.sh", "stop"], KAFKA3))
            bs = last_line(["bash", "scripts/kafka.sh", "start"], KAFKA3)
        return measure(master, bs, connector_jars())
    finally:
        for args, env in reversed(started):
            subprocess.run(args, cwd=ROOT, env={**os.environ, "KAFKA_BOOTSTRAP": "", **env},
                           capture_output=True)


def measure(master: str, bs: str, jars: list[str]) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-cl-"))
    sizes = (6, 24)
    paths = ("theseus_exactly_once", "spark_connector") if QUICK else (
        "theseus_exactly_once", "theseus_at_least_once", "spark_connector")
    topics = {}
    for parts in sizes:
        topics[parts] = f"bench-cl-in{parts}-{uuid.uuid4().hex[:6]}"
        produce(bs, topics[parts], parts, ROWS)
    result: dict = {"rows": ROWS, "quick": QUICK, "master": master, "bootstrap": bs,
                    "machine": f"{os.cpu_count()} cores shared by master, 2 workers, 3 "
                               "brokers and the driver", "runs": []}
    for cores in (1, 2):
        spark = session(master, cores, jars)
        try:
            run_theseus(spark, bs, topics[6], 6, "at_least_once", tmp)  # warm-up
            for parts in sizes:
                for name in paths:
                    try:
                        if name == "spark_connector":
                            elapsed, ph = run_connector(spark, bs, topics[parts], tmp)
                        else:
                            elapsed, ph = run_theseus(spark, bs, topics[parts], parts,
                                                      name.removeprefix("theseus_"), tmp)
                    except Exception as e:  # noqa: BLE001 (recorded, the others still run)
                        result["runs"].append({"path": name, "executors": cores,
                                               "partitions": parts,
                                               "error": str(e).splitlines()[0][:300]})
                        continue
                    row = {"path": name, "executors": cores, "partitions": parts,
                           "seconds": round(elapsed, 2),
                           "rows_per_s": round(ROWS / elapsed), "durationMs": ph}
                    result["runs"].append(row)
                    print(json.dumps(row), flush=True)
        finally:
            spark.stop()
    result["summary"] = summary(result["runs"])
    for line in result["summary"]:
        print(line)
    out = ROOT / "bench" / "results" / "cluster_speed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
