"""Benchmark: the gated source and sink on the Spark standalone cluster (``make cluster``)
and the three-broker Kafka cluster (``make kafka BROKERS=3``), against Spark's own Kafka
connector on the same cluster and topics: 6 and 24 source partitions, one and two
executors (``spark.cores.max`` 1 or 2; each worker has one core).

For each run it records the input rate and where the time of the micro-batches went
(Spark's ``durationMs``: ``latestOffset`` + ``queryPlanning`` on the driver, ``addBatch``:
the batch itself, which for the gated sink includes collecting the encoded rows to the
driver and producing them there).

For the gated sink it also splits each batch's sink time three ways:

* ``sink_executors_job``: the Spark job(s) the sink's encode started, from Spark's own job
  submission and completion times (the driver's status store): the executors read the
  source, filter, project and encode the batch, and ship their results to the driver's JVM;
* ``sink_driver_collect``: the rest of the sink's time before producing
  (``KafkaSink.last_stats``' ``encode_seconds``, from the sink's call, less the jobs): the
  driver turning the collected Arrow batches into Python lists; for exactly once also the
  transactional producer's start and the committed-batch lookup (a query's first batch);
* ``sink_produce_on_driver``: the driver alone producing the rows and committing the
  transaction (``produce_seconds``).

Every session first runs each path once, untimed, on a small topic (class loading, the
connector's first metadata requests, our producers' start), then each configuration
``BENCH_REPEATS`` times, the paths interleaved; it reports every run and the median.

The **tables** part (issue 31): the initial load of a table read as a changelog — the
table aggregate and the table-table join of ``bench/tables.py``, on their row-based step
versions — with one and two executors: ``BENCH_TABLE_KEYS`` keys (and as many profiles for
the join) loaded, each query run available-now once on a fresh checkpoint, keys per second
and the two executors' rate over the one's.  Each query first runs untimed on a small
table in the same session; every timed run's output is checked against plain Python over
the table, and the load average is recorded at the start of the part and of each run.

Results: bench/results/cluster_speed.json: the gated part's keys at the top level, the
tables part's under ``tables`` (its earlier sessions under ``tables_earlier``); a run
rewrites only the keys of the parts it ran.  Env:
BENCH_PARTS (``gated,tables``: the parts to run), BENCH_ROWS (200000), BENCH_REPEATS (3),
BENCH_TABLE_KEYS (50000), BENCH_TABLE_REPEATS (1), BENCH_TABLE_QUERIES
(``table_aggregate.rows,table_table_join.rows``), BENCH_BATCH (the table queries' offsets
per micro-batch, 25000), SPARK_MASTER (default: start scripts/spark_cluster.sh, stopped at
the end), CLUSTER_BOOTSTRAP (default: start the three-node cluster of ``make kafka
BROKERS=3``, stopped at the end; never $KAFKA_BOOTSTRAP, the one-broker default of the
other benchmarks).  ``--quick``: 100000 rows, one repeat, and the gated exactly-once sink
against the connector only (no at-least-once runs); 20000 table keys.
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
REPEATS = int(os.environ.get("BENCH_REPEATS", "1" if QUICK else "3"))
#: the parts of a run, in the order they run
PARTS = ("gated", "tables")
TABLE_KEYS = int(os.environ.get("BENCH_TABLE_KEYS", "20000" if QUICK else "50000"))
TABLE_REPEATS = int(os.environ.get("BENCH_TABLE_REPEATS", "1"))
TABLE_QUERIES = os.environ.get("BENCH_TABLE_QUERIES",
                               "table_aggregate.rows,table_table_join.rows")
OUT = ROOT / "bench" / "results" / "cluster_speed.json"

from run_speed import connector_query, plan_doc  # noqa: E402

#: every gated-sink batch's own measurements (KafkaSink.last_stats), in order
SINK_STATS: list[dict] = []


def jobs_since(spark, job_id: int) -> list[tuple[int, float]]:
    """(job id, seconds from submission to completion) of the driver's jobs above
    ``job_id``, from Spark's status store (kept with the UI off too).  The store is fed by
    the listener bus, asynchronously: drained first."""
    jsc = spark.sparkContext._jsc.sc()
    try:
        jsc.listenerBus().waitUntilEmpty()
    except Exception:  # noqa: BLE001 (private in Spark: then poll below)
        pass
    for _ in range(50):
        jobs = jsc.statusStore().jobsList(None)
        mine = [jobs.apply(i) for i in range(jobs.size()) if jobs.apply(i).jobId() > job_id]
        if all(j.completionTime().isDefined() for j in mine):
            return [(j.jobId(), (j.completionTime().get().getTime()
                                 - j.submissionTime().get().getTime()) / 1000) for j in mine]
        time.sleep(0.1)
    raise RuntimeError(f"Spark's status store has jobs after {job_id} not completed")


def last_job(spark) -> int:
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    return max((jobs.apply(i).jobId() for i in range(jobs.size())), default=-1)


def record_sink_stats() -> None:
    """Wrap the gated sink: every batch's own stats, and the Spark jobs its encode ran
    (looked up after the batch, so that the lookup is in none of the sink's timings)."""
    import gates.sink as sink

    call, encode = sink.KafkaSink.__call__, sink.encode_batch
    marks: dict = {}

    def encode_marked(df, *args, **kwargs):
        marks.setdefault("before", last_job(df.sparkSession))
        return encode(df, *args, **kwargs)

    def measured(self, df, batch_id):
        marks.clear()
        call(self, df, batch_id)
        job = 0.0
        if "before" in marks:
            job = sum(s for _, s in jobs_since(df.sparkSession, marks["before"]))
        SINK_STATS.append({**self.last_stats, "executors_job_seconds": job})

    sink.encode_batch = encode_marked
    sink.KafkaSink.__call__ = measured


def last_line(args: list[str], env: dict) -> str:
    out = subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "KAFKA_BOOTSTRAP": "", **env}).stdout
    return out.strip().splitlines()[-1].split("=", 1)[1]


def produce(bs: str, topic: str, parts: int, n: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from bench.feed import produce_orders

    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic(topic, parts, -1)])[topic].result(30)
    produce_orders(bs, topic, n, parts, acks="all")


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
    encode = sum(b.get("encode_seconds", 0) for b in written)
    job = sum(b.get("executors_job_seconds", 0) for b in written)
    ph["sink_executors_job"] = round(1000 * job)
    ph["sink_driver_collect"] = round(1000 * (encode - job))
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


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def configurations(runs: list[dict]) -> list[dict]:
    """One entry per path x executors x partitions: the median of its runs (rows/s and each
    phase of durationMs) and every run's rows/s."""
    out = []
    keys = sorted({(r["executors"], r["partitions"], r["path"]) for r in runs})
    for cores, parts, path in keys:
        mine = [r for r in runs if (r["executors"], r["partitions"], r["path"])
                == (cores, parts, path) and "error" not in r]
        errors = [r["error"] for r in runs if (r["executors"], r["partitions"], r["path"])
                  == (cores, parts, path) and "error" in r]
        c: dict = {"path": path, "executors": cores, "partitions": parts,
                   "runs": len(mine), "errors": errors}
        if mine:
            c["rows_per_s_median"] = round(median([r["rows_per_s"] for r in mine]))
            c["rows_per_s_all"] = [r["rows_per_s"] for r in mine]
            c["seconds_median"] = round(median([r["seconds"] for r in mine]), 2)
            phases = sorted({k for r in mine for k in r["durationMs"]})
            c["durationMs_median"] = {k: round(median([r["durationMs"].get(k, 0)
                                                       for r in mine])) for k in phases}
        out.append(c)
    return out


def summary(configs: list[dict]) -> list[str]:
    """One line per executors x partitions: each path's median rows/s (all runs) against the
    connector's, and where the gated sink's batch time went."""
    lines = []
    for cores, parts in sorted({(c["executors"], c["partitions"]) for c in configs}):
        here = {c["path"]: c for c in configs
                if (c["executors"], c["partitions"]) == (cores, parts) and c["runs"]}
        conn = here.get("spark_connector")
        words = [f"{cores} executor(s), {parts} partitions:"]
        for name, c in here.items():
            words.append(f"{name} {c['rows_per_s_median']:,} rows/s (median of "
                         f"{', '.join(f'{x:,}' for x in c['rows_per_s_all'])})")
            if conn is not None and name != "spark_connector":
                words.append(f"= {c['rows_per_s_median'] / conn['rows_per_s_median']:.2f}x "
                             "the connector")
            d = c["durationMs_median"]
            if d.get("triggerExecution") and "sink_produce_on_driver" in d:
                t = d["triggerExecution"]
                words.append(
                    f"[batches {t / 1000:.2f} s: executors' job "
                    f"{d['sink_executors_job'] / 1000:.2f} s ({d['sink_executors_job'] / t:.0%}),"
                    f" driver collect {d['sink_driver_collect'] / 1000:.2f} s "
                    f"({d['sink_driver_collect'] / t:.0%}), driver producing "
                    f"{d['sink_produce_on_driver'] / 1000:.2f} s "
                    f"({d['sink_produce_on_driver'] / t:.0%})]")
        lines.append(" ".join(words))
    return lines


KAFKA3 = {"BROKERS": "3", "KAFKA_PORT": "29092", "KAFKA_CONTROLLER_PORT": "29100",
          "KAFKA_STATE": str(ROOT / ".cache" / "kafka-3")}


def main() -> int:
    from migrate.adopt.jars import connector_jars
    from migrate.run import spark_env

    parts = chosen_parts(os.environ.get("BENCH_PARTS"))
    spark_env()
    if "gated" in parts:
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
        jars = connector_jars()
        found: dict = {}
        if "gated" in parts:
            found.update(measure(master, bs, jars))
        if "tables" in parts:
            found["tables"] = measure_tables(master, bs, jars)
        write_results(OUT, found)
        print(f"wrote {OUT}")
        return 0
    finally:
        for args, env in reversed(started):
            subprocess.run(args, cwd=ROOT, env={**os.environ, "KAFKA_BOOTSTRAP": "", **env},
                           capture_output=True)


def one_run(spark, bs, name, topic, parts, tmp) -> tuple[float, dict]:
    if name == "spark_connector":
        return run_connector(spark, bs, topic, tmp)
    return run_theseus(spark, bs, topic, parts, name.removeprefix("theseus_"), tmp)


def measure(master: str, bs: str, jars: list[str]) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-cl-"))
    sizes = (6, 24)
    paths = ("theseus_exactly_once", "spark_connector") if QUICK else (
        "theseus_exactly_once", "theseus_at_least_once", "spark_connector")
    topics = {}
    for parts in sizes:
        topics[parts] = f"bench-cl-in{parts}-{uuid.uuid4().hex[:6]}"
        produce(bs, topics[parts], parts, ROWS)
    warm = f"bench-cl-warm-{uuid.uuid4().hex[:6]}"
    produce(bs, warm, 6, max(ROWS // 10, 10_000))
    result: dict = {"rows": ROWS, "repeats": REPEATS, "quick": QUICK, "master": master,
                    "bootstrap": bs,
                    "machine": f"{os.cpu_count()} cores shared by master, 2 workers, 3 "
                               "brokers and the driver", "runs": []}
    t_all = time.perf_counter()
    for cores in (1, 2):
        spark = session(master, cores, jars)
        try:
            for name in paths:  # warm-up, untimed: class loading, first metadata, producers
                one_run(spark, bs, name, warm, 6, tmp)
            for rep in range(REPEATS):
                for parts in sizes:
                    for name in paths:
                        try:
                            elapsed, ph = one_run(spark, bs, name, topics[parts], parts, tmp)
                        except Exception as e:  # noqa: BLE001 (recorded, the others run)
                            result["runs"].append({"path": name, "executors": cores,
                                                   "partitions": parts, "repeat": rep,
                                                   "error": str(e).splitlines()[0][:300]})
                            continue
                        row = {"path": name, "executors": cores, "partitions": parts,
                               "repeat": rep, "seconds": round(elapsed, 2),
                               "rows_per_s": round(ROWS / elapsed), "durationMs": ph}
                        result["runs"].append(row)
                        print(json.dumps(row), flush=True)
        finally:
            spark.stop()
    result["measured_seconds"] = round(time.perf_counter() - t_all)
    result["configurations"] = configurations(result["runs"])
    result["summary"] = summary(result["configurations"])
    for line in result["summary"]:
        print(line)
    return result


def chosen_parts(text: str | None) -> list[str]:
    """The parts of ``PARTS`` that the comma list ``text`` names (all when it is empty); an
    unknown name is refused, not skipped (a typo would silently measure nothing)."""
    if not text:
        return list(PARTS)
    asked = {t.strip() for t in text.split(",") if t.strip()}
    unknown = sorted(asked - set(PARTS))
    if unknown or not asked:
        raise SystemExit(f"BENCH_PARTS: unknown {', '.join(unknown) or repr(text)}; expected "
                         f"a comma list of {', '.join(PARTS)}")
    return [p for p in PARTS if p in asked]


def write_results(path: Path, found: dict) -> dict:
    """``found`` (a part's keys) over the file's document: the keys of the parts that did
    not run are kept, so that running one part never drops another's figures.  A tables
    part's earlier session moves to ``tables_earlier`` (every run is kept: one session of
    it is a single run per configuration)."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    if "tables" in found and "tables" in doc:
        doc["tables_earlier"] = doc.get("tables_earlier", []) + [doc["tables"]]
    doc.update(found)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def table_run(spark, bs: str, name: str, topics: dict[str, str], tmp: Path) -> tuple[float, str]:
    """One initial load of the changelog query ``name`` (``bench/tables.py``'s) over
    ``topics`` on a fresh checkpoint: the seconds it took and its output topic."""
    import tables

    out = {name: out_topic(bs, 3)}
    doc = tables.plans(topics, out)[name]
    return tables.run(spark, doc, bs, tmp / doc["query"]), out[name]


def table_scaling(runs: list[dict]) -> list[dict]:
    """Per query: each executor count's keys/s (median, every run's) and the two executors'
    median over the one's."""
    out = []
    for name in sorted({r["query"] for r in runs}):
        entry: dict = {"query": name}
        for cores in (1, 2):
            mine = [r["keys_per_s"] for r in runs if r["query"] == name
                    and r["executors"] == cores]
            if mine:
                entry[f"executors_{cores}"] = {"keys_per_s_median": round(median(mine)),
                                               "keys_per_s_all": mine}
        if "executors_1" in entry and "executors_2" in entry:
            entry["two_over_one"] = round(entry["executors_2"]["keys_per_s_median"]
                                          / entry["executors_1"]["keys_per_s_median"], 2)
        out.append(entry)
    return out


def measure_tables(master: str, bs: str, jars: list[str]) -> dict:
    """The tables part: the initial load of each of ``TABLE_QUERIES`` with one and two
    executors (see the module's docstring)."""
    import random

    import tables

    queries = [n for n in tables.selected(TABLE_QUERIES) if n != tables.BASELINE
               or tables.BASELINE in TABLE_QUERIES]
    started = {"load_average_1m": load_average(), "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    rng = random.Random(31)
    tag = uuid.uuid4().hex[:6]
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-cl-tables-"))
    p = tables.producer(bs)
    sets = {}
    for label, n in (("warm", 2_000), ("timed", TABLE_KEYS)):
        topics = {t: tables.make_topic(bs, f"bench-cl-tbl-{t}-{label}-{tag}")
                  for t in ("users", "profiles")}
        users = {f"u{i}": tables.user(rng, i) for i in range(n)}
        profiles = {f"u{i}": {"user_id": f"u{i}", "tier": rng.choice("abc")}
                    for i in range(n)}
        tables.send(p, topics["users"], users.items())
        tables.send(p, topics["profiles"], profiles.items())
        sets[label] = (topics, users, profiles)
    result: dict = {**started, "master": master, "bootstrap": bs, "keys": TABLE_KEYS,
                    "repeats": TABLE_REPEATS, "batch_offsets": tables.BATCH,
                    "state_partitions": 2, "runs": [],
                    # each query's step versions (``table_aggregate.rows``: the "rows" set)
                    "versions": {n: tables.VERSIONS[n.split(".", 1)[1]] for n in queries
                                 if "." in n}}
    t_all = time.perf_counter()
    for cores in (1, 2):
        spark = session(master, cores, jars)
        try:
            for name in queries:  # warm-up, untimed: class loading, Python workers, RocksDB
                table_run(spark, bs, name, sets["warm"][0], tmp)
            topics, users, profiles = sets["timed"]
            for rep in range(TABLE_REPEATS):
                for name in queries:
                    at = load_average()
                    secs, topic = table_run(spark, bs, name, topics, tmp)
                    equal = tables.verify(bs, {name: topic}, users, profiles).get(name)
                    row = {"query": name, "executors": cores, "repeat": rep,
                           "load_average_1m_at_start": at, "seconds": round(secs, 2),
                           "keys_per_s": round(TABLE_KEYS / secs), "output_equal": equal}
                    result["runs"].append(row)
                    print(json.dumps(row), flush=True)
        finally:
            spark.stop()
    result["measured_seconds"] = round(time.perf_counter() - t_all)
    result["scaling"] = table_scaling(result["runs"])
    for entry in result["scaling"]:
        print(json.dumps(entry), flush=True)
    return result


if __name__ == "__main__":
    sys.exit(main())
