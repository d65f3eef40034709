"""Theseus on a Spark standalone cluster (master + two one-core workers, each with its own
working directory and a clean environment) and a three-broker Kafka cluster, against the
exact-output oracle; faults injected while queries run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.integration.conftest import KafkaHelper
from tests.integration.test_migration import input_records, oracle, plan, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cluster]


def count_plan(query: str, src: str, out: str) -> dict:
    return {
        "format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
        "nodes": [
            {"id": "events", "step": "source", "version": 1, "topic": src, "partitions": 3,
             "format": "json", "role": "stream",
             "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]},
            {"id": "agg", "step": "aggregate", "version": 1, "inputs": ["events"],
             "group_by": [{"name": "k", "expr": "k"}],
             "aggregates": [{"name": "n", "function": "count", "args": ["*"]},
                            {"name": "s", "function": "sum", "args": ["x"]}]},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["agg"], "topic": out,
             "format": "json", "key_columns": ["k"], "mode": "update",
             "delivery": "exactly_once"}]}


def driver_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THESEUS_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def theseus(*args, cwd: Path, env: dict | None = None, timeout: float = 600):
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "migrate.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, env=env or driver_env(),
                          timeout=timeout)


def spawn(*args, cwd: Path, log: Path, env: dict | None = None) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "migrate.cli", *map(str, args)], cwd=cwd,
                            env=env or driver_env(), stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def replicas(k: KafkaHelper, topic: str) -> set[int]:
    md = k.admin.list_topics(topic, timeout=30).topics[topic]
    return {len(p.replicas) for p in md.partitions.values()}


def check_counts(k: KafkaHelper, src: str, out: str) -> None:
    """Update-mode counts: per key, the values written are increasing (no batch written
    twice), and the last one is the count and the sum over the whole input."""
    want_n: Counter = Counter()
    want_s: Counter = Counter()
    for r in input_records(k, src):
        v = r.json()
        want_n[v["k"]] += 1
        want_s[v["k"]] += v["x"]
    seen = defaultdict(list)
    for r in k.read_all(out):
        v = r.json()
        seen[v["k"]].append((v["n"], v["s"]))
    assert set(seen) == set(want_n)
    for key, vals in seen.items():
        ns = [n for n, _ in vals]
        assert ns == sorted(set(ns)), f"key {key}: a count written twice or going back {ns}"
        assert vals[-1] == (want_n[key], want_s[key]), key


def test_run_on_the_cluster_with_the_kafka_store_is_exact(kafka3, spark_cluster, tmp_path):
    k = KafkaHelper(kafka3.bootstrap, replication=-1)
    src, out = k.topic("cl-in", 3), k.topic("cl-out", 2)
    assert replicas(k, src) == {3}
    rows = [{"k": f"k{i % 17}", "x": i} for i in range(3000)]
    k.produce(src, rows, keys=[r["k"] for r in rows])
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(count_plan("clrun", src, out)))
    store_topic = f"it-store-{uuid.uuid4().hex[:8]}"
    state = f"kafka://{kafka3.bootstrap.split(',')[0]}/{store_topic}"
    t0 = time.monotonic()
    r = theseus("run", p, "--bootstrap", kafka3.bootstrap, "--state", state,
                "--master", spark_cluster.master, "--available-now", cwd=tmp_path / "driver")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    check_counts(k, src, out)
    # the store topic follows the cluster's replication factor
    assert replicas(k, store_topic) == {3}
    # the executors ran this checkout's code, shipped with the job (not the workers' path)
    shipped = list(spark_cluster.state.glob("worker*/work/app-*/*/theseus-code-*.zip"))
    assert shipped, "no executor received the shipped code"
    print(f"cluster run: 3000 rows in {took:.1f} s (including Spark start-up)")


class Feeder(threading.Thread):
    """{"id": i, "v": "x<i>"} into 3 partitions at a steady rate (acks=all: survives the
    loss of one broker of three)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                           "acks": "all"})
        self.topic, self.n, self.halt = topic, 0, threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(4):
                self.p.produce(self.topic, json.dumps({"id": self.n, "v": f"x{self.n}"}),
                               partition=self.n % 3)
                self.n += 1
            self.p.poll(0)
            time.sleep(0.1)
        assert self.p.flush(60) == 0

    def stop(self) -> None:
        self.halt.set()
        self.join(90)


def test_worker_killed_at_steady_state_output_stays_exact(kafka3, spark_cluster, tmp_path):
    """Fault 3: a worker SIGKILLed while the query runs; Spark reschedules its tasks on the
    other worker; the worker comes back after 10 s.  Nothing lost, nothing twice."""
    k = KafkaHelper(kafka3.bootstrap, replication=-1)
    src, out = k.topic("w-in", 3), k.topic("w-out", 1)
    query = f"wk{uuid.uuid4().hex[:6]}"
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan(query, src, out, "old", False)))
    state = tmp_path / "state"
    feeder = Feeder(kafka3.bootstrap, src)
    feeder.start()
    host = spawn("run", p, "--bootstrap", kafka3.bootstrap, "--state", state,
                 "--master", spark_cluster.master, cwd=tmp_path / "host",
                 log=tmp_path / "host.log")
    try:
        from migrate.store import DirectoryStore

        store = DirectoryStore(state)
        wait_for(lambda: store.status(query).get("status") == "running", 240, "query up")
        wait_for(lambda: k.end_offsets(out, settle=0)[0] > 100, 120, "steady output")
        spark_cluster.kill(1)
        time.sleep(10)
        spark_cluster.restart(1)
        time.sleep(10)
        feeder.stop()
        from gates.state import is_acked

        high = {src: k.end_offsets(src)}
        wait_for(lambda: is_acked(state, query, high), 240, "the query drains the input")
        assert host.poll() is None, (tmp_path / "host.log").read_text()[-3000:]
        r = theseus("stop", query, "--state", state, cwd=tmp_path / "host")
        assert r.returncode == 0, r.stderr
        host.wait(120)
    finally:
        feeder.stop()
        if host.poll() is None:
            host.kill()
    got = Counter(json.dumps(r.json(), sort_keys=True) for r in k.read_all(out))
    want = oracle(input_records(k, src), {"0": 1 << 62, "1": 1 << 62, "2": 1 << 62})
    assert sum(want.values()) > 300
    assert got == want, (f"missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")
