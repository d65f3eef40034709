"""Profile of a live migration's shadow backfill against the same plan run alone (issue 31).

Runs one migration of ``bench/migrate_speed.py`` (the ship-load story, ``BENCH_HISTORY``
records of history, ``BENCH_RATE`` records/s arriving) with every host reporting Spark's
``durationMs`` per micro-batch (``THESEUS_PROGRESS_DETAIL``), samples the CPU time of every
process tree it starts (the old query's host, the shadow's, the migrator, the plan alone:
each a Python host with its JVM and Spark's Python workers) from ``/proc`` twice a second,
and writes ``bench/results/profile_backfill.json`` and ``.md``:

* per micro-batch of the shadow during the backfill (from the ``shadow`` phase to
  ``caught_up``) and of the plan alone: rows, ``durationMs`` split (latestOffset, the gated
  source's gate read, acknowledgement and offset listing; queryPlanning; addBatch, the sink;
  walCommit, commitOffsets), the time between two batches beyond the batch itself (the
  trigger's wait);
* the time before the first batch (Python, plan checks, JVM start, query start);
* CPU seconds of each process tree in the window, and of the whole machine (the broker and
  whatever else runs on it: the machine is shared), against the 2 cores' wall time;
* the old query's batches in the same window.

Run: ``BENCH_PARTS=profile python bench/migrate_speed.py`` (Kafka at ``KAFKA_BOOTSTRAP``, under
the Spark lock): one migration profiled, with Spark's event logs.
``BENCH_PROFILE_TAG`` (default: the commit's short hash) names the run in the results (every
run is appended).  ``bench/migrate_speed.py`` profiles each of its migrations the same way
(without the event logs).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TICK = os.sysconf("SC_CLK_TCK")
BATCH = re.compile(r"^\s*batch (\d+): (\d+) rows in, .*? (\d+) ms \(from ([^)]+)\)(?: (\{.*\}))?$")


# ------------------------------------------------------------------ CPU of process trees

def _procs() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds so far, command line) of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(d)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, cmd)
    return out


def role(cmd: str, work: str) -> str | None:
    """Which part of the bench a process's command line is (None: not ours or a child)."""
    if work not in cmd or "migrate.cli" not in cmd:
        return None
    if " migrate start " in cmd:
        return "migrator"
    if "alone.json" in cmd:
        return "alone"
    if "--instance" in cmd:
        return "shadow"
    if " run " in cmd:
        return "old"
    return None


class Sampler(threading.Thread):
    """CPU seconds of each role's process tree (the host, its JVM, Spark's Python workers),
    every half second; a tree's total only grows while its processes live."""

    def __init__(self, work: Path) -> None:
        super().__init__(daemon=True)
        self.work = str(work)
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.halt = threading.Event()

    def sample(self) -> None:
        procs = _procs()
        roots = {pid: r for pid, (_, _, cmd) in procs.items() if (r := role(cmd, self.work))}
        totals: dict[str, float] = {}
        for pid, (_, cpu, _) in procs.items():
            p, seen = pid, 0
            while p and p not in roots and seen < 50:
                p = procs.get(p, (0, 0, ""))[0]
                seen += 1
            if p in roots:
                totals[roots[p]] = totals.get(roots[p], 0.0) + cpu
        with open("/proc/stat") as f:  # the machine's busy time, all cores
            fields = [int(x) for x in f.readline().split()[1:]]
        # user nice system (idle iowait) irq softirq steal
        totals["machine"] = (sum(fields[:3]) + sum(fields[5:8])) / TICK
        self.samples.append((time.time(), totals))

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(0.5)

    def cpu(self, who: str, t0: float, t1: float) -> float | None:
        """CPU seconds ``who`` used between ``t0`` and ``t1`` (samples nearest inside)."""
        inside = [(t, s[who]) for t, s in self.samples if t0 <= t <= t1 and who in s]
        if len(inside) < 2:
            return None
        return round(inside[-1][1] - inside[0][1], 2)


# ------------------------------------------------------------------ the hosts' batches

def batches(log: Path) -> list[dict[str, Any]]:
    """The progress lines of a host's log: batch id, rows, start (epoch s), duration split."""
    out = []
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        m = BATCH.match(line)
        if not m:
            continue
        detail = json.loads(m.group(5)) if m.group(5) else {}
        start = datetime.fromisoformat(m.group(4).replace("Z", "+00:00")).timestamp()
        out.append({"batch": int(m.group(1)), "rows": int(m.group(2)),
                    "start": round(start, 3), "ms": int(m.group(3)),
                    "duration_ms": detail.get("durationMs") or {},
                    "state": detail.get("state") or []})
    return out


def in_window(bs: list[dict], t0: float, t1: float) -> list[dict]:
    return [b for b in bs if t0 <= b["start"] <= t1]


KEYS = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets",
        "triggerExecution")


def summary(bs: list[dict], t0: float, t1: float, trigger_s: float) -> dict[str, Any]:
    """What one host's batches in [t0, t1] add up to."""
    if not bs:
        return {"batches": 0}
    rows = [b["rows"] for b in bs]
    split = {k: sum(b["duration_ms"].get(k, 0) for b in bs) for k in KEYS}
    waits = []  # between the end of a batch and the start of the next: the trigger's wait
    for a, b in zip(bs, bs[1:]):
        waits.append(max(0.0, b["start"] - (a["start"] + a["ms"] / 1000.0)))
    busy = sum(b["ms"] for b in bs) / 1000.0
    return {
        "batches": len(bs), "rows": sum(rows),
        "rows_per_batch": {"min": min(rows), "median": statistics.median(rows),
                           "max": max(rows)},
        "before_first_batch_s": round(bs[0]["start"] - t0, 2),
        "after_last_batch_start_s": round(t1 - bs[-1]["start"], 2),
        "batch_seconds_total": round(busy, 2),
        "duration_ms_total": split,
        "duration_ms_per_batch_median": {
            k: statistics.median(b["duration_ms"].get(k, 0) for b in bs) for k in KEYS},
        "trigger_wait_s_total": round(sum(waits), 2),
        "batches_shorter_than_trigger": sum(b["ms"] < trigger_s * 1000 for b in bs),
        "each": [{k: b[k] for k in ("batch", "rows", "ms")} |
                 {"split": {k: b["duration_ms"].get(k, 0) for k in KEYS[:-1]}} for b in bs],
    }


# ------------------------------------------------------------------ the run

def profiled_migration(run: Callable[[], dict[str, Any]], trigger_s: float, work: Path,
                       eventlog: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """One migration (``run``: ``bench/migrate_speed.py``'s, in ``work``, with its trigger
    interval ``trigger_s``), profiled: its result, and the profile (the module's
    docstring)."""
    os.environ["THESEUS_PROGRESS_DETAIL"] = "1"
    evdir = work / "eventlog"
    if eventlog:
        from eventlog import SPARK_CONF

        evdir.mkdir(parents=True)
        # every host this run starts (old query, shadow, the plan alone) logs its jobs here
        os.environ["THESEUS_SPARK_CONF"] = f"{SPARK_CONF};spark.eventLog.dir={evdir}"
    load = Path("/proc/loadavg").read_text().split(" ", 3)[:3]
    sampler = Sampler(work)
    sampler.start()
    t_start = time.time()
    try:
        res = run()
    finally:
        sampler.halt.set()
        sampler.join(5)
        if eventlog:
            os.environ.pop("THESEUS_SPARK_CONF", None)
    marks = dict((k, v) for k, v in res["phases"])
    t0, t1 = marks["shadow"], marks["caught_up"]
    shadow_log = next(iter((work / "state" / "logs").glob("*.g*.log")), None)
    trig = trigger_s
    shadow = summary(in_window(batches(shadow_log), t0, t1) if shadow_log else [], t0, t1,
                     trig)
    old = summary(in_window(batches(work / "v1.log"), t0, t1), t0, t1, trig)
    window = t1 - t0
    cpu: dict[str, Any] = {
        "backfill_window_s": round(window, 2),
        "old_query": sampler.cpu("old", t0, t1),
        "shadow": sampler.cpu("shadow", t0, t1),
        "migrator": sampler.cpu("migrator", t0, t1),
        "machine": sampler.cpu("machine", t0, t1),  # every process, the broker's too
    }
    parts = {"old": old, "shadow": shadow}
    tag = os.environ.get("BENCH_PROFILE_TAG") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
        text=True).stdout.strip()
    prof: dict[str, Any] = {"tag": tag, "started": round(t_start, 1),
                            "load_average_at_start": load}
    if "alone_started_at" in res:  # the run also ran the plan alone
        a0 = res["alone_started_at"]
        a1 = a0 + res["alone_seconds"]
        parts["alone"] = summary(batches(work / "alone.log"), a0, a1, trig)
        cpu.update(alone_window_s=round(a1 - a0, 2), alone=sampler.cpu("alone", a0, a1),
                   alone_machine=sampler.cpu("machine", a0, a1))
        res.update(cpu_accounted(res, cpu))
    prof.update({"result": {k: v for k, v in res.items() if k != "phases"},
                 "phases": res["phases"], "cpu_seconds": cpu,
                 "shadow_backfill": shadow, "old_query_in_backfill": old,
                 "alone": parts.get("alone")})
    if eventlog:
        prof["spark_jobs"] = spark_jobs(evdir, parts)
    return res, prof


def cpu_accounted(res: dict[str, Any], cpu: dict[str, Any]) -> dict[str, Any]:
    """The backfill against the plan alone with the old query's CPU taken out: rows per
    core-second left to the shadow (two cores over the window, less what the old query
    used) against rows per core-second the plan alone had (two cores over its run); and
    rows per CPU-second each used."""
    if None in (cpu.get("old_query"), cpu.get("shadow"), cpu.get("alone")):
        return {}
    left = 2 * cpu["backfill_window_s"] - cpu["old_query"]
    alone_cores = 2 * cpu["alone_window_s"]
    rows, rows_alone = res["shadow_backfill_rows"], res["alone_rows"]
    return {
        "old_query_cores_in_backfill": round(cpu["old_query"] / cpu["backfill_window_s"], 2),
        "backfill_over_alone_per_core_second_left": round(
            (rows / left) / (rows_alone / alone_cores), 2),
        "backfill_over_alone_per_cpu_second_used": round(
            (rows / cpu["shadow"]) / (rows_alone / cpu["alone"]), 2),
    }


def spark_jobs(evdir: Path, parts: dict[str, dict]) -> dict[str, Any]:
    """Spark's jobs per micro-batch of each host's batches in ``parts``: the hosts' event
    logs in the order their drivers started (the old query, the shadow, the plan alone)."""
    from eventlog import per_batch, read

    logs = sorted(evdir.iterdir(), key=lambda p: p.name)  # local-<start ms>
    out: dict[str, Any] = {}
    for (who, part), log in zip(parts.items(), logs):
        ids = {b["batch"] for b in part.get("each", ())}
        bs = [b for b in per_batch(read(log)) if b.batch in ids]
        if not bs:
            continue
        out[who] = {
            "event_log": log.name, "batches": len(bs),
            "jobs_per_batch": statistics.median(b.jobs for b in bs),
            "tasks_per_batch": statistics.median(b.tasks for b in bs),
            "task_run_ms_total": round(sum(b.metrics.get("run_ms", 0) for b in bs)),
            "task_cpu_ms_total": round(sum(b.metrics.get("cpu_ms", 0) for b in bs)),
            "jobs_wall_ms_total": sum(b.wall_ms for b in bs),
            "each": [{"batch": b.batch, "jobs": b.jobs, "tasks": b.tasks,
                      "wall_ms": b.wall_ms, "run_ms": round(b.metrics.get("run_ms", 0)),
                      "cpu_ms": round(b.metrics.get("cpu_ms", 0))} for b in bs],
        }
    return out


def brief(run: dict[str, Any]) -> dict[str, Any]:
    """What a profiled run prints: its figures without each batch's."""
    out = {k: run[k] for k in ("tag", "load_average_at_start", "cpu_seconds")}
    for part in ("shadow_backfill", "old_query_in_backfill", "alone"):
        out[part] = {k: v for k, v in (run[part] or {}).items() if k != "each"}
    out["spark_jobs"] = {k: {x: y for x, y in v.items() if x != "each"}
                         for k, v in run.get("spark_jobs", {}).items()}
    out["result"] = run["result"]
    return out


def save(run: dict[str, Any]) -> None:
    """Append ``run`` to bench/results/profile_backfill.json."""
    out = ROOT / "bench" / "results" / "profile_backfill.json"
    doc = json.loads(out.read_text()) if out.exists() else {"runs": []}
    doc["runs"].append(run)
    out.write_text(json.dumps(doc, indent=1) + "\n")

