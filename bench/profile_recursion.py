"""Profile: where the time of streaming recursion goes (issue 31, item 1).

The descendants plan of ``bench/recursion.py`` over a random forest of ``BENCH_NODES``
nodes (default 10000, depth at most ``BENCH_DEPTH`` = 20), ``BENCH_BATCH`` edges per
micro-batch (default a quarter of the edges), with available-now.  The recursion runs
in the driver (``migrate.build.recursive``: a ``foreachBatch`` loop), not in Python
workers, so the profiles are:

* Spark's event log: the jobs each loop micro-batch runs (a ``foreachBatch`` callback's
  jobs carry the batch's id), their stages, tasks and task time, against the batch's loop
  iterations (the loop's progress notes);
* cProfile of the loop's ``foreachBatch`` callback in the driver (the thread that runs
  it): which DataFrame calls it waits on (each an action, a job or more), and how long.

The same edges through Spark SQL's batch ``WITH RECURSIVE`` in the same session, for
scale.  Results: bench/results/profile_recursion.json (``PROFILE_OUT`` to write
elsewhere).  Run: ``flock /tmp/theseus-spark.lock env KAFKA_BOOTSTRAP=127.0.0.1:19092
PYTHONPATH=. .venv/bin/python bench/profile_recursion.py``.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import random
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BENCH_NODES", "10000")

from bench import recursion as R  # noqa: E402  (reads the sizes above)
from bench.eventlog import SPARK_CONF, latest, read  # noqa: E402

BATCH = int(os.environ.get("BENCH_BATCH", "0")) or max(1000, R.NODES // 4)
OUT = Path(os.environ.get("PROFILE_OUT",
                          ROOT / "bench" / "results" / "profile_recursion.json"))
#: the driver-side calls reported (function names in pyspark/sql/... and the loop's own)
CALLS = ("localCheckpoint", "isEmpty", "count", "parquet", "distinct", "subtract",
         "unionByName", "_body", "_read", "_write", "_fixpoint", "_loop", "_recursive_sql",
         "sql", "collect", "batch", "writer", "createDataFrame", "send_command", "__call__")


def main() -> int:
    evdir = Path(tempfile.mkdtemp(prefix="theseus-eventlog-"))
    os.environ["THESEUS_SPARK_CONF"] = ";".join(filter(None, [
        os.environ.get("THESEUS_SPARK_CONF", ""), SPARK_CONF,
        f"spark.eventLog.dir=file://{evdir}"]))
    from migrate.build import Builder, BuildOptions
    from migrate.build.recursive import Loop
    from migrate.run import spark_session

    prof = cProfile.Profile()
    plain_batch = Loop.batch

    windows: dict[int, tuple[int, int]] = {}

    def profiled_batch(self, df, batch_id: int) -> None:
        start = int(time.time() * 1000)
        prof.enable()
        try:
            plain_batch(self, df, batch_id)
        finally:
            prof.disable()
            windows[batch_id] = (start, int(time.time() * 1000))

    Loop.batch = profiled_batch  # this process only: the loop's callback, profiled
    bs = R.bootstrap()
    edges = R.forest(R.NODES, R.DEPTH, random.Random(2026))
    tag = uuid.uuid4().hex[:8]
    spark = spark_session("local[2]", 2)
    spark.conf.set("spark.sql.cteRecursionLevelLimit", "-1")
    spark.conf.set("spark.sql.cteRecursionRowLimit", "-1")
    src = R.make_topic(bs, f"prof-edges-{tag}", 2)
    out = R.make_topic(bs, f"prof-desc-{tag}", 2)
    R.produce(bs, src, edges)
    opts = BuildOptions(bootstrap=bs, query=f"prof-rec-{tag}", available_now=True,
                        checkpoint=tempfile.mkdtemp(prefix="prof-rec-"),
                        max_records_per_batch=BATCH)
    t0 = time.monotonic()
    chain = Builder(spark, R._plan(src, out), opts).start()
    notes: list[str] = []
    loop_done = None
    while chain.isActive:
        notes += chain.notes()
        if loop_done is None and len(chain.queries) > 1:
            loop_done = time.monotonic() - t0
        time.sleep(0.1)
    notes += chain.notes()
    assert chain.exception() is None, chain.exception()
    total = time.monotonic() - t0
    loop_id = str(chain.queries[0].id)
    loop_batches = {}
    for n in notes:
        m = re.search(r"batch (\d+): (\d+) new rows in (\d+) iteration\(s\), (\d+) ms"
                      r"(?: \((.*)\))?$", n)
        if m:
            # how the batch ran: as WITH RECURSIVE queries, or by the DataFrame loop (why)
            loop_batches[int(m.group(1))] = {"new_rows": int(m.group(2)),
                                             "iterations": int(m.group(3)),
                                             "loop_ms": int(m.group(4)),
                                             "path": m.group(5)}
    spark.createDataFrame(edges, "child string, parent string").createOrReplaceTempView(
        "prof_edges")
    t1 = time.monotonic()
    rows = spark.sql("""
        WITH RECURSIVE closure(anc, node) AS (
          SELECT parent, child FROM prof_edges
          UNION ALL
          SELECT e.parent, c.node FROM closure c JOIN prof_edges e ON c.anc = e.child)
        SELECT anc AS node, count(node) AS descendants FROM closure GROUP BY anc""").collect()
    batch_s = time.monotonic() - t1
    streamed = R.read_table(bs, out)
    equal = streamed == {r["node"]: r["descendants"] for r in rows}
    version = spark.version
    spark.stop()  # the event log is complete once the application ends
    jobs = read(latest(evdir))
    # a loop batch's jobs: those its callback submitted (by time: the loop query is the
    # only one running then), checked against the batch id Spark tagged them with
    for bid, lb in loop_batches.items():
        start, end = windows.get(bid, (0, -1))
        mine = [j for j in jobs if start <= j.submitted <= end]
        tagged = sum(1 for j in mine if j.query == loop_id and j.batch == bid)
        lb.update(jobs=len(mine), jobs_tagged_with_the_batch=tagged,
                  stages=sum(len(j.stages) for j in mine), tasks=sum(j.tasks for j in mine),
                  task_run_ms=round(sum(j.metrics.get("run_ms", 0) for j in mine)),
                  task_cpu_ms=round(sum(j.metrics.get("cpu_ms", 0) for j in mine)),
                  jobs_busy_ms=sum(j.wall_ms for j in mine),
                  jobs_per_iteration=round(len(mine) / max(1, lb["iterations"]), 1),
                  stages_per_iteration=round(sum(len(j.stages) for j in mine)
                                             / max(1, lb["iterations"]), 1))
    untagged = [j for j in jobs if j.query is None]
    st = pstats.Stats(prof)
    calls = []
    for (f, _line, name), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        if name in CALLS and ("pyspark" in f or "recursive.py" in f or "gates" in f):
            calls.append({"function": f"{f.rsplit('/', 2)[-1]}:{name}", "calls": nc,
                          "own_s": round(tt, 3), "cum_s": round(ct, 3)})
    calls.sort(key=lambda c: -c["cum_s"])
    result = {
        "nodes": R.NODES, "edges": len(edges), "edges_per_batch": BATCH,
        "spark": version,
        "stream_seconds": round(total, 2), "loop_seconds": round(loop_done or total, 2),
        "batch_with_recursive_seconds": round(batch_s, 2),
        "stream_over_batch": round(total / batch_s, 2), "results_equal": equal,
        "loop_batches": loop_batches,
        "jobs_outside_streaming_batches": len(untagged),
        "driver_profile_s": round(sum(v[2] for v in st.stats.values()), 3),  # type: ignore[attr-defined]
        "driver_calls": calls[:30],
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "driver_calls"}, indent=1))
    print(f"wrote {OUT} (event log {evdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
