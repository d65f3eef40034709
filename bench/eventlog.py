"""Spark's own account of where a query's time went, read from its event log (issue 31).

A driver started with ``spark.eventLog.enabled=true`` and ``spark.eventLog.dir=<folder>``
(``THESEUS_SPARK_CONF``) writes one JSON event per line.  :func:`read` turns it into the
jobs Spark ran, each with its streaming query and micro-batch (the local properties the
stream thread sets, and a ``foreachBatch`` callback's jobs inherit), its stages and the
summed task metrics of its tasks, and the SQL metrics of every physical operator (named
``<operator>: <metric>``, from the plans of the SQL executions), per job.
:func:`per_batch` adds them up per (query, batch): how many jobs a micro-batch runs, their
task time and where the operators spent it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: task metrics kept (the event log's names; CPU time is in nanoseconds there, kept in ms)
TASK_METRICS = {
    "Executor Run Time": "run_ms",
    "Executor CPU Time": "cpu_ms",
    "Executor Deserialize Time": "deserialize_ms",
    "JVM GC Time": "gc_ms",
    "Result Serialization Time": "result_ser_ms",
}


@dataclass
class Job:
    id: int
    query: str | None
    batch: int | None
    description: str
    submitted: int = 0
    completed: int = 0
    stages: list[int] = field(default_factory=list)
    tasks: int = 0
    metrics: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    sql: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def wall_ms(self) -> int:
        return max(0, self.completed - self.submitted)


def _plan_metrics(info: dict[str, Any], out: dict[int, str]) -> None:
    name = info.get("nodeName", "?")
    # a query's stateful operators share a node name: tell them apart by operator id
    op = re.search(r"\bopId = (\d+)", info.get("simpleString", ""))
    if op:
        name = f"{name}[opId {op.group(1)}]"
    for m in info.get("metrics", ()):
        out[int(m["accumulatorId"])] = f"{name}: {m['name']}"
    for child in info.get("children", ()):
        _plan_metrics(child, out)


def _number(v: Any) -> float | None:
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _lines(path: Path):
    """The lines of an event log: a file, or a rolling log's folder of ``events_<n>_*``
    files in order (Spark 4 rolls by default; the drivers here turn compression off)."""
    files = [path] if path.is_file() else sorted(
        path.glob("events_*"), key=lambda p: int(p.name.split("_")[1]))
    for f in files:
        if f.suffix in (".zstd", ".lz4", ".snappy", ".lzf"):
            raise ValueError(f"{f}: a compressed event log; start the driver with "
                             "spark.eventLog.compress=false")
        with open(f, encoding="utf-8") as fh:
            yield from fh


def read(path: str | Path) -> list[Job]:
    """The jobs of one application's event log (a file or a rolling log's folder), in the
    order Spark submitted them."""
    jobs: dict[int, Job] = {}
    stage_job: dict[int, int] = {}
    accs: dict[int, str] = {}
    for line in _lines(Path(path)):
        ev = json.loads(line)
        kind = ev.get("Event", "")
        if kind.endswith("SparkListenerSQLExecutionStart") or \
                kind.endswith("SparkListenerSQLAdaptiveExecutionUpdate"):
            _plan_metrics(ev.get("sparkPlanInfo", {}), accs)
        elif kind == "SparkListenerJobStart":
            props = ev.get("Properties") or {}
            batch = props.get("streaming.sql.batchId")
            job = Job(id=ev["Job ID"], query=props.get("sql.streaming.queryId"),
                      batch=int(batch) if batch is not None else None,
                      description=props.get("spark.job.description")
                      or props.get("callSite.short", ""),
                      submitted=ev.get("Submission Time", 0),
                      stages=list(ev.get("Stage IDs", ())))
            jobs[job.id] = job
            for s in job.stages:
                stage_job[s] = job.id
        elif kind == "SparkListenerJobEnd":
            if ev["Job ID"] in jobs:
                jobs[ev["Job ID"]].completed = ev.get("Completion Time", 0)
        elif kind == "SparkListenerTaskEnd":
            job = jobs.get(stage_job.get(ev.get("Stage ID", -1), -1))
            if job is None:
                continue
            job.tasks += 1
            tm = ev.get("Task Metrics") or {}
            for src, dst in TASK_METRICS.items():
                v = _number(tm.get(src))
                if v is not None:
                    job.metrics[dst] += v / 1e6 if src == "Executor CPU Time" else v
            for a in (ev.get("Task Info") or {}).get("Accumulables", ()):
                name = accs.get(int(a.get("ID", -1)))
                v = _number(a.get("Update"))
                if name is not None and v is not None:
                    job.sql[name] += v
    return sorted(jobs.values(), key=lambda j: j.id)


@dataclass
class Batch:
    query: str | None
    batch: int | None
    jobs: int = 0
    stages: int = 0
    tasks: int = 0
    wall_ms: int = 0  # from the first job's submission to the last job's end
    metrics: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    sql: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def per_batch(jobs: list[Job]) -> list[Batch]:
    """The jobs added up per (query, micro-batch), in the order the batches began; jobs
    outside any micro-batch (a batch query, a driver's own) are one entry (None, None)."""
    out: dict[tuple[str | None, int | None], Batch] = {}
    spans: dict[tuple[str | None, int | None], list[int]] = {}
    for j in jobs:
        key = (j.query, j.batch)
        b = out.setdefault(key, Batch(query=j.query, batch=j.batch))
        b.jobs += 1
        b.stages += len(j.stages)
        b.tasks += j.tasks
        for k, v in j.metrics.items():
            b.metrics[k] += v
        for k, v in j.sql.items():
            b.sql[k] += v
        span = spans.setdefault(key, [j.submitted, j.completed])
        span[0], span[1] = min(span[0], j.submitted), max(span[1], j.completed)
    for key, b in out.items():
        b.wall_ms = max(0, spans[key][1] - spans[key][0])
    return list(out.values())


#: what a driver needs in THESEUS_SPARK_CONF for :func:`read` (``spark.eventLog.dir`` apart)
SPARK_CONF = ("spark.eventLog.enabled=true;spark.eventLog.compress=false;"
              "spark.eventLog.rolling.enabled=false")


def latest(folder: str | Path) -> Path:
    """The newest event log in ``folder`` (a driver writes one per application: a file, or
    a folder when the log rolls)."""
    files = list(Path(folder).iterdir())
    if not files:
        raise FileNotFoundError(f"no event log in {folder}")
    return max(files, key=lambda p: p.stat().st_mtime)
