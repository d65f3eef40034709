"""Benchmark: a live migration of the ship-load query at a steady input rate.

Measures, on real Kafka and Spark (results: bench/results/migrate_speed.json):

* **stall at cutover** — Kafka timestamps of the output: from the old query's last row to
  the new query's first row, in trigger intervals (target: at most 2), for each of
  ``BENCH_MIGRATIONS`` migrations (each a fresh story), with their median and maximum;
* **shadow backfill rate** — input rows per second the shadow consumes from offset 0 until
  it is close to the head (JVM start included), against the same plan run alone with
  ``theseus run --available-now`` over the same history (JVM start included); also with
  the old query's CPU taken out (``bench/profile_backfill.py``, which profiles every
  migration into ``bench/results/profile_backfill.json``);
* **reconciliation** (``bench/reconcile_stall.py``) — the stall at the cutover of an
  aggregate over ``BENCH_RECONCILE_KEYS`` keys (100000) with ``--reconcile on`` and ``off``
  (target: reconciliation adds at most one trigger interval), and its oracle;
* **cascade** (``bench/cascade_stall.py``) — the stall of a two-query cascade end to end
  (an enrichment feeding an aggregate, both migrated together; target: at most two trigger
  intervals), the upstream's stall around the propagated control events, and an oracle;
* **gates' overhead** — a filter-and-project plan, same data, with the gates (gate state
  read and acknowledgements written every trigger, start gate consulted every batch)
  against the same build with the gates removed; median of alternating runs (target:
  at most 5%).

The migration's output is also checked by the oracle of scripts/ship_story.py.

Run: ``make bench-migrate`` (starts the local broker if KAFKA_BOOTSTRAP is not set).
Knobs: BENCH_PARTS (migration,reconcile,cascade,overhead: the parts to run; the others keep
their last figures in the results file; ``profile``: one migration profiled with Spark's event
logs into bench/results/profile_backfill.json), BENCH_RATE (input records/s, 200), BENCH_HISTORY
(records before v1 starts, 100000), BENCH_MIGRATIONS (3), BENCH_OVERHEAD_ROWS (300000),
BENCH_REPEATS (3), BENCH_RECONCILE_KEYS (100000), BENCH_CASCADE_KEYS (10000).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

RATE = int(os.environ.get("BENCH_RATE", "200"))
HISTORY = int(os.environ.get("BENCH_HISTORY", "100000"))
OVERHEAD_ROWS = int(os.environ.get("BENCH_OVERHEAD_ROWS", "300000"))
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
MIGRATIONS = int(os.environ.get("BENCH_MIGRATIONS", "3"))
TRIGGER_S = 1.0


def migration_part(bs: str, work: Path, alone: bool = True) -> dict:
    from scripts.ship_story import THESEUS, Feeder, Story, migration_record

    st = Story(bs, work, rate=RATE, trigger=f"{TRIGGER_S:g} second", history=HISTORY,
               echo=lambda s: print(s, flush=True))
    st.create_topics()
    packages = st.topics["packages"]
    feeder = Feeder(bs, packages, RATE, start_n=HISTORY)
    feeder.start()
    try:
        st.start_v1()
        st.wait_running("ship_load")
        from gates.state import is_acked

        hist = {packages: st.end_offsets(packages)}
        deadline = time.monotonic() + 600
        while not is_acked(st.state, "ship_load", hist):  # v1 works through the history
            if time.monotonic() > deadline:
                raise SystemExit("v1 did not process the history")
            time.sleep(1)
        time.sleep(5)  # steady state
        r = st.theseus("migrate", "start", str(st.paths["v2"]), "--bootstrap", bs,
                       "--state", str(st.state), "--timeout", "900", show=False)
        if r.returncode != 0:
            raise SystemExit("migration failed:\n" + r.stdout + r.stderr)
        time.sleep(10)
    except BaseException:
        st.cleanup()
        raise
    finally:
        feeder.stop()
    try:
        st.drain_and_stop("ship_load")
    finally:
        st.cleanup()
    m = migration_record(st.state, "ship_load")
    res = st.oracle(m["cut"][packages])
    marks = dict((k, v) for k, v in m["history"])
    backfilled = sum(m["high"][packages].values())
    backfill_s = marks["caught_up"] - marks["shadow"]
    stall_s = (res["new_first_ms"] - res["old_last_ms"]) / 1000.0
    phases = [h for h in m["history"]]
    out = {
        "input_rate_per_s": RATE, "history_records": HISTORY, "trigger_seconds": TRIGGER_S,
        "phases": phases,
        "stall_seconds": round(stall_s, 2),
        "stall_trigger_intervals": round(stall_s / TRIGGER_S, 2),
        "stall_target_intervals": 2,
        "shadow_backfill_rows": backfilled,
        "shadow_backfill_seconds": round(backfill_s, 2),
        "shadow_backfill_rows_per_s": round(backfilled / backfill_s),
        "oracle": {k: v for k, v in res.items() if k not in ("old_last_ms", "new_first_ms")},
    }
    if not alone:
        return out

    # the same plan alone over the same history, into a throwaway topic
    alone = json.loads(st.paths["v2"].read_text())
    alone["query"] = "ship_load_alone"
    for n in alone["nodes"]:
        if n["step"] == "sink":
            n["topic"] = f"{n['topic']}-alone"
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bs})
    t = alone["nodes"][-1]["topic"]
    admin.create_topics([NewTopic(t, 3, 1)])[t].result(30)
    alone_path = work / "alone.json"
    alone_path.write_text(json.dumps(alone))
    rows_alone = sum(st.end_offsets(packages).values())
    t0 = time.time()
    r = subprocess.run(THESEUS + ["run", str(alone_path), "--bootstrap", bs, "--state",
                                  str(work / "alone-state"), "--available-now"],
                       cwd=ROOT, capture_output=True, text=True)
    alone_s = time.time() - t0
    (work / "alone.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise SystemExit("the plan alone failed:\n" + r.stderr[-2000:])
    out.update({
        "alone_rows": rows_alone, "alone_started_at": round(t0, 3),
        "alone_seconds": round(alone_s, 2),
        "alone_rows_per_s": round(rows_alone / alone_s),
        "backfill_over_alone": round((backfilled / backfill_s) / (rows_alone / alone_s), 2),
    })
    return out


def overhead_part(bs: str) -> dict:
    from run_speed import count, make_topic, plan_doc, produce

    from compat.infer import analyze
    from compat.serde import from_doc
    from gates.startgate import StartGate, write_start_gate
    from gates.state import GateState, write_gate
    from migrate.build import Builder, BuildOptions
    from migrate.run import spark_session

    spark = spark_session("local[2]", 2)
    src = f"bench-gates-{uuid.uuid4().hex[:8]}"
    produce(bs, src, OVERHEAD_ROWS)
    tmp = Path(tempfile.mkdtemp(prefix="theseus-gates-"))

    def one(gated: bool) -> float:
        out = make_topic(bs, f"bench-gates-out-{uuid.uuid4().hex[:8]}")
        plan = from_doc(plan_doc(src, out, "exactly_once"))
        analyze(plan)
        store = tmp / "store"
        kw = {}
        if gated:
            write_gate(store, plan.query, GateState("open", {}, 1))
            write_start_gate(store, plan.query, True, "bench")
            kw = {"store": str(store), "start_gate": StartGate(store, plan.query)}
        opts = BuildOptions(bootstrap=bs, query=plan.query, available_now=True,
                            checkpoint=str(tmp / plan.query), max_records_per_batch=20_000,
                            **kw)
        t = time.perf_counter()
        q = Builder(spark, plan, opts).start()
        q.awaitTermination()
        elapsed = time.perf_counter() - t
        assert q.exception() is None, q.exception()
        assert count(bs, out) > 0
        return elapsed

    one(True)  # warm-up
    one(False)
    gated, plain = [], []
    for _ in range(REPEATS):
        plain.append(one(False))
        gated.append(one(True))
    g, p = statistics.median(gated), statistics.median(plain)
    return {"rows": OVERHEAD_ROWS, "batch_rows": 20_000, "repeats": REPEATS,
            "gated_seconds": [round(x, 2) for x in gated],
            "ungated_seconds": [round(x, 2) for x in plain],
            "gated_rows_per_s": round(OVERHEAD_ROWS / g),
            "ungated_rows_per_s": round(OVERHEAD_ROWS / p),
            "overhead_percent": round((g - p) / p * 100, 1), "target_percent": 5}


def main() -> int:
    from migrate.run import spark_env
    from scripts.ship_story import bootstrap

    spark_env()
    bs = bootstrap()
    parts = os.environ.get("BENCH_PARTS", "migration,reconcile,cascade,overhead").split(",")
    out = ROOT / "bench" / "results" / "migrate_speed.json"
    result = json.loads(out.read_text()) if out.exists() else {}
    problems = False
    if "reconcile" in parts:
        from reconcile_stall import reconcile_part

        result["reconciliation"] = reconcile_part(bs)
        out.write_text(json.dumps(result, indent=2) + "\n")
        problems |= bool(result["reconciliation"]["with"][
            "keys_not_the_new_plan_over_all_input"])
    if "cascade" in parts:
        from cascade_stall import cascade_part

        result["cascade"] = cascade_part(bs)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["cascade"], indent=2), flush=True)
        problems |= bool(result["cascade"]["new_rows_without_the_new_upstream_column"] or
                         result["cascade"][
                             "keys_written_after_the_cut_not_the_new_chain_over_all_input"])
    if "migration" in parts:
        problems |= migrations(bs, result)
        out.write_text(json.dumps(result, indent=2) + "\n")
    if "profile" in parts:
        profile_part(bs)
    if "overhead" in parts:
        result["gates_overhead"] = overhead_part(bs)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["gates_overhead"], indent=2))
    return 1 if problems else 0


def migrations(bs: str, result: dict) -> bool:
    from profile_backfill import profiled_migration, save

    runs = []
    for i in range(MIGRATIONS):  # the stall is one moment per migration: take several
        work = ROOT / ".cache" / "bench" / f"migrate-{time.strftime('%H%M%S')}-{i}"
        # profiled (each batch's duration split, the CPU of each process tree): the
        # backfill's figures are read with the old query's share of the cores beside them
        res, prof = profiled_migration(
            lambda w=work, a=i == 0: migration_part(bs, w, alone=a), TRIGGER_S, work)
        save(prof)
        runs.append(res)
        print(json.dumps(runs[-1], indent=2), flush=True)
    stalls = [r["stall_trigger_intervals"] for r in runs]
    result["migration"] = dict(runs[0], **{
        "migrations": len(runs),
        "stall_trigger_intervals_each": stalls,
        "stall_trigger_intervals_median": round(statistics.median(stalls), 2),
        "stall_trigger_intervals_max": max(stalls),
        "oracle_problems_each": [r["oracle"]["problems"] for r in runs],
        "shadow_backfill_rows_per_s_each": [r["shadow_backfill_rows_per_s"] for r in runs],
    })
    result["migration"].pop("stall_seconds")
    result["migration"].pop("stall_trigger_intervals")
    return any(r["oracle"]["problems"] for r in runs)


def profile_part(bs: str) -> None:
    """One migration profiled with Spark's event logs (its jobs per batch), appended to
    bench/results/profile_backfill.json (``bench/profile_backfill.py``)."""
    from profile_backfill import brief, profiled_migration, save

    print("load average at start:", Path("/proc/loadavg").read_text().strip(), flush=True)
    work = ROOT / ".cache" / "bench" / f"profile-backfill-{time.strftime('%H%M%S')}"
    _, run = profiled_migration(lambda: migration_part(bs, work, alone=True), TRIGGER_S,
                                work, eventlog=True)
    save(run)
    print(json.dumps(brief(run), indent=1))


if __name__ == "__main__":
    sys.exit(main())
