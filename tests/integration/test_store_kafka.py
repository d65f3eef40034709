"""The store on a compacted Kafka topic: two "hosts" (separate local mirror directories, no
shared files) see each other's writes through the broker only."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration]


def host(tmp_path: Path, name: str, spec: str, monkeypatch):
    from migrate.store import KafkaStore

    monkeypatch.setenv("THESEUS_LOCAL_DIR", str(tmp_path / name))
    return KafkaStore(spec)


def eventually(cond, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_two_hosts_share_the_store_through_kafka(kafka, tmp_path, monkeypatch):
    from gates.state import GateState, is_acked, read_gate, write_ack, write_gate

    spec = f"kafka://{kafka.bootstrap}/theseus-store-{uuid.uuid4().hex[:8]}"
    a = host(tmp_path, "a", spec, monkeypatch)
    assert a.root != host(tmp_path, "probe", spec, monkeypatch).root
    a.put_plan("q", '{"query": "q"}')
    a.set_status("q", status="running", pid=123)
    a.request_stop("q")
    write_gate(a.root, "q", GateState("capped", {"t": {0: 5, 1: 7}}, 3))
    write_ack(a.root, "q", "t", {0: 5, 1: 7}, GateState("capped", {"t": {0: 5, 1: 7}}, 3))
    a.flush()
    (a.root / "checkpoints" / "q" / "0").mkdir(parents=True)
    (a.root / "checkpoints" / "q" / "0" / "offsets").write_text("local only")

    # a second host, opened later: it loads everything before returning
    b = host(tmp_path, "b", spec, monkeypatch)
    assert b.plan_path("q").read_text() == '{"query": "q"}'
    assert b.status("q")["status"] == "running"
    assert b.stop_requested("q")
    assert read_gate(b.root, "q") == GateState("capped", {"t": {0: 5, 1: 7}}, 3)
    assert is_acked(b.root, "q", {"t": {0: 5, 1: 7}})
    assert not (b.root / "checkpoints").exists()  # checkpoints stay on their host

    # live: a deletion and a change on one host reach the other
    a.clear_stop("q")
    b.set_status("q", status="stopped")
    assert eventually(lambda: not b.stop_requested("q"))
    assert eventually(lambda: a.status("q").get("status") == "stopped")
    # a third host sees the compacted result, tombstone included
    c = host(tmp_path, "c", spec, monkeypatch)
    assert not c.stop_requested("q") and c.status("q")["status"] == "stopped"
    for s in (a, b, c):
        s.mirror.close()


def test_a_malformed_kafka_store_address_is_one_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "migrate.cli", "migrate", "status", "q",
                        "--state", "kafka://no-port/topic"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 4
    assert "expected kafka://HOST:PORT[,HOST:PORT...]/TOPIC" in r.stderr
    assert "found kafka://no-port/topic" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.own_jvm
def test_migration_between_hosts_that_share_only_kafka(kafka, tmp_path, monkeypatch):
    """The old query runs on "host A", the migrator (and so the shadow) on "host B": no shared
    directory, every gate, ack, status and phase goes through the store topic."""
    from collections import Counter

    from gates.state import is_acked
    from migrate import migration

    from .test_migration import Feeder, input_records, oracle, plan, wait_for

    src = kafka.topic(prefix="kst-in", partitions=3)
    out = kafka.topic(prefix="kst-out", partitions=1)
    spec = f"kafka://{kafka.bootstrap}/theseus-store-{uuid.uuid4().hex[:8]}"
    query = f"k{uuid.uuid4().hex[:6]}"
    old_p, new_p = tmp_path / "v1.json", tmp_path / "v2.json"
    old_p.write_text(json.dumps(plan(query, src, out, "old", False)))
    new_p.write_text(json.dumps(plan(query, src, out, "new", True)))
    env_a = {**__import__("os").environ, "THESEUS_LOCAL_DIR": str(tmp_path / "host-a")}
    env_b = {**env_a, "THESEUS_LOCAL_DIR": str(tmp_path / "host-b")}
    viewer = host(tmp_path, "viewer", spec, monkeypatch)
    feeder = Feeder(kafka.bootstrap, src)
    feeder.start()
    old = subprocess.Popen([sys.executable, "-m", "migrate.cli", "run", str(old_p),
                            "--bootstrap", kafka.bootstrap, "--state", spec], cwd=ROOT,
                           env=env_a, stdout=open(tmp_path / "a.log", "wb"),
                           stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: viewer.status(query).get("status") == "running", 180, "old up")
        time.sleep(3)
        r = subprocess.run([sys.executable, "-m", "migrate.cli", "migrate", "start",
                            str(new_p), "--bootstrap", kafka.bootstrap, "--state", spec,
                            "--strategy", "shadow", "--timeout", "400"], cwd=ROOT, env=env_b,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        time.sleep(3)
    finally:
        feeder.stop()
    m = migration.current(viewer, query)
    assert m.phase == "done"
    inst = m.new_instance
    assert (tmp_path / "host-b" ).exists() and not any(
        (tmp_path / "host-a").glob(f"*/checkpoints/{query}/1"))
    high = {src: kafka.end_offsets(src)}
    wait_for(lambda: viewer.live_instance(query) == inst and
             is_acked(viewer.root, inst, high), 180, "new query drains the input")
    subprocess.run([sys.executable, "-m", "migrate.cli", "stop", query, "--state", spec],
                   cwd=ROOT, env=env_a, capture_output=True, timeout=120)
    wait_for(lambda: viewer.status(inst).get("status") == "stopped", 120, "new stops")
    old.wait(60)
    inputs = input_records(kafka, src)
    got = Counter(json.dumps(r.json(), sort_keys=True) for r in kafka.read_all(out))
    want = oracle(inputs, m.cut[src])
    assert got == want, (f"missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")
    viewer.mirror.close()


def test_a_lease_in_the_kafka_store_is_taken_once_and_a_takeover_fences_the_old_owner(
        kafka, tmp_path, monkeypatch):
    """Issue 32: two hosts sharing only the broker.  A holds the lease; B is refused naming
    A, without fencing it.  Once A's heartbeat is older than the TTL, B takes the lease over;
    A's next renewal is refused by the broker (its transactional producer was fenced) and A
    writes nothing more; a third host sees B's take.  B's release lifts a gate it held."""
    import os

    from compat.errors import Refused
    from gates.files import atomic_write
    from gates.lease import lifted, read_lease
    from gates.state import GateState
    from migrate.lease import Lease, LeaseLost

    spec = f"kafka://{kafka.bootstrap}/theseus-store-{uuid.uuid4().hex[:8]}"
    a = host(tmp_path, "a", spec, monkeypatch)
    b = host(tmp_path, "b", spec, monkeypatch)
    la = Lease.take(a, ["q"], "m1", what="theseus migrate start", ttl=5,
                    command="theseus migrate start v2.json")
    assert eventually(lambda: (read_lease(b.root, "q") or {}).get("epoch") == 1)
    la.renew(force=True)  # (the first transactions of a broker can take seconds)
    with pytest.raises(Refused, match=rf"is run by pid {os.getpid()} .*migrate start v2"):
        Lease.take(b, ["q"], "m1", what="theseus migrate resume", ttl=5)
    la.renew(force=True)  # the refusal fenced nothing: A still writes its lease
    time.sleep(5.5)  # A stops renewing: stale on B's side
    # A's mirror stops reading the store (a host cut off from the topic): only the broker
    # can tell A it lost the lease
    a.mirror._stop.set()
    a.mirror.thread.join(10)
    # (B's own lease outlives the test: c below must find it held)
    lb = Lease.take(b, ["q"], "m1", what="theseus migrate resume", ttl=60)
    assert lb.epochs == {"q": 2}
    with pytest.raises(LeaseLost, match="fenced at the broker"):
        la.renew(force=True)
    with pytest.raises(LeaseLost):
        with la.installed():
            atomic_write(a.root / "gates" / "q.json", "{}")
    assert not (a.root / "gates" / "q.json").exists()
    assert read_lease(a.root, "q")["epoch"] == 1  # (A's mirror did not see B's take)
    c = host(tmp_path, "c", spec, monkeypatch)
    assert read_lease(c.root, "q")["epoch"] == 2 and not read_lease(c.root, "q")["released"]
    pause = GateState("capped", {"t": {0: 5}}, 7, lease="q")
    assert lifted(c.root, pause) is None
    lb.release()
    assert eventually(lambda: lifted(c.root, pause) is not None)
    assert "released by pid" in lifted(c.root, pause)
    for s in (a, b, c):
        s.mirror.close()
