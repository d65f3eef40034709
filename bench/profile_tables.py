"""Profile: where the time of tables read as changelogs goes (issue 31, item 1).

The table aggregation and the table-table join of ``bench/tables.py`` (same plans, same
data generator), at a small size: ``BENCH_KEYS`` keys loaded (default 10000), then
``BENCH_UPDATES`` upserts and deletes (default 5000), ``BENCH_BATCH`` offsets per
micro-batch (default 1000).  Each mode runs on topics of its own, filled with the same
records:

* ``plain``: no Python profiler; the figures are the query's progress per micro-batch
  (durations, the state operators' metrics) and Spark's event log (jobs per batch, task
  run and CPU time, the SQL metrics of the operators);
* ``cprofile``: the same with ``THESEUS_PY_PROFILE`` set, so that every changelog
  operator's Python worker profiles itself (``migrate.build.profiling``); the profiler
  slows the Python side, so its figures are shares, the plain run's the absolute times.

``PROFILE_MODES`` (default ``plain,cprofile``) and ``PROFILE_PLANS`` (default
``table_aggregate.old,table_table_join.old``; ``.rows`` for the new step versions) choose.
Results: bench/results/profile_tables.json
(``PROFILE_OUT`` to write elsewhere).  Run:
``flock /tmp/theseus-spark.lock env KAFKA_BOOTSTRAP=127.0.0.1:19092 PYTHONPATH=. \
.venv/bin/python bench/profile_tables.py``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BENCH_KEYS", "10000")
os.environ.setdefault("BENCH_UPDATES", "5000")
os.environ.setdefault("BENCH_BATCH", "1000")

from bench import tables as T  # noqa: E402  (reads the sizes above)
from bench.eventlog import SPARK_CONF, latest, per_batch, read  # noqa: E402
from bench.pyprof import breakdown  # noqa: E402

MODES = os.environ.get("PROFILE_MODES", "plain,cprofile").split(",")
PLANS = os.environ.get("PROFILE_PLANS", "table_aggregate.old,table_table_join.old").split(",")
OUT = Path(os.environ.get("PROFILE_OUT", ROOT / "bench" / "results" / "profile_tables.json"))
#: state operator metrics kept from each batch's progress
STATE_KEYS = ("operatorName", "numRowsTotal", "numRowsUpdated", "numRowsRemoved",
              "allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs", "numShufflePartitions")


#: the operators' SQL metrics kept per batch (of the ~50 each stateful operator reports)
SQL_KEPT = ("time to update", "time to execute Python code", "time to run Python workers",
            "time to initialize Python workers", "time to start Python workers",
            "time to commit changes", "number of output rows", "number of updated state rows",
            "number of total state rows", "number of removed state rows",
            "RocksDB: number of get calls", "RocksDB: number of put calls",
            "RocksDB: total get call latency", "RocksDB: total put call latency",
            "RocksDB: commit - file sync to external storage time",
            "RocksDB: load - time taken to load the store",
            "data sent to Python workers", "data returned from Python workers")


def kept(metric: str) -> bool:
    node, _, name = metric.partition(": ")
    return node.startswith("TransformWithState") and name in SQL_KEPT


def run(spark, doc: dict, bs: str, ck: Path):
    from compat.infer import analyze
    from compat.serde import from_doc
    from migrate.build import Builder, BuildOptions

    plan = from_doc(doc)
    analyze(plan)
    opts = BuildOptions(bootstrap=bs, query=plan.query, available_now=True,
                        checkpoint=str(ck), max_records_per_batch=T.BATCH)
    t = time.perf_counter()
    q = Builder(spark, plan, opts).start()
    q.awaitTermination()
    elapsed = time.perf_counter() - t
    assert q.exception() is None, q.exception()
    return q, elapsed


def progress_rows(q) -> list[dict]:
    rows = []
    for p in q.recentProgress:
        rows.append({
            "batch": p["batchId"], "input_rows": p["numInputRows"],
            "duration_ms": p["durationMs"],
            "state": [{k: s.get(k) for k in STATE_KEYS} | {
                "custom": {k: v for k, v in (s.get("customMetrics") or {}).items() if v}}
                for s in p.get("stateOperators", [])]})
    return rows


def fill(bs: str, tag: str) -> tuple[dict, dict, list]:
    """Topics of their own, with the same keys and updates every time (seeded)."""
    rng = random.Random(100)
    topics = {t: T.make_topic(bs, f"prof-tbl-{t}-{tag}") for t in ("users", "profiles")}
    out = {n: T.make_topic(bs, f"prof-tbl-out-{n}-{tag}") for n in PLANS}
    p = T.producer(bs)
    table = {f"u{i}": T.user(rng, i) for i in range(T.KEYS)}
    profiles = {f"u{i}": {"user_id": f"u{i}", "tier": rng.choice("abc")} for i in range(T.KEYS)}
    T.send(p, topics["users"], table.items())
    T.send(p, topics["profiles"], profiles.items())
    batch = list(T.updates(rng, T.UPDATES))
    return topics, out, batch


def main() -> int:
    from bench.run_speed import bootstrap

    evdir = Path(tempfile.mkdtemp(prefix="theseus-eventlog-"))
    profdir = Path(tempfile.mkdtemp(prefix="theseus-pyprof-"))
    os.environ["THESEUS_SPARK_CONF"] = ";".join(filter(None, [
        os.environ.get("THESEUS_SPARK_CONF", ""), SPARK_CONF,
        f"spark.eventLog.dir=file://{evdir}"]))
    from migrate.run import spark_session

    bs = bootstrap()
    spark = spark_session("local[2]", 2)
    result: dict = {"keys": T.KEYS, "updates": T.UPDATES, "batch_offsets": T.BATCH,
                    "spark": spark.version, "arrow_max_records_per_batch":
                    spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"),
                    "shuffle_partitions": 2, "runs": {}}
    for mode in MODES:
        tag = uuid.uuid4().hex[:8]
        topics, out, batch = fill(bs, tag)
        docs = T.plans(topics, out)
        tmp = Path(tempfile.mkdtemp(prefix="theseus-prof-tables-"))
        for phase in ("load", "updates"):
            if phase == "updates":
                T.send(T.producer(bs), topics["users"], batch)
            for name in PLANS:
                # the switch is read when the query is built: one folder per run
                if mode == "cprofile":
                    os.environ["THESEUS_PY_PROFILE"] = str(profdir / f"{name}.{phase}")
                else:
                    os.environ.pop("THESEUS_PY_PROFILE", None)
                q, secs = run(spark, docs[name], bs, tmp / name)
                n = T.KEYS if phase == "load" else T.UPDATES
                key = f"{mode}/{name}/{phase}"
                result["runs"][key] = {"seconds": round(secs, 2), "changes_per_s": round(n / secs),
                                       "query_id": str(q.id), "progress": progress_rows(q)}
                print(key, result["runs"][key]["seconds"], "s",
                      result["runs"][key]["changes_per_s"], "changes/s", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    os.environ.pop("THESEUS_PY_PROFILE", None)
    spark.stop()  # the event log is complete once the application ends
    print(f"event log {evdir}, profiles {profdir}", flush=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")  # the figures, whatever follows
    batches = per_batch(read(latest(evdir)))
    for run_ in result["runs"].values():
        mine = {p["batch"] for p in run_["progress"]}
        run_["spark_batches"] = [
            {"batch": b.batch, "jobs": b.jobs, "stages": b.stages, "tasks": b.tasks,
             "jobs_wall_ms": b.wall_ms, "task_ms": {k: round(v) for k, v in b.metrics.items()},
             "sql": {k: round(v) for k, v in sorted(b.sql.items()) if v and kept(k)}}
            for b in batches if b.query == run_["query_id"] and b.batch in mine]
    if "cprofile" in MODES:
        from migrate.build.profiling import labels, summary

        result["python_profile"] = {
            f"{d.name}/{lab}": breakdown(summary(d, lab))
            for d in sorted(profdir.iterdir()) for lab in labels(d)}
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
