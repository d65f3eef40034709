"""Live migrations with real Kafka and real Spark, verified by an oracle.

The old query runs under `theseus run` in its own process; `theseus migrate start` runs in
another; input keeps arriving from a producer thread throughout.  Afterwards the output
topic must equal old plan(input before the cut) + new plan(input from the cut on): nothing
lost, nothing twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]


def plan(query: str, src: str, out: str, tag: str, upper: bool) -> dict:
    return {
        "format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
        "nodes": [
            {"id": "events", "step": "source", "version": 1, "topic": src, "partitions": 3,
             "format": "json", "role": "stream",
             "schema": [{"name": "id", "type": "bigint"}, {"name": "v", "type": "string"}]},
            {"id": "shape", "step": "project", "version": 1, "inputs": ["events"],
             "columns": [{"name": "id", "expr": "id"},
                         {"name": "v", "expr": "upper(v)" if upper else "v"},
                         {"name": "tag", "expr": f"'{tag}'"}]},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["shape"], "topic": out,
             "format": "json", "key_columns": [], "mode": "append",
             "delivery": "exactly_once"}]}


class Feeder(threading.Thread):
    """Produces {"id": i, "v": "x<i>"} at a steady rate until stopped."""

    def __init__(self, bootstrap: str, topic: str, per_second: int = 40) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.topic = topic
        self.rate = per_second
        self.n = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(max(1, self.rate // 10)):
                self.p.produce(self.topic, json.dumps({"id": self.n, "v": f"x{self.n}"}),
                               partition=self.n % 3)
                self.n += 1
            self.p.poll(0)
            time.sleep(0.1)
        self.p.flush(30)

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


def theseus(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "migrate.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, **kw)


def spawn_run(plan_path: Path, bootstrap: str, state: Path) -> subprocess.Popen:
    log = open(state.parent / f"{plan_path.stem}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "migrate.cli", "run", str(plan_path),
                             "--bootstrap", bootstrap, "--state", str(state)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.5)


def wait_caught_up(kafka, state, instance: str, topic: str, timeout: float = 180) -> None:
    """Until ``instance`` has acked every record ``topic`` holds now.  With a feeder running,
    this is the moment a fixed sleep only hoped for: the query has read live input (before a
    cut, or after it), not just started."""
    from gates.state import is_acked

    high = {topic: kafka.end_offsets(topic)}
    wait_for(lambda: is_acked(state, instance, high), timeout,
             f"{instance} reads {topic} up to {high[topic]}")


def input_records(kafka, topic):
    from gates.control import is_control

    return [r for r in kafka.read_all(topic) if not is_control(r.headers)]


def oracle(inputs, cut: dict) -> Counter:
    want: Counter = Counter()
    for r in inputs:
        v = r.json()
        if r.offset < cut[str(r.partition)]:
            want[json.dumps({"id": v["id"], "v": v["v"], "tag": "old"}, sort_keys=True)] += 1
        else:
            want[json.dumps({"id": v["id"], "v": v["v"].upper(), "tag": "new"},
                            sort_keys=True)] += 1
    return want


def start_old(kafka, tmp_path, prefix: str) -> SimpleNamespace:
    """Topics, the two plans, a feeder and the old query running under `theseus run`."""
    from migrate.store import DirectoryStore

    t = SimpleNamespace(src=kafka.topic(prefix=f"{prefix}-in", partitions=3),
                        out=kafka.topic(prefix=f"{prefix}-out", partitions=1),
                        state=tmp_path / "state", old_p=tmp_path / "v1.json",
                        new_p=tmp_path / "v2.json",
                        query=f"{prefix[0]}{tmp_path.name[-6:]}".replace("-", "_"))
    t.old_p.write_text(json.dumps(plan(t.query, t.src, t.out, "old", False)))
    t.new_p.write_text(json.dumps(plan(t.query, t.src, t.out, "new", True)))
    t.feeder = Feeder(kafka.bootstrap, t.src)
    t.feeder.start()
    t.old = spawn_run(t.old_p, kafka.bootstrap, t.state)
    t.store = DirectoryStore(t.state)
    wait_for(lambda: t.store.status(t.query).get("status") == "running", 180, "old query up")
    return t


def drain_and_stop(kafka, t: SimpleNamespace) -> str:
    """Stop the input, let the live instance read all of it, stop it; returns its name."""
    from gates.state import is_acked

    live = t.store.live_instance(t.query)
    wait_caught_up(kafka, t.state, live, t.src)  # the live instance reads input after the cut
    t.feeder.stop()
    high = {t.src: kafka.end_offsets(t.src)}
    wait_for(lambda: is_acked(t.state, live, high), 180, "the live query drains the input")
    r = theseus("stop", t.query, "--state", str(t.state))
    assert r.returncode == 0, r.stderr
    wait_for(lambda: t.store.status(live).get("status") == "stopped", 120, "live stops")
    t.old.wait(60)
    return live


def run_migration(kafka, tmp_path, faults: list[str] | None = None,
                  kill_old_in_align: bool = False, compare: bool = False,
                  extra: tuple[str, ...] = ()):
    t = start_old(kafka, tmp_path, "mig")
    src, state, new_p, query, store = t.src, t.state, t.new_p, t.query, t.store
    wait_caught_up(kafka, state, store.live_instance(query), src)  # input before the cut
    args = ["migrate", "start", str(new_p), "--bootstrap", kafka.bootstrap, "--state",
            str(state), "--strategy", "shadow", "--timeout", "400"]
    if compare:
        args.append("--compare")
    args += list(extra)
    env = dict(os.environ)
    steps = list(faults or [])
    if steps:
        env["THESEUS_FAULT"] = f"after:{steps.pop(0)}"
    r = theseus(*args, env=env, timeout=600)
    while r.returncode == -9 and steps is not None:
        # killed on purpose right after recording a phase: resume (maybe killing again)
        env = dict(os.environ)
        if steps:
            env["THESEUS_FAULT"] = f"after:{steps.pop(0)}"
        if kill_old_in_align and store.status(query).get("status") == "running":
            from migrate import migration

            if migration.current(store, query).phase == "align":
                t.old.kill()
                t.old.wait(30)
                t.old = spawn_run(t.old_p, kafka.bootstrap, state)
        r = theseus("migrate", "resume", query, "--state", str(state), "--timeout", "400",
                    env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    from migrate import migration

    m = migration.current(store, query)
    assert m.phase == "done"
    assert store.live_instance(query) == m.new_instance
    drain_and_stop(kafka, t)
    return src, t.out, m


def test_stateless_shadow_migration_is_exact_and_a_cut_at_offsets_writes_nothing_to_the_sources(
        kafka, tmp_path):
    """One shadow migration, with --compare and --cut offsets (two tests once, each its own
    migration of the same setup; every assertion of both is kept):

    - the output is exact: the old plan before the cut, the new one from it;
    - --compare: before the cut the shadow wrote the new plan over the history to a side
      topic, exactly once, and nothing from the cut on;
    - --cut offsets: the cut is the high watermarks recorded in the store; the source
      topics (read by other consumers too) get no control events, and the old query saw it
      had handed over at the cut and stopped by itself.

    The cut by control events (the default) is asserted exact by every other migration
    test of this file and of test_fencing."""
    src, out, m = run_migration(kafka, tmp_path, compare=True, extra=("--cut", "offsets"))
    from gates.control import is_control

    raw = kafka.read_all(src)
    assert not [r for r in raw if is_control(r.headers)]
    assert m.cut == m.high
    inputs = input_records(kafka, src)
    cut = m.cut[src]
    assert len(cut) == 3
    got = Counter(json.dumps(r.json(), sort_keys=True) for r in kafka.read_all(out))
    want = oracle(inputs, cut)
    assert sum(want.values()) > 200
    assert got == want, (f"missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")
    assert any(json.loads(k)["tag"] == "old" for k in got)
    assert any(json.loads(k)["tag"] == "new" for k in got)
    assert {json.loads(k)["tag"] for k in got} == {"old", "new"}
    # --compare: before the cut the shadow wrote the new plan over the history to a side
    # topic, exactly once, and nothing from the cut on
    side = Counter(json.dumps(r.json(), sort_keys=True)
                   for r in kafka.read_all(out + ".shadow"))
    before = Counter({k: n for k, n in oracle([r for r in inputs
                                               if r.offset < cut[str(r.partition)]],
                                              {p: 1 << 62 for p in cut}).items()})
    new_before = Counter()
    for k, n in before.items():
        v = json.loads(k)
        new_before[json.dumps({"id": v["id"], "v": v["v"].upper(), "tag": "new"},
                              sort_keys=True)] += n
    assert side == new_before, (f"missing {sum((new_before - side).values())}, "
                                f"extra {sum((side - new_before).values())}")
    # --cut offsets: the old query saw it had handed over at the cut and stopped by itself
    from migrate.store import DirectoryStore

    store = DirectoryStore(Path(m.new_plan).parent.parent)  # <state>/migrations/<id>.plan.json
    assert store.status(m.old_instance).get("handed_over") is True


def test_migrator_killed_at_every_phase_resumes_exactly(kafka, tmp_path):
    faults = ["check", "shadow", "pause", "cut", "align", "cutover", "finish"]
    src, out, m = run_migration(kafka, tmp_path, faults=faults, kill_old_in_align=True)
    phases = [h[0] for h in m.history]
    for f in faults:
        assert f in phases
    inputs = input_records(kafka, src)
    got = Counter(json.dumps(r.json(), sort_keys=True) for r in kafka.read_all(out))
    want = oracle(inputs, m.cut[src])
    assert got == want, (f"missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")


def agg_plan(query: str, src: str, out: str, with_count: bool) -> dict:
    aggs = [{"name": "s", "function": "sum", "args": ["x"]}]
    if with_count:
        aggs.append({"name": "c", "function": "count", "args": ["*"]})
    return {
        "format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
        "nodes": [
            {"id": "events", "step": "source", "version": 1, "topic": src, "partitions": 3,
             "format": "json", "role": "stream",
             "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]},
            {"id": "per_key", "step": "aggregate", "version": 1, "inputs": ["events"],
             "group_by": [{"name": "k", "expr": "k"}], "aggregates": aggs},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["per_key"], "topic": out,
             "format": "json", "key_columns": ["k"], "mode": "update",
             "delivery": "exactly_once"}]}


class KeyFeeder(Feeder):
    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(max(1, self.rate // 10)):
                k = f"k{self.n % 7}"
                self.p.produce(self.topic, json.dumps({"k": k, "x": self.n % 5 + 1}),
                               key=json.dumps({"k": k}))
                self.n += 1
            self.p.poll(0)
            time.sleep(0.1)
        self.p.flush(30)


def test_stateful_migration_recomputes_history_exactly(kafka, tmp_path):
    from gates.state import is_acked
    from migrate import migration
    from migrate.store import DirectoryStore

    src = kafka.topic(prefix="agg-in", partitions=3)
    out = kafka.topic(prefix="agg-out", partitions=1)
    state = tmp_path / "state"
    query = f"a{tmp_path.name[-6:]}".replace("-", "_")
    old_p, new_p = tmp_path / "v1.json", tmp_path / "v2.json"
    old_p.write_text(json.dumps(agg_plan(query, src, out, False)))
    new_p.write_text(json.dumps(agg_plan(query, src, out, True)))
    feeder = KeyFeeder(kafka.bootstrap, src)
    feeder.start()
    old = spawn_run(old_p, kafka.bootstrap, state)
    store = DirectoryStore(state)
    wait_for(lambda: store.status(query).get("status") == "running", 180, "old query up")
    wait_caught_up(kafka, state, store.live_instance(query), src)  # old rows before the cut
    # sum -> sum + count: the state changes, so `auto` chooses a shadow migration
    r = theseus("migrate", "start", str(new_p), "--bootstrap", kafka.bootstrap, "--state",
                str(state), "--timeout", "400", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    m = migration.current(store, query)
    assert m.kind == "shadow" and m.verdict == "migrate"
    # once its last batch before the cut committed, the old query stopped by itself: its
    # sink writes nothing after the hand-over and Spark runs no batch for nothing
    assert store.status(query).get("handed_over") is True
    inst = store.live_instance(query)
    wait_caught_up(kafka, state, inst, src)  # new rows from input after the cut
    feeder.stop()
    high = {src: kafka.end_offsets(src)}
    wait_for(lambda: is_acked(state, inst, high), 180, "new query drains the input")
    theseus("stop", query, "--state", str(state))
    wait_for(lambda: store.status(inst).get("status") == "stopped", 120, "new stops")
    old.wait(60)

    cut = m.cut[src]
    inputs = input_records(kafka, src)
    before, after = [], []
    for rec in inputs:
        (before if rec.offset < cut[str(rec.partition)] else after).append(rec.json())
    rows = [rec.json() for rec in sorted(kafka.read_all(out), key=lambda r: r.offset)]
    kinds = ["new" if "c" in row else "old" for row in rows]
    # one switch from the old query's rows to the new query's, never back
    assert kinds == sorted(kinds, key=lambda k: k == "new"), kinds
    assert "old" in kinds and "new" in kinds
    # the old query's last row per key is the old plan over the input before the cut
    old_final: dict = {}
    for row, kind in zip(rows, kinds):
        if kind == "old":
            old_final[row["k"]] = row["s"]
    want_old: dict = {}
    for v in before:
        want_old[v["k"]] = want_old.get(v["k"], 0) + v["x"]
    assert old_final == want_old
    # keys touched after the cut end with the new plan applied to ALL input (backfilled)
    new_final: dict = {}
    for row, kind in zip(rows, kinds):
        if kind == "new":
            new_final[row["k"]] = (row["s"], row["c"])
    everything: dict = {}
    for v in before + after:
        s, c = everything.get(v["k"], (0, 0))
        everything[v["k"]] = (s + v["x"], c + 1)
    touched = {v["k"] for v in after}
    assert touched and set(new_final) == touched
    assert new_final == {k: everything[k] for k in touched}


def test_migration_refuses_a_backfill_that_retention_deleted(kafka, tmp_path):
    from confluent_kafka import TopicPartition

    from compat.serde import dumps, from_doc
    from migrate.store import DirectoryStore

    src = kafka.topic(prefix="ret-in", partitions=3)
    out = kafka.topic(prefix="ret-out", partitions=1)
    kafka.produce(src, [{"k": f"k{i}", "x": 1} for i in range(30)])
    futs = kafka.admin.delete_records([TopicPartition(src, 0, 4), TopicPartition(src, 1, 2)])
    for f in futs.values():
        f.result(30)
    state = tmp_path / "state"
    store = DirectoryStore(state)
    query = "retained"
    old_doc = agg_plan(query, src, out, False)
    store.put_plan(query, dumps(from_doc(old_doc)))
    store.set_status(query, status="running", pid=os.getpid(), generation=0)
    new_p = tmp_path / "v2.json"
    new_p.write_text(json.dumps(agg_plan(query, src, out, True)))
    r = theseus("migrate", "start", str(new_p), "--bootstrap", kafka.bootstrap, "--state",
                str(state), "--strategy", "shadow")
    assert r.returncode == 6, r.stdout + r.stderr  # refused: nothing changed
    msg = r.stderr
    assert "retention deleted" in msg and "Traceback" not in msg
    assert "partition 0 from offset 4" in msg and "partition 1 from offset 2" in msg
    # nothing was started: no shadow instance in the store
    assert not (state / "queries" / f"{query}.g1").exists()


def test_abort_at_each_phase_leaves_the_old_query_exact(kafka, tmp_path):
    """Kill the migrator right after each phase before the cutover, then abort: the old
    query keeps running and its output stays exact. Past the point of no return (the old
    query finished the input before C, so the shadow takes over by itself) abort refuses
    and resume finishes the migration, still exact."""
    from migrate import migration

    t = start_old(kafka, tmp_path, "abt")
    src, out, state, new_p, query, store = t.src, t.out, t.state, t.new_p, t.query, t.store
    shadows, refused, last = [], [], None
    for phase in ["check", "shadow", "pause", "cut", "align"]:
        env = dict(os.environ, THESEUS_FAULT=f"after:{phase}")
        r = theseus("migrate", "start", str(new_p), "--bootstrap", kafka.bootstrap,
                    "--state", str(state), "--strategy", "shadow", "--timeout", "300",
                    env=env, timeout=400)
        assert r.returncode == -9, r.stdout + r.stderr
        last = migration.current(store, query)
        assert last.phase == phase
        shadows.append(last.new_instance)
        r = theseus("migrate", "abort", query, "--state", str(state))
        if r.returncode != 0:
            # only once C is reached, and then resume must finish it
            assert phase == "align" and "takes over" in r.stderr, r.stdout + r.stderr
            refused.append(phase)
            r = theseus("migrate", "resume", query, "--state", str(state), "--timeout",
                        "300", timeout=400)
            assert r.returncode == 0, r.stdout + r.stderr
            break
        assert migration.current(store, query).phase == "aborted"
        assert store.live_instance(query) == query
        assert t.old.poll() is None, "the old query must keep running"
    # every aborted shadow got its own instance (no checkpoint or acks reused) and stopped
    assert len(set(shadows)) == len(shadows)
    for s in shadows[:len(shadows) - len(refused)]:
        wait_for(lambda s=s: store.status(s).get("status") != "running", 120, f"{s} stops")
    print(f"abort refused after: {refused or 'none'}")
    drain_and_stop(kafka, t)
    raw = kafka.read_all(src)
    got = Counter(json.dumps(r.json(), sort_keys=True) for r in kafka.read_all(out))
    if refused:
        want = oracle(input_records(kafka, src), last.cut[src])
    else:  # all aborted: the old plan over everything
        want = oracle(input_records(kafka, src), {str(p): 1 << 62 for p in range(3)})
    assert sum(want.values()) > 100 and len(raw) >= sum(want.values())
    assert got == want, (f"missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")
