"""Fixtures of the cluster tests (``make test-cluster``): brokers and Spark started here.

* ``secure_kafka`` (session): one KRaft broker whose client listener is SASL_PLAINTEXT with
  SCRAM-SHA-512 users and the StandardAuthorizer (``scripts/kafka.sh`` with
  ``KAFKA_SASL_USERS``), on ports 29095/29105, state in ``.cache/kafka-sasl``.  Users:
  ``admin`` (super user), ``alice`` (everything on topics, groups and transactional ids),
  ``bob`` (reads topics, writes none), ``carol`` (reads every topic, writes only topics
  whose name starts with ``it-sec-out``), ``dave`` (reads every topic, writes only topics
  whose name starts with ``it-sec-in``: the sources, where control events go, not the
  outputs).  Each has a librdkafka properties file.
  Stopped at the end of the session.

These tests use ports and state of their own: never the shared broker on 19092.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = ROOT / "scripts" / "kafka.sh"
PASSWORDS = {u: f"{u}-{uuid.uuid4().hex[:12]}-pw" for u in ("admin", "alice", "bob", "carol",
                                                           "dave")}


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: starts brokers or a Spark cluster of its own")
    config.addinivalue_line("markers", "own_jvm: runs a Spark driver in a subprocess")
    config.addinivalue_line("markers", "cluster_ci: the small subset of `make test-cluster` "
                            "that `make test-cluster-ci` runs (a CI candidate)")


def kafka_sh(args: list[str], env: dict, timeout: float = 300) -> str:
    # never the broker of $KAFKA_BOOTSTRAP (kafka.sh would use it): these are our own
    r = subprocess.run(["bash", str(KAFKA_SH), *args], cwd=ROOT,
                       env={**os.environ, "KAFKA_BOOTSTRAP": "", **env},
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"kafka.sh {' '.join(args)} failed: {r.stderr[-3000:]}")
    return r.stdout


def bootstrap_of(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("KAFKA_BOOTSTRAP=")]
    assert lines, stdout
    return lines[-1].split("=", 1)[1].strip()


def _acls(admin, bindings) -> None:
    futs = admin.create_acls(bindings, request_timeout=30)
    for f in futs.values():
        f.result(timeout=30)


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory):
    env = {"KAFKA_STATE": str(ROOT / ".cache" / "kafka-sasl"), "KAFKA_PORT": "29095",
           "KAFKA_CONTROLLER_PORT": "29105", "BROKERS": "1",
           "KAFKA_SASL_USERS": ",".join(f"{u}={p}" for u, p in PASSWORDS.items())}
    kafka_sh(["reset"], env)  # fresh SCRAM users (new passwords) every session
    bootstrap = bootstrap_of(kafka_sh(["start"], env))
    try:
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            AdminClient,
            ResourcePatternType,
            ResourceType,
        )

        def conf(user: str) -> dict:
            return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
                    "sasl.password": PASSWORDS[user]}

        admin = AdminClient(conf("admin"))

        def allow(user, rtype, name, op, pattern=ResourcePatternType.LITERAL):
            return AclBinding(rtype, name, pattern, f"User:{user}", "*", op,
                              AclPermissionType.ALLOW)

        T, G, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
        A, R, W, D = AclOperation.ALL, AclOperation.READ, AclOperation.WRITE, \
            AclOperation.DESCRIBE
        bindings = [allow("alice", T, "*", A), allow("alice", G, "*", A),
                    allow("alice", X, "*", A)]
        for u in ("bob", "carol", "dave"):
            bindings += [allow(u, T, "*", R), allow(u, T, "*", D), allow(u, G, "*", A),
                         allow(u, X, "*", A)]
        bindings.append(allow("carol", T, "it-sec-out", W, ResourcePatternType.PREFIXED))
        bindings.append(allow("dave", T, "it-sec-in", W, ResourcePatternType.PREFIXED))
        _acls(admin, bindings)
        secrets = tmp_path_factory.mktemp("secrets")
        files = {}
        for u in PASSWORDS:
            f = secrets / f"{u}.properties"
            f.write_text("\n".join(f"{k}={v}" for k, v in conf(u).items()
                                   if k != "bootstrap.servers") + "\n")
            files[u] = f
        from gates import kafkaconf
        from gates.broker import wait_coordinators

        kafkaconf.use(files["admin"])
        try:
            wait_coordinators(bootstrap)
        finally:
            kafkaconf.use(None)
        yield SimpleNamespace(bootstrap=bootstrap, conf=conf, files=files,
                              passwords=PASSWORDS, admin=admin)
    finally:
        kafka_sh(["stop"], env)


@pytest.fixture(scope="session")
def kafka3():
    """A three-node KRaft cluster (RF 3, min.insync.replicas 2) on 29092-29094, state in
    .cache/kafka-3; ``.kill(i)`` / ``.restart(i)`` SIGKILL and restart node i."""
    env = {"BROKERS": "3", "KAFKA_PORT": "29092", "KAFKA_CONTROLLER_PORT": "29100",
           "KAFKA_STATE": str(ROOT / ".cache" / "kafka-3")}
    kafka_sh(["stop"], env)
    bootstrap = bootstrap_of(kafka_sh(["start"], env))
    from gates.broker import wait_coordinators

    wait_coordinators(bootstrap)
    ns = SimpleNamespace(bootstrap=bootstrap,
                         kill=lambda i: kafka_sh(["kill", str(i)], env),
                         restart=lambda i: kafka_sh(["restart", str(i)], env))
    try:
        yield ns
    finally:
        kafka_sh(["stop"], env)


def spark_cluster_sh(args: list[str], timeout: float = 300) -> str:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "spark_cluster.sh"), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"spark_cluster.sh {' '.join(args)} failed: {r.stderr[-3000:]}")
    return r.stdout


@pytest.fixture(scope="session")
def spark_cluster():
    """Master + two workers (one core each, their own working directories and a clean
    environment) on spark://127.0.0.1:27077; ``.kill(i)``/``.restart(i)`` a worker."""
    spark_cluster_sh(["stop"])
    out = spark_cluster_sh(["start"])
    master = [ln for ln in out.splitlines() if ln.startswith("SPARK_MASTER=")][-1]
    ns = SimpleNamespace(master=master.split("=", 1)[1],
                         state=ROOT / ".cache" / "spark-cluster",
                         kill=lambda i: spark_cluster_sh(["kill", str(i)]),
                         restart=lambda i: spark_cluster_sh(["restart", str(i)]))
    try:
        yield ns
    finally:
        spark_cluster_sh(["stop"])
