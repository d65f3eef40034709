"""Benchmark: wall time of ``theseus run --available-now`` on a small plan (a fresh driver
JVM each time, as the integration tests spawn them), with and without the driver JVM
options the tests pass (``tests/integration/conftest.py``: ``TEST_DRIVER_JAVA_OPTIONS``).

``BENCH_JVM_ROUNDS`` rounds (3 by default), the two variants alternating so that a change of
load on the machine hits both.  Results: bench/results/jvm_start.json.

Run: ``make bench-jvm`` (starts the local broker if KAFKA_BOOTSTRAP is not set).
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
ROUNDS = int(os.environ.get("BENCH_JVM_ROUNDS", "3"))
RECORDS = 2000


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
    from tests.integration.conftest import TEST_DRIVER_JAVA_OPTIONS

    bs = bootstrap()
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
    variants = {"default": "", "test_options": TEST_DRIVER_JAVA_OPTIONS}
    secs: dict[str, list[float]] = {v: [] for v in variants}
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
            r = subprocess.run([sys.executable, "-m", "migrate.cli", "run", str(path),
                                "--bootstrap", bs, "--state", str(tmp / query),
                                "--available-now"], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=600)
            dt = time.perf_counter() - t0
            if r.returncode != 0:
                print(f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}", file=sys.stderr)
                return 1
            secs[name].append(round(dt, 2))
            print(f"round {rnd} {name}: {dt:.1f}s", flush=True)
    result = {"records": RECORDS, "rounds": ROUNDS, "test_options": TEST_DRIVER_JAVA_OPTIONS,
              "seconds": secs,
              "median_seconds": {k: round(statistics.median(v), 2) for k, v in secs.items()}}
    dest = ROOT / "bench" / "results" / "jvm_start.json"
    dest.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median_seconds"]), f"wrote {dest.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
