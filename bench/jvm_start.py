"""Benchmark: wall time and CPU time of ``theseus run --available-now`` on a small plan (a
fresh driver JVM each time, as the integration tests spawn them): with Spark's defaults, with
the driver JVM options the tests pass (``tests/integration/conftest.py``:
``TEST_DRIVER_JAVA_OPTIONS``), and with those options and the class-data-sharing archive of
the driver's classes (``tests/integration/jvm_archive.py``; made here if not cached). CPU
time counts: the tests run up to six drivers at once on two cores.

``BENCH_JVM_ROUNDS`` rounds (3 by default), the two variants alternating so that a change of
load on the machine hits both.  Results: bench/results/jvm_start.json
(each variant's wall seconds and CPU seconds of the process and its children).

Run: ``make bench-jvm`` (starts the local broker if KAFKA_BOOTSTRAP is not set).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ROUNDS = int(os.environ.get("BENCH_JVM_ROUNDS", "3"))
RECORDS = 2000
PR_SET_CHILD_SUBREAPER = 36


def plan(query: str, src: str, out: str) -> dict:
    return {
        "format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
        "nodes": [
            {"id": "events", "step": "source", "version": 1, "topic": src, "partitions": 3,
             "format": "json", "role": "stream",
             "schema": [{"name": "id", "type": "bigint"}, {"name": "v", "type": "string"}]},
            {"id": "shape", "step": "project", "version": 1, "inputs": ["events"],
             "columns": [{"name": "id", "expr": "id"}, {"name": "v", "expr": "upper(v)"}]},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["shape"], "topic": out,
             "format": "json", "key_columns": [], "mode": "append",
             "delivery": "exactly_once"}]}


def main() -> int:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from bench.run_speed import bootstrap
    from tests.integration import jvm_archive
    from tests.integration.conftest import TEST_DRIVER_JAVA_OPTIONS

    # the JVM outlives its Python parent: reparented to this process (a subreaper), its
    # CPU time is counted when it is reaped
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    bs = bootstrap()
    archive = jvm_archive.archive_path()
    if not archive.exists():
        why = jvm_archive.make_archive(bs, TEST_DRIVER_JAVA_OPTIONS, archive,
                                       Path(tempfile.mkdtemp(prefix="theseus-bench-cds-")))
        if why:
            print(f"no archive: {why}", file=sys.stderr)
            return 1
    tag = uuid.uuid4().hex[:8]
    src, out = f"bench-jvm-in-{tag}", f"bench-jvm-out-{tag}"
    admin = AdminClient({"bootstrap.servers": bs})
    for t in (src, out):
        admin.create_topics([NewTopic(t, 3, 1)])[t].result(30)
    p = Producer({"bootstrap.servers": bs})
    for i in range(RECORDS):
        p.produce(src, json.dumps({"id": i, "v": f"x{i}"}).encode(), partition=i % 3)
    p.flush(30)
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-jvm-"))
    variants = {"default": "", "test_options": TEST_DRIVER_JAVA_OPTIONS,
                "test_options_archive":
                    f"{TEST_DRIVER_JAVA_OPTIONS} -XX:SharedArchiveFile={archive}"}
    secs: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for rnd in range(ROUNDS):
        for name, opts in variants.items():
            query = f"jvm_{name}_{rnd}_{tag}"
            path = tmp / f"{query}.json"
            path.write_text(json.dumps(plan(query, src, out)))
            env = dict(os.environ)
            env.pop("THESEUS_SPARK_CONF", None)
            if opts:
                env["THESEUS_SPARK_CONF"] = f"spark.driver.extraJavaOptions={opts}"
            t0 = time.perf_counter()
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            r = subprocess.run([sys.executable, "-m", "migrate.cli", "run", str(path),
                                "--bootstrap", bs, "--state", str(tmp / query),
                                "--available-now"], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=600)
            dt = time.perf_counter() - t0
            while True:  # the driver JVM, orphaned when its Python parent exits, is ours
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    break
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
            if r.returncode != 0:
                print(f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}", file=sys.stderr)
                return 1
            secs[name].append(round(dt, 2))
            cpu[name].append(round(used, 2))
            print(f"round {rnd} {name}: {dt:.1f}s, {used:.1f} CPU s", flush=True)
    result = {"records": RECORDS, "rounds": ROUNDS, "test_options": TEST_DRIVER_JAVA_OPTIONS,
              "archive_bytes": archive.stat().st_size,
              "seconds": secs, "cpu_seconds": cpu,
              "median_seconds": {k: round(statistics.median(v), 2) for k, v in secs.items()},
              "median_cpu_seconds": {k: round(statistics.median(v), 2)
                                     for k, v in cpu.items()}}
    dest = ROOT / "bench" / "results" / "jvm_start.json"
    dest.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median_seconds"]), json.dumps(result["median_cpu_seconds"]),
          f"wrote {dest.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
