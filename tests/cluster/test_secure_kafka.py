"""Secured Kafka: SASL/SCRAM users and the StandardAuthorizer (``secure_kafka``).

* With a user allowed everything, ``theseus run`` and ``theseus migrate`` pass their exact
  output oracles; every Kafka client (the gated source on Spark's executors included) logs
  in with ``--kafka-config``.
* A user without WRITE on the output topic is refused before anything is written (a run; a
  migration whose new query could not write the output); a user without WRITE on a source
  topic cannot write the migration's control events: the migration is refused before it
  writes any, and the old query keeps running.
* The password appears in none of: the store (plans, status, gate state, migration
  records, logs of the spawned queries), the checkpoints, the plans, the commands' output.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.integration.conftest import KafkaHelper
from tests.integration.test_migration import input_records, oracle, plan, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cluster]


def theseus(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "migrate.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def helper(sk) -> KafkaHelper:
    admin = sk.conf("admin")
    admin.pop("bootstrap.servers")
    return KafkaHelper(sk.bootstrap, admin)


def files_containing(root: Path, secret: str) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file():
            try:
                if secret.encode() in p.read_bytes():
                    hits.append(str(p))
            except OSError:
                pass
    return hits


class Feeder(threading.Thread):
    """{"id": i, "v": "x<i>"} into 3 partitions at a steady rate, as the admin user."""

    def __init__(self, conf: dict, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.p = Producer({**conf, "enable.idempotence": True})
        self.topic, self.n, self.halt = topic, 0, threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(4):
                self.p.produce(self.topic, json.dumps({"id": self.n, "v": f"x{self.n}"}),
                               partition=self.n % 3)
                self.n += 1
            self.p.poll(0)
            time.sleep(0.1)
        self.p.flush(30)

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


@contextlib.contextmanager
def old_query_running(sk, tmp_path: Path, prefix: str):
    """A source fed as admin, the old plan (v1) run as carol until it writes output, and
    the new plan (v2: the same query, ``upper(v)``, tag new) beside it in ``plans``.
    Yields them as a namespace; stops the feeder and kills the old query at the end."""
    from migrate.store import DirectoryStore

    k = helper(sk)
    src, out = k.topic("sec-in", 3), k.topic("sec-out", 1)
    query = f"{prefix}{tmp_path.name[-6:]}".replace("-", "_")
    plans = tmp_path / "plans"
    plans.mkdir()
    old_p, new_p = plans / "v1.json", plans / "v2.json"
    old_p.write_text(json.dumps(plan(query, src, out, "old", False)))
    new_p.write_text(json.dumps(plan(query, src, out, "new", True)))
    state = tmp_path / "state"
    feeder = Feeder(sk.conf("admin"), src)
    feeder.start()
    log = open(tmp_path / "old.log", "ab")
    old = subprocess.Popen([sys.executable, "-m", "migrate.cli", "run", str(old_p),
                            "--bootstrap", sk.bootstrap, "--state", str(state),
                            "--kafka-config", str(sk.files["carol"])],
                           cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        store = DirectoryStore(state)
        wait_for(lambda: store.status(query).get("status") == "running", 180, "old query up")
        wait_for(lambda: k.end_offsets(out, settle=0)[0] > 0, 120, "old query output")
        yield SimpleNamespace(k=k, src=src, out=out, query=query, plans=plans, old_p=old_p,
                              new_p=new_p, state=state, store=store, feeder=feeder, old=old)
    finally:
        feeder.stop()
        if old.poll() is None:
            old.kill()
        log.close()


@pytest.mark.cluster_ci
def test_run_refused_without_write_then_exact_with_the_right_user(secure_kafka, tmp_path):
    sk = secure_kafka
    k = helper(sk)
    src, out = k.topic("sec-in", 3), k.topic("sec-out", 1)
    k.produce(src, [{"id": i, "v": f"x{i}"} for i in range(300)])
    p = tmp_path / "plans" / "v1.json"
    p.parent.mkdir()
    p.write_text(json.dumps(plan("secrun", src, out, "old", False)))
    state = tmp_path / "state"

    # bob reads but may not write: one error naming the topic and the permission, before
    # Spark starts or anything is written
    t0 = time.monotonic()
    r = theseus("run", p, "--bootstrap", sk.bootstrap, "--state", state, "--available-now",
                "--kafka-config", sk.files["bob"])
    assert r.returncode == 4, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, r.stderr
    assert f"topic '{out}'" in err[0] and "no WRITE permission" in err[0] and "bob" in err[0]
    assert "Traceback" not in r.stderr and time.monotonic() - t0 < 30
    assert k.end_offsets(out) == {0: 0}

    # alice: the run's exact output, read from a SASL broker by the executors too
    r = theseus("run", p, "--bootstrap", sk.bootstrap, "--state", state, "--available-now",
                "--kafka-config", sk.files["alice"], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    got = Counter(json.dumps(x.json(), sort_keys=True) for x in k.read_all(out))
    want = oracle(input_records(k, src), {"0": 1 << 62, "1": 1 << 62, "2": 1 << 62})
    assert sum(want.values()) == 300 and got == want
    for secret in (sk.passwords["alice"], sk.passwords["bob"]):
        assert secret not in r.stdout + r.stderr
        assert files_containing(tmp_path / "state", secret) == []
        assert files_containing(tmp_path / "plans", secret) == []


def test_migration_refused_without_control_event_write_then_exact(secure_kafka, tmp_path):
    sk = secure_kafka
    outputs = []
    with old_query_running(sk, tmp_path, "sm") as q:
        k, src, state, store, new_p = q.k, q.src, q.state, q.store, q.new_p
        # carol may write the output but not the source topics: no control events, refused
        r = theseus("migrate", "start", new_p, "--bootstrap", sk.bootstrap, "--state", state,
                    "--strategy", "shadow", "--timeout", "120", "--kafka-config",
                    sk.files["carol"])
        outputs.append(r.stdout + r.stderr)
        assert r.returncode == 6, r.stdout + r.stderr  # refused: nothing changed
        err = [ln for ln in r.stderr.splitlines() if ln.startswith("theseus: error")]
        assert len(err) == 1 and f"topic '{src}'" in err[0], r.stderr
        assert "no WRITE permission" in err[0] and "control events" in err[0]
        from migrate import migration

        assert migration.current(store, q.query).phase == "refused"
        from gates.control import is_control

        assert not [x for x in k.read_all(src) if is_control(x.headers)]
        before = k.end_offsets(q.out, settle=0)[0]
        wait_for(lambda: k.end_offsets(q.out, settle=0)[0] > before, 60,
                 "the old query keeps writing after the refusal")
        assert q.old.poll() is None and store.status(q.query).get("status") == "running"

        # alice: the migration runs (its shadow, spawned by the migrator, logs in as alice)
        r = theseus("migrate", "start", new_p, "--bootstrap", sk.bootstrap, "--state", state,
                    "--strategy", "shadow", "--timeout", "400", "--kafka-config",
                    sk.files["alice"])
        outputs.append(r.stdout + r.stderr)
        assert r.returncode == 0, r.stdout + r.stderr
        m = migration.current(store, q.query)
        assert m.phase == "done"
        time.sleep(3)
        q.feeder.stop()
        live = store.live_instance(q.query)
        from gates.state import is_acked

        high = {src: k.end_offsets(src)}
        wait_for(lambda: is_acked(state, live, high), 180, "the new query drains the input")
        r = theseus("stop", q.query, "--state", state, "--kafka-config", sk.files["alice"])
        outputs.append(r.stdout + r.stderr)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: store.status(live).get("status") == "stopped", 120, "new stops")
        q.old.wait(60)
    got = Counter(json.dumps(x.json(), sort_keys=True) for x in k.read_all(q.out))
    want = oracle(input_records(k, src), m.cut[src])
    assert got == want, (f"missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")
    assert {json.loads(x)["tag"] for x in got} == {"old", "new"}
    for secret in (sk.passwords["alice"], sk.passwords["carol"]):
        assert not any(secret in o for o in outputs)
        assert files_containing(state, secret) == []  # store, checkpoints, logs
        assert files_containing(q.plans, secret) == []
        assert secret.encode() not in (tmp_path / "old.log").read_bytes()


@pytest.mark.cluster_ci
def test_migration_refused_when_the_new_query_cannot_write_the_output(secure_kafka, tmp_path):
    """dave may write the source topics (the control events) but not the output: a
    migration started as dave is refused before its shadow starts or a control event is
    written, with one error naming the output topic and the missing WRITE; the old query
    (carol's) keeps running and its output stays exact over all input."""
    sk = secure_kafka
    with old_query_running(sk, tmp_path, "so") as q:
        k, src, out, state, store = q.k, q.src, q.out, q.state, q.store
        from migrate import migration

        r = theseus("migrate", "start", q.new_p, "--bootstrap", sk.bootstrap, "--state",
                    state, "--strategy", "shadow", "--timeout", "120", "--kafka-config",
                    sk.files["dave"])
        assert r.returncode == 6, r.stdout + r.stderr  # refused: nothing changed
        assert "Traceback" not in r.stderr
        err = [ln for ln in r.stderr.splitlines() if ln.startswith("theseus: error")]
        assert len(err) == 1, r.stderr
        assert f"topic '{out}'" in err[0] and "no WRITE permission" in err[0], err[0]
        assert "dave" in err[0] and src not in err[0], err[0]
        assert sk.passwords["dave"] not in r.stdout + r.stderr
        m = migration.current(store, q.query)
        assert m.phase == "refused"
        # nothing written: no control event in any source partition, no shadow started
        from gates.control import is_control

        assert not [x for x in k.read_all(src) if is_control(x.headers)]
        assert store.status(f"{q.query}.g1") == {}, store.status(f"{q.query}.g1")
        before = k.end_offsets(out, settle=0)[0]
        wait_for(lambda: k.end_offsets(out, settle=0)[0] > before, 60,
                 "the old query keeps writing after the refusal")
        assert q.old.poll() is None and store.status(q.query).get("status") == "running"
        time.sleep(2)
        q.feeder.stop()
        from gates.state import is_acked

        high = {src: k.end_offsets(src)}
        wait_for(lambda: is_acked(state, q.query, high), 180, "the old query drains the input")
        s = theseus("stop", q.query, "--state", state, "--kafka-config", sk.files["carol"])
        assert s.returncode == 0, s.stderr
        q.old.wait(60)
    got = Counter(json.dumps(x.json(), sort_keys=True) for x in k.read_all(out))
    want = oracle(input_records(k, src), {"0": 1 << 62, "1": 1 << 62, "2": 1 << 62})
    assert sum(want.values()) > 0
    assert got == want, (f"missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")
    assert {json.loads(x)["tag"] for x in got} == {"old"}
    assert files_containing(state, sk.passwords["dave"]) == []
