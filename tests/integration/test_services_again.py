"""``make kafka BROKERS=3``, ``make cluster`` and ``make registry`` run again with a node
killed (issue 29, 6.).

Quick enough for ``make test`` (measured on the 2-core machine under load: the brokers' test
44 s, the Spark cluster's 9 s), so here rather than in tests/cluster.

Each service is started here on ports and state of its own (brokers on 29130-29132 with
controllers on 29140-29142, a Spark master on 27090), never the shared broker on 19092 nor
the other cluster tests' 29092+ and 27077. A node is SIGKILLed as a crash would, leaving its
stale pid file, and ``start`` is run again: it must bring back that node alone, on its own
data, properties and ports, and leave the live ones as they were.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import ROOT, bootstrap_of, kafka_sh

# JVMs of their own, like a Spark driver in a subprocess: run before the in-process session
pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]


def _dead(pid: int, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if "\tZ" in Path(f"/proc/{pid}/status").read_text():
                return True  # killed, not yet reaped
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kafka_start_again_with_node_1_killed_brings_back_node_1_alone_on_its_data(tmp_path):
    from tests.integration.conftest import KafkaHelper

    state = tmp_path / "kafka-3"
    env = {"BROKERS": "3", "KAFKA_PORT": "29130", "KAFKA_CONTROLLER_PORT": "29140",
           "KAFKA_STATE": str(state)}
    times = {}
    t = time.monotonic()
    bootstrap = bootstrap_of(kafka_sh(["start"], env))
    times["start"] = time.monotonic() - t
    try:
        assert bootstrap == "127.0.0.1:29130,127.0.0.1:29131,127.0.0.1:29132"
        pids = {i: int(kafka_sh(["pid", str(i)], env)) for i in (1, 2, 3)}
        props = {i: (state / f"node{i}" / "server.properties").read_bytes() for i in (1, 2, 3)}
        meta = (state / "node1" / "data" / "meta.properties").read_bytes()
        kafka = KafkaHelper(bootstrap, replication=3)
        topic = kafka.topic("again", 3)
        kafka.produce(topic, [{"i": i} for i in range(300)])

        os.kill(pids[1], signal.SIGKILL)
        assert _dead(pids[1])
        assert (state / "node1" / "kafka.pid").exists()  # stale, as a crash leaves it

        t = time.monotonic()
        again = kafka_sh(["start"], env)
        times["start again"] = time.monotonic() - t
        assert bootstrap_of(again) == bootstrap  # the same ports
        now = {i: int(kafka_sh(["pid", str(i)], env)) for i in (1, 2, 3)}
        assert now[2] == pids[2] and now[3] == pids[3]  # the live nodes left alone
        assert now[1] != pids[1] and _alive(now[1])
        assert {i: (state / f"node{i}" / "server.properties").read_bytes()
                for i in (1, 2, 3)} == props  # nothing rewritten
        assert (state / "node1" / "data" / "meta.properties").read_bytes() == meta  # no format
        assert sorted(p.name for p in (state / "node1" / "data").glob(f"{topic}-*")) == \
            [f"{topic}-{p}" for p in range(3)]  # node 1 is back on its data

        # node 1 catches up on its replicas, and serves the records through its own port
        deadline = time.monotonic() + 90
        while True:
            md = kafka.admin.list_topics(topic, timeout=30).topics[topic]
            if all(1 in p.isrs for p in md.partitions.values()):
                break
            assert time.monotonic() < deadline, "node 1 did not rejoin the ISR"
            time.sleep(0.5)
        alone = KafkaHelper("127.0.0.1:29130")
        got = sorted(r.json()["i"] for r in alone.read_all(topic))
        assert got == list(range(300))

        # the cluster is whole again: a third start changes nothing
        assert bootstrap_of(kafka_sh(["start"], env)) == bootstrap
        assert {i: int(kafka_sh(["pid", str(i)], env)) for i in (1, 2, 3)} == now
    finally:
        gc.collect()  # the helpers' producers would log connection errors once it stops
        t = time.monotonic()
        kafka_sh(["stop"], env)
        times["stop"] = time.monotonic() - t
        print("\ntimes: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    assert not list(state.glob("node*/kafka.pid"))


def _spark(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "spark_cluster.sh"), *args],
                          cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_spark_cluster_start_again_with_a_worker_killed_brings_back_that_worker(tmp_path):
    state = tmp_path / "spark-cluster"
    env = {"SPARK_CLUSTER_STATE": str(state), "SPARK_MASTER_PORT": "27090", "WORKERS": "2",
           "PYTHON": sys.executable}
    times = {}
    t = time.monotonic()
    out = _ok(_spark(["start"], env))
    times["start"] = time.monotonic() - t
    try:
        assert out.strip().splitlines()[-1] == "SPARK_MASTER=spark://127.0.0.1:27090"
        pids = {n: int(_ok(_spark(["pid", n], env))) for n in ("master", "1", "2")}
        os.kill(pids["2"], signal.SIGKILL)
        assert _dead(pids["2"])

        t = time.monotonic()
        r = _spark(["start"], env)
        times["start again"] = time.monotonic() - t
        assert _ok(r).strip().splitlines()[-1] == "SPARK_MASTER=spark://127.0.0.1:27090"
        assert "worker(s) 2 were down: started again" in r.stderr
        now = {n: int(_ok(_spark(["pid", n], env))) for n in ("master", "1", "2")}
        assert now["master"] == pids["master"] and now["1"] == pids["1"]
        assert now["2"] != pids["2"] and _alive(now["2"])
        assert "Successfully registered with master" in (state / "worker2.log").read_text()
        # with the port asked for changed, it refuses rather than start a second master
        r = _spark(["start"], {**env, "SPARK_MASTER_PORT": "27091"})
        assert r.returncode == 1 and "master port is 27090" in r.stderr, r.stderr
    finally:
        t = time.monotonic()
        r = _spark(["stop"], env)
        times["stop"] = time.monotonic() - t
        print("\ntimes: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    assert r.returncode == 0, r.stderr
    assert not list(state.glob("*.pid"))


def _registry(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "registry.sh"), *args], cwd=ROOT,
                          env={**os.environ, "SCHEMA_REGISTRY_URL": "", **env},
                          capture_output=True, text=True, timeout=400)


def test_registry_start_again_after_a_kill_comes_back_on_its_port(tmp_path):
    """``make registry`` run again after its JVM was SIGKILLed: the stale pid file is not
    taken for a live registry, a new one answers on the same port, and ``stop`` ends it.
    Run again while it runs, ``start`` reuses it (same pid, no second JVM).  On a state
    directory and port of its own (18091), never the shared registry on 18081."""
    import urllib.request

    state = tmp_path / "registry"
    env = {"REGISTRY_STATE": str(state), "REGISTRY_PORT": "18091"}
    url = "http://127.0.0.1:18091/apis/ccompat/v7"

    def pid() -> int:
        return int((state / "registry.pid").read_text().strip())

    try:
        assert _ok(_registry(["start"], env)).strip().splitlines()[-1] == \
            f"SCHEMA_REGISTRY_URL={url}"
        first = pid()
        again = _registry(["start"], env)
        assert _ok(again).strip().splitlines()[-1] == f"SCHEMA_REGISTRY_URL={url}"
        assert "reusing the running registry" in again.stderr and pid() == first
        os.kill(first, signal.SIGKILL)
        assert _dead(first)
        # the pid file still names the dead JVM: status says stopped and forgets it
        r = _registry(["status"], env)
        assert r.returncode == 3 and not (state / "registry.pid").exists(), r.stdout
        r = _registry(["start"], env)
        assert _ok(r).strip().splitlines()[-1] == f"SCHEMA_REGISTRY_URL={url}"
        second = pid()
        assert second != first and _alive(second)
        with urllib.request.urlopen(f"{url}/subjects", timeout=10) as resp:
            assert resp.status == 200
    finally:
        r = _registry(["stop"], env)
    assert r.returncode == 0, r.stderr
    assert not (state / "registry.pid").exists()
