"""``scripts/kafka.sh`` and ``scripts/spark_cluster.sh`` never forget a process they could not
stop, and never stop one that is not theirs.

No JVM here: a node is a sleeping Python process whose command line is the one the script
launches (``kafka.Kafka <properties>``; a Spark daemon's class, log configuration and work
directory), in a state directory of its own. The real restarts are in
tests/integration/test_services_again.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

NOBODY = 65534


@pytest.fixture
def state():
    # world-writable, outside pytest's own 0700 temporary root: the "another user" case runs
    # the script as nobody
    d = Path(tempfile.mkdtemp(prefix="theseus-svc-"))
    d.chmod(0o777)
    procs: list[subprocess.Popen] = []
    yield d, procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(d, ignore_errors=True)


def _fake(procs: list, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *args],
                         start_new_session=True)
    procs.append(p)
    time.sleep(0.2)  # its command line is in /proc once exec has happened
    return p


def _gone(p: subprocess.Popen, timeout: float = 10) -> bool:
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def _sh(script: str, *args: str, env: dict, user: int | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / script), *args], cwd=cwd or ROOT,
                          env={**os.environ, "KAFKA_BOOTSTRAP": "", **env},
                          capture_output=True, text=True, timeout=120,
                          **({"user": user, "group": user, "extra_groups": []}
                             if user is not None else {}))


def _kafka_node(d: Path, procs: list, i: int, pidfile: bool = True) -> subprocess.Popen:
    node = d / f"node{i}"
    node.mkdir(mode=0o777, exist_ok=True)
    props = node / "server.properties"
    props.write_text(f"node.id={i}\n")
    p = _fake(procs, "kafka.Kafka", str(props))
    if pidfile:
        (node / "kafka.pid").write_text(f"{p.pid}\n")
        (node / "kafka.pid").chmod(0o666)
    return p


def _kenv(d: Path) -> dict:
    return {"BROKERS": "3", "KAFKA_STATE": str(d), "KAFKA_STOP_TIMEOUT": "1"}


as_root_only = pytest.mark.skipif(os.geteuid() != 0,
                                  reason="running the script as another user needs root")


@as_root_only
def test_kafka_stop_keeps_the_pid_file_of_a_node_it_could_not_stop(state):
    d, procs = state
    n1, n2 = _kafka_node(d, procs, 1), _kafka_node(d, procs, 2)
    r = _sh("kafka.sh", "stop", env=_kenv(d), user=NOBODY)
    assert r.returncode == 1, r.stderr
    assert f"node 1 (pid {n1.pid}) did not stop" in r.stderr
    assert f"node 2 (pid {n2.pid}) did not stop" in r.stderr
    assert "could not stop node(s) 1 2" in r.stderr
    assert (d / "node1" / "kafka.pid").read_text().strip() == str(n1.pid)
    assert (d / "node2" / "kafka.pid").read_text().strip() == str(n2.pid)
    assert n1.poll() is None and n2.poll() is None
    # its owner can: then the pid files go with the processes
    r = _sh("kafka.sh", "stop", env=_kenv(d))
    assert r.returncode == 0, r.stderr
    assert _gone(n1) and _gone(n2)
    assert not list(d.glob("node*/kafka.pid"))


def test_kafka_stop_kills_a_node_that_ignores_sigterm(state):
    d, procs = state
    n1 = _kafka_node(d, procs, 1)
    os.kill(n1.pid, signal.SIGSTOP)  # SIGTERM stays pending; SIGKILL still ends it
    t0 = time.monotonic()
    r = _sh("kafka.sh", "stop", env=_kenv(d))
    assert r.returncode == 0, r.stderr
    assert "ignored SIGTERM for 1s; sending SIGKILL" in r.stderr
    assert _gone(n1, timeout=5) and n1.returncode == -signal.SIGKILL
    assert not (d / "node1" / "kafka.pid").exists()
    assert time.monotonic() - t0 < 30


def test_kafka_finds_a_node_that_lost_its_pid_file_and_leaves_other_processes_alone(state):
    d, procs = state
    orphan = _kafka_node(d, procs, 2, pidfile=False)
    other = _fake(procs, "kafka.Kafka", str(d / "elsewhere" / "server.properties"))
    (d / "node1").mkdir()
    (d / "node1" / "kafka.pid").write_text(f"{other.pid}\n")  # a pid reused by another node
    r = _sh("kafka.sh", "pid", "2", env=_kenv(d))
    assert r.stdout.strip() == str(orphan.pid), r.stderr
    assert "runs as pid" in r.stderr and "without its pid file" in r.stderr
    assert (d / "node2" / "kafka.pid").read_text().strip() == str(orphan.pid)
    r = _sh("kafka.sh", "stop", env=_kenv(d))
    assert r.returncode == 0, r.stderr
    assert _gone(orphan)
    assert other.poll() is None  # not this cluster's node 1: never signalled
    assert not (d / "node1" / "kafka.pid").exists()


def test_kafka_start_refuses_to_bring_back_a_node_whose_port_is_taken(state):
    """A node is down while another runs: start uses the down node's own port or nothing."""
    d, procs = state
    _kafka_node(d, procs, 2)
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        for i in (1, 2, 3):
            node = d / f"node{i}"
            node.mkdir(exist_ok=True)
            (node / "data").mkdir(exist_ok=True)
            (node / "data" / "meta.properties").write_text("cluster.id=x\n")
            p = port if i == 1 else port + 10 * i
            text = (f"listeners=PLAINTEXT://127.0.0.1:{p},CONTROLLER://127.0.0.1:{p + 1}\n"
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{p}\n")
            (node / "server.properties").write_text(text)
        before = {i: (d / f"node{i}" / "server.properties").read_text() for i in (1, 2, 3)}
        r = _sh("kafka.sh", "start", env=_kenv(d))
    finally:
        taken.close()
    assert r.returncode == 1, r.stderr
    assert f"node 1 is down but its port {port}" in r.stderr
    assert "restart 1" in r.stderr
    assert {i: (d / f"node{i}" / "server.properties").read_text() for i in (1, 2, 3)} == before


def _spark_daemon(d: Path, procs: list, name: str, pidfile: bool = True) -> subprocess.Popen:
    cls = "org.apache.spark.deploy.master.Master" if name == "master" else \
        "org.apache.spark.deploy.worker.Worker"
    p = _fake(procs, f"-Dlog4j2.configurationFile={d}/log4j2.properties", cls,
              "--work-dir", str(d / name / "work"))
    if pidfile:
        (d / f"{name}.pid").write_text(f"{p.pid}\n")
        (d / f"{name}.pid").chmod(0o666)
    return p


@as_root_only
def test_spark_stop_keeps_the_pid_file_of_a_daemon_it_could_not_stop(state):
    d, procs = state
    master = _spark_daemon(d, procs, "master")
    w1 = _spark_daemon(d, procs, "worker1", pidfile=False)  # lost its pid file
    env = {"SPARK_CLUSTER_STATE": str(d), "SPARK_STOP_TIMEOUT": "1"}
    r = _sh("spark_cluster.sh", "stop", env=env, user=NOBODY)
    assert r.returncode == 1, r.stderr
    assert f"master (pid {master.pid}) did not stop" in r.stderr
    assert f"worker1 (pid {w1.pid}) did not stop" in r.stderr
    assert (d / "master.pid").read_text().strip() == str(master.pid)
    assert (d / "worker1.pid").read_text().strip() == str(w1.pid)
    r = _sh("spark_cluster.sh", "stop", env=env)
    assert r.returncode == 0, r.stderr
    assert _gone(master) and _gone(w1)
    assert not list(d.glob("*.pid"))


def test_spark_stop_kills_a_daemon_that_ignores_sigterm_and_spares_another_clusters(state):
    d, procs = state
    w2 = _spark_daemon(d, procs, "worker2")
    os.kill(w2.pid, signal.SIGSTOP)
    other = _fake(procs, f"-Dlog4j2.configurationFile={d}-other/log4j2.properties",
                  "org.apache.spark.deploy.worker.Worker", "--work-dir", f"{d}/worker1/work")
    (d / "worker1.pid").write_text(f"{other.pid}\n")
    r = _sh("spark_cluster.sh", "stop", env={"SPARK_CLUSTER_STATE": str(d),
                                              "SPARK_STOP_TIMEOUT": "1"})
    assert r.returncode == 0, r.stderr
    assert _gone(w2, timeout=5)
    assert other.poll() is None
    assert not list(d.glob("*.pid"))
