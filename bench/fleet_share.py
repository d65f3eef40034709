"""Benchmark: five queries sharing a filter and a projection over one topic, run as they are
written and after ``theseus fleet optimize``, on real Kafka and Spark (local[2]).

Every query runs as a deployed query would: its own ``theseus run PLAN --available-now``
process (its own Spark driver and executors), one after the other, so that they do not
compete for the two cores.  For each run:

- **CPU seconds**: user + system time of the process tree (the ``theseus run`` Python
  process, its Spark JVM, Spark's Python workers), sampled from ``/proc/<pid>/stat`` every
  0.1 s and summed over every process seen (the last tick of a process before it exits is
  lost: under 0.1 s of CPU per process);
- **records read from Kafka**: the offsets its sources consumed (every source starts at the
  earliest offset and an available-now run reads to the end offsets it saw at start, so:
  end minus start offset of each source topic, summed over its sources; an exactly-once
  topic counts its transaction markers too, one per partition and batch).

A run over an empty input topic measures what a process costs before it reads a record
(Spark's start-up and shutdown): the *work* CPU of a fleet is its total minus that fixed
cost for each process, since the optimized fleet runs one process more (the shared query).
The optimized consumers write to other output topics than the original ones (``<topic>.after``)
so that both outputs can be compared: every query's output must have as many records.

Run: ``make bench-fleet`` (starts the local broker unless KAFKA_BOOTSTRAP is set); writes
``bench/results/fleet_share.{json,md}``.  BENCH_ROWS sets the input size (200,000).
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ROWS = int(os.environ.get("BENCH_ROWS", "200000"))
PARTITIONS = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")

SCHEMA = [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "double"},
          {"name": "qty", "type": "int"}, {"name": "region", "type": "string"},
          {"name": "ts", "type": "timestamp"}]

#: the shared filter and projection, written differently by each team (operand order,
#: case, aliases), then each query's own tail
QUERIES: list[dict[str, Any]] = [
    {"name": "orders_clean", "predicate": "region <> 'test' AND amount > 10",
     "columns": [("order_id", "order_id"), ("region", "upper(region)"),
                 ("total", "amount * qty"), ("qty", "qty")],
     "tail": []},
    {"name": "orders_big", "predicate": "amount > 10 AND region <> 'test'",
     "columns": [("id", "order_id"), ("region", "UPPER(region)"), ("total", "qty * amount"),
                 ("qty", "qty")],
     "tail": [{"step": "filter", "predicate": "total > 1000"}]},
    {"name": "orders_eu", "predicate": "10 < amount and 'test' != region",
     "columns": [("order_id", "order_id"), ("region", "upper(region)"),
                 ("value", "amount*qty"), ("qty", "qty")],
     "tail": [{"step": "filter", "predicate": "region = 'EU'"},
              {"step": "project", "columns": [{"name": "order_id", "expr": "order_id"},
                                               {"name": "value", "expr": "value"}]}]},
    {"name": "orders_gross", "predicate": "(region <> 'test') AND (amount > 10)",
     "columns": [("order_id", "order_id"), ("r", "upper(region)"), ("total", "amount * qty"),
                 ("qty", "qty")],
     "tail": [{"step": "project", "columns": [{"name": "order_id", "expr": "order_id"},
                                               {"name": "gross", "expr": "total * 1.2"}]}]},
    {"name": "orders_bulk", "predicate": "region <> 'test' AND amount > 10",
     "columns": [("order_id", "order_id"), ("region", "upper(region)"),
                 ("total", "amount * qty"), ("qty", "qty")],
     "tail": [{"step": "filter", "predicate": "qty >= 4"}]},
]


def plan_doc(q: dict[str, Any], src: str, out: str) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [
        {"id": "orders", "step": "source", "version": 1, "topic": src,
         "partitions": PARTITIONS, "format": "json", "role": "stream", "schema": SCHEMA},
        {"id": "clean", "step": "filter", "version": 1, "inputs": ["orders"],
         "predicate": q["predicate"]},
        {"id": "shaped", "step": "project", "version": 1, "inputs": ["clean"],
         "columns": [{"name": n, "expr": e} for n, e in q["columns"]]}]
    for i, t in enumerate(q["tail"]):
        nodes.append({"id": f"t{i}", "version": 1, "inputs": [nodes[-1]["id"]], **t})
    nodes.append({"id": "out", "step": "sink", "version": 1, "inputs": [nodes[-1]["id"]],
                  "topic": out, "format": "json", "key_columns": [], "mode": "append",
                  "delivery": "at_least_once"})
    return {"format": "theseus.plan/1", "query": q["name"], "config": {"state_partitions": 2},
            "nodes": nodes}


# -- Kafka ---------------------------------------------------------------------------------------


def bootstrap() -> tuple[str, bool]:
    """The broker, and whether this run started it (then it stops it at the end)."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return os.environ["KAFKA_BOOTSTRAP"], False
    was = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "status"],
                         capture_output=True).returncode == 0
    out = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1].split("=", 1)[1], not was


def make_topics(bs: str, names: list[str], parts: int = PARTITIONS) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bs})
    fs = admin.create_topics([NewTopic(n, parts, 1) for n in names])
    for f in fs.values():
        f.result(30)


def produce(bs: str, topic: str, n: int) -> None:
    from bench.feed import produce_orders

    produce_orders(bs, topic, n, PARTITIONS)


def offsets(bs: str, topic: str) -> int:
    """End minus start offset over the topic's partitions."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": "bench-" + uuid.uuid4().hex})
    md = c.list_topics(topic, timeout=30).topics[topic]
    total = 0
    for p in md.partitions:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        total += hi - lo
    c.close()
    return total


def records(bs: str, topic: str) -> int:
    """Data records in a topic (read_committed, no transaction markers)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": "bench-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    md = c.list_topics(topic, timeout=30).topics[topic]
    ends = {}
    for p in md.partitions:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        if hi > lo:
            ends[p] = hi
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    n, done = 0, set()
    deadline = time.monotonic() + 120
    while len(done) < len(ends) and time.monotonic() < deadline:
        n += sum(1 for m in c.consume(10_000, timeout=1.0) if not m.error())
        for p in list(ends):  # a partition whose position reached its end is done
            pos = c.position([TopicPartition(topic, p)])[0].offset
            if pos >= ends[p]:
                done.add(p)
    c.close()
    return n


# -- CPU of a process tree ------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int, float] | None:
    """(ppid, start time, user+system seconds) of a process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def run_measured(cmd: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run ``cmd`` and sample the CPU time of its process tree until it exits."""
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        seen: dict[tuple[int, int], float] = {}
        tree = {proc.pid}
        while True:
            stats = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    s = _stat(int(entry))
                    if s is not None:
                        stats[int(entry)] = s
            grew = True
            while grew:  # descendants of the tree, by parent pid
                grew = False
                for pid, (ppid, _, _) in stats.items():
                    if ppid in tree and pid not in tree:
                        tree.add(pid)
                        grew = True
            for pid in tree:
                if pid in stats:
                    _, start, cpu = stats[pid]
                    seen[(pid, start)] = max(cpu, seen.get((pid, start), 0.0))
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return {"cpu_seconds": round(sum(seen.values()), 2), "wall_seconds": round(wall, 2),
            "processes": len(seen)}


def theseus_run(plan: Path, bs: str, state: Path, logs: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    cmd = [sys.executable, "-c", "from migrate.cli import entry; entry()", "run", str(plan),
           "--bootstrap", bs, "--state", str(state), "--available-now"]
    return run_measured(cmd, env, logs / f"{plan.stem}.log")


def run_fleet(plans: list[Path], bs: str, tmp: Path, label: str) -> dict[str, Any]:
    from compat.check import load_plan

    state = tmp / f"state-{label}"
    logs = tmp / f"logs-{label}"
    logs.mkdir(parents=True)
    per: dict[str, Any] = {}
    for path in plans:
        plan = load_plan(str(path))
        m = theseus_run(path, bs, state, logs)
        m["records_read"] = sum(offsets(bs, n.topic) for n in plan.nodes.values()
                                if n.step == "source")
        m["output_records"] = records(bs, plan.sink.topic)
        per[plan.query] = m
        print(f"  {label} {plan.query}: {m}", flush=True)
    return {"queries": per, "processes": len(plans),
            "cpu_seconds": round(sum(m["cpu_seconds"] for m in per.values()), 2),
            "wall_seconds": round(sum(m["wall_seconds"] for m in per.values()), 2),
            "records_read": sum(m["records_read"] for m in per.values())}


def main() -> int:
    from compat.check import load_plan
    from compat.fleet.optimize import optimize_dir
    from compat.fleet.signature import shared_subplans, source_reads

    bs, started = bootstrap()
    tmp = Path(tempfile.mkdtemp(prefix="theseus-fleet-bench-"))
    run = uuid.uuid4().hex[:8]
    src = f"bench-fleet-in-{run}"
    outs = {q["name"]: f"bench-fleet-{q['name']}-{run}" for q in QUERIES}
    make_topics(bs, [src, f"bench-fleet-empty-{run}", *outs.values(),
                     *(o + ".after" for o in outs.values())])
    t = time.perf_counter()
    produce(bs, src, ROWS)
    print(f"produced {ROWS} records in {time.perf_counter() - t:.1f}s", flush=True)
    before = tmp / "before"
    before.mkdir()
    for q in QUERIES:
        (before / f"{q['name']}.json").write_text(
            json.dumps(plan_doc(q, src, outs[q["name"]]), indent=2))
    after = tmp / "after"
    result = optimize_dir(str(before), str(after))
    (rw,) = result.rewrites  # the five share one filter and projection
    make_topics(bs, [rw.topic], rw.partitions)
    for q in result.migrate():  # outputs kept apart from the original run's
        p = after / f"{q}.json"
        d = json.loads(p.read_text())
        for n in d["nodes"]:
            if n["step"] == "sink":
                n["topic"] += ".after"
        p.write_text(json.dumps(d, indent=2))
    befores = sorted(before.glob("*.json"))
    afters = [after / "_shared" / f"{q}.json" for q in result.start_order()] + \
        [after / f"{q}.json" for q in result.migrate()]
    plans_before = {load_plan(str(p)).query: load_plan(str(p)) for p in befores}
    plans_after = {load_plan(str(p)).query: load_plan(str(p)) for p in afters}

    # The fixed cost of a process: the first query's plan over an empty topic.
    empty = tmp / "empty.json"
    empty.write_text(json.dumps(plan_doc(QUERIES[0], f"bench-fleet-empty-{run}",
                                         outs[QUERIES[0]["name"]] + ".after")))
    logs = tmp / "logs-empty"
    logs.mkdir()
    theseus_run(empty, bs, tmp / "state-warm", logs)  # warm the page cache, not measured
    fixed = theseus_run(empty, bs, tmp / "state-empty", logs)
    print(f"  fixed cost of a process: {fixed}", flush=True)

    measured = {"before": run_fleet(befores, bs, tmp, "before"),
                "after": run_fleet(afters, bs, tmp, "after")}
    for phase in measured.values():
        phase["work_cpu_seconds"] = round(
            phase["cpu_seconds"] - phase["processes"] * fixed["cpu_seconds"], 2)
    b, a = measured["before"], measured["after"]
    same = all(b["queries"][q]["output_records"] ==
               a["queries"][q]["output_records"] for q in outs)
    res: dict[str, Any] = {
        "rows": ROWS, "queries": len(QUERIES), "master": "local[2]",
        "shared": {"signature": rw.shared.signature, "topic": rw.topic,
                   "partitions": rw.partitions, "query": rw.query,
                   "steps": rw.shared.steps, "renamed": list(rw.renamed)},
        "shared_subplans_before": [
            {"kind": sh.kind, "members": [f"{q}:{n}" for q, n in sh.members]}
            for sh in shared_subplans(plans_before)],
        "source_reads": {"before": source_reads(plans_before),
                         "after": source_reads(plans_after)},
        "fixed_process_cost": fixed,
        "before": b, "after": a,
        "outputs_equal": same,
        "saving": {
            "cpu_seconds": round(b["cpu_seconds"] - a["cpu_seconds"], 2),
            "cpu_percent": round(100 * (1 - a["cpu_seconds"] / b["cpu_seconds"]), 1),
            "work_cpu_seconds": round(b["work_cpu_seconds"] - a["work_cpu_seconds"], 2),
            "work_cpu_percent": round(100 * (1 - a["work_cpu_seconds"] /
                                             b["work_cpu_seconds"]), 1)
            if b["work_cpu_seconds"] > 0 else None,
            "records_read": b["records_read"] - a["records_read"],
            "records_read_percent": round(100 * (1 - a["records_read"] / b["records_read"]),
                                          1),
        },
        "note": ("each query is its own `theseus run --available-now` process, run one after "
                 "the other; CPU = user+system of the process tree from /proc; records read = "
                 "offsets consumed from every source topic (the internal topic is "
                 "exactly-once: its offsets include one transaction marker per partition "
                 "and batch); work CPU = CPU minus the fixed cost of a process (a run over "
                 "an empty topic) per process"),
    }
    out = ROOT / "bench" / "results" / "fleet_share.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    (ROOT / "bench" / "results" / "fleet_share.md").write_text(markdown(res))
    print(json.dumps(res["saving"], indent=2))
    if started:
        subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "stop"], check=False)
    return 0 if same else 1


def markdown(r: dict[str, Any]) -> str:
    b, a, s = r["before"], r["after"], r["saving"]
    lines = [
        "# Fleet sharing: five queries, one filter and projection computed once",
        "",
        f"{r['rows']:,} records on one topic ({r['shared']['partitions']} partitions); five "
        "queries that clean (filter) and shape (project) them the same way, written "
        "differently (operand order, case, aliases), then each its own tail. "
        f"`theseus fleet optimize` moves the shared subplan ({r['shared']['steps']} steps, "
        f"signature `{r['shared']['signature'][:12]}`) into `{r['shared']['query']}`, which "
        f"writes `{r['shared']['topic']}`; the five read that topic instead "
        f"({', '.join(r['shared']['renamed']) or 'none'} renaming its columns back). "
        f"Spark {r['master']}, one `theseus run --available-now` process per query.",
        "",
        "| | processes | CPU s | work CPU s | wall s | records read from Kafka |",
        "|---|---:|---:|---:|---:|---:|",
        f"| before | {b['processes']} | {b['cpu_seconds']} | {b['work_cpu_seconds']} | "
        f"{b['wall_seconds']} | {b['records_read']:,} |",
        f"| after `fleet optimize` | {a['processes']} | {a['cpu_seconds']} | "
        f"{a['work_cpu_seconds']} | {a['wall_seconds']} | {a['records_read']:,} |",
        f"| saving | | {s['cpu_seconds']} ({s['cpu_percent']}%) | "
        f"{s['work_cpu_seconds']} ({s['work_cpu_percent']}%) | | "
        f"{s['records_read']:,} ({s['records_read_percent']}%) |",
        "",
        f"Fixed cost of one process (a run over an empty topic): "
        f"{r['fixed_process_cost']['cpu_seconds']} CPU s; *work CPU* is CPU minus that for "
        "each process (the optimized fleet has one process more: the shared query).",
        f"Every query's output has the same number of records before and after: "
        f"{'yes' if r['outputs_equal'] else 'NO'}.",
        "",
        "| query | CPU s before | CPU s after | records read before | after | output records |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for q in sorted(set(b["queries"]) | set(a["queries"])):
        qb, qa = b["queries"].get(q, {}), a["queries"].get(q, {})
        lines.append(f"| {q} | {qb.get('cpu_seconds', '')} | {qa.get('cpu_seconds', '')} | "
                     f"{qb.get('records_read', '')} | {qa.get('records_read', '')} | "
                     f"{qa.get('output_records', qb.get('output_records', ''))} |")
    lines += ["", r["note"] + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                            epilog="BENCH_ROWS sets the input size; KAFKA_BOOTSTRAP an "
                                   "existing broker.").parse_args()
    sys.exit(main())
