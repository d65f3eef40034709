"""Reconciliation at the cut, with real Kafka and real Spark, judged by an oracle.

An aggregate per key (sum) migrates to a new plan that adds a column (count) and drops one
group (a filter on the group key).  30 keys get input before the cut C, only 10 of them
after it.  Without reconciliation the 20 untouched keys would keep the old plan's value and
the dropped key its old row forever.  With it, the compacted view of the output after the
migration equals the new plan over *all* input for every key, the dropped key is
tombstoned, the 20 untouched keys carry the new column, and each correction is written
exactly once — also when the migrator and the shadow's host are SIGKILLed during the
reconciliation."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.integration.test_migration import (
    Feeder,
    spawn_run,
    theseus,
    wait_caught_up,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]

KEYS = [f"k{i:02d}" for i in range(30)]
LIVE = KEYS[:10]  # the keys that still get input after the cut
DROPPED = "k03"  # the group the new plan filters out (one of the live keys: the filter,
#                  not the lack of input, must delete it)


def agg_plan(query: str, src: str, out: str, new: bool) -> dict:
    aggs = [{"name": "s", "function": "sum", "args": ["x"]}]
    nodes = [{"id": "events", "step": "source", "version": 1, "topic": src, "partitions": 3,
              "format": "json", "role": "stream",
              "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]}]
    agg_in = "events"
    if new:
        aggs.append({"name": "c", "function": "count", "args": ["*"]})
        nodes.append({"id": "keep", "step": "filter", "version": 1, "inputs": ["events"],
                      "predicate": f"k <> '{DROPPED}'"})
        agg_in = "keep"
    nodes += [
        {"id": "per_key", "step": "aggregate", "version": 1, "inputs": [agg_in],
         "group_by": [{"name": "k", "expr": "k"}], "aggregates": aggs},
        {"id": "out", "step": "sink", "version": 1, "inputs": ["per_key"], "topic": out,
         "format": "json", "key_columns": ["k"], "mode": "update",
         "delivery": "exactly_once"}]
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": nodes}


class LiveKeys(Feeder):
    """Input for the 10 live keys only, at a steady rate, until stopped."""

    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(max(1, self.rate // 10)):
                k = LIVE[self.n % len(LIVE)]
                self.p.produce(self.topic, json.dumps({"k": k, "x": self.n % 5 + 1}),
                               key=json.dumps({"k": k}))
                self.n += 1
            self.p.poll(0)
            time.sleep(0.1)
        self.p.flush(30)


def compacted(records) -> dict:
    """What a reader of the compacted topic sees: per key, its last record (None: deleted)."""
    view: dict = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        view[r.key_json()["k"]] = r.json()
    return view


def run_reconciled(kafka, tmp_path, env_extra: dict | None = None,
                   faults: list[str] | None = None):
    from gates.control import is_control
    from gates.state import is_acked
    from migrate import migration
    from migrate.store import DirectoryStore

    src = kafka.topic(prefix="rec-in", partitions=3)
    out = kafka.topic(prefix="rec-out", partitions=2, config={"cleanup.policy": "compact"})
    state = tmp_path / "state"
    query = f"r{tmp_path.name[-6:]}".replace("-", "_")
    old_p, new_p = tmp_path / "v1.json", tmp_path / "v2.json"
    old_p.write_text(json.dumps(agg_plan(query, src, out, False)))
    new_p.write_text(json.dumps(agg_plan(query, src, out, True)))
    # every key gets input before the cut (and before the old query starts) ...
    kafka.produce(src, [{"k": k, "x": i + 1} for i, k in enumerate(KEYS * 2)],
                  keys=[{"k": k} for k in KEYS * 2])
    feeder = LiveKeys(kafka.bootstrap, src)  # ... and the live ones all along
    feeder.start()
    old = spawn_run(old_p, kafka.bootstrap, state)
    store = DirectoryStore(state)
    wait_for(lambda: store.status(query).get("status") == "running", 180, "old query up")
    wait_caught_up(kafka, state, store.live_instance(query), src)  # live input before the cut
    env = dict(os.environ, **(env_extra or {}))
    steps = list(faults or [])
    if steps:
        env["THESEUS_FAULT"] = f"after:{steps.pop(0)}"
    r = theseus("migrate", "start", str(new_p), "--bootstrap", kafka.bootstrap, "--state",
                str(state), "--timeout", "400", env=env, timeout=600)
    while r.returncode == -9:
        env = dict(os.environ)
        if steps:
            env["THESEUS_FAULT"] = f"after:{steps.pop(0)}"
        r = theseus("migrate", "resume", query, "--state", str(state), "--timeout", "400",
                    env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    m = migration.current(store, query)
    assert m.phase == "done" and m.kind == "shadow" and m.reconciling
    status = theseus("migrate", "status", query, "--state", str(state))
    # more input for the live keys after the cut, then drain and stop
    inst = store.live_instance(query)
    wait_caught_up(kafka, state, inst, src)
    feeder.stop()
    high = {src: kafka.end_offsets(src)}
    wait_for(lambda: is_acked(state, inst, high), 180, "the new query drains the input")
    theseus("stop", query, "--state", str(state))
    wait_for(lambda: store.status(inst).get("status") == "stopped", 120, "new query stops")
    old.wait(60)
    raw = kafka.read_all(src)
    check_control_tombstones(raw, m)
    inputs = [r for r in raw if not is_control(r.headers)]
    return inputs, kafka.read_all(out), m, status


def check_control_tombstones(raw, m) -> None:
    """Every partition that got a control record got, once the migration was done, a
    tombstone for the same key after it, marked by the same header: a compacted source
    topic does not keep the control records forever, and readers skip both."""
    from gates.control import control_key, is_control, parse_control

    ctl = [r for r in raw if is_control(r.headers)]
    marks = {(r.partition, r.offset) for r in ctl if r.value is not None}
    assert marks == {(int(p), o) for p, o in m.cut[raw[0].topic].items()}
    for p, o in m.cut[raw[0].topic].items():
        tomb = [r for r in ctl if r.partition == int(p) and r.value is None]
        assert len(tomb) >= 1 and all(r.offset > o for r in tomb), (p, o, tomb)
        assert all(r.key == control_key(m.id) for r in tomb)
        assert parse_control(tomb[0].headers)["tombstone"] is True


def check_oracle(inputs, records, m) -> None:
    cut = m.cut[inputs[0].topic]
    after = {r.json()["k"] for r in inputs if r.offset >= cut[str(r.partition)]}
    # the set-up: 30 keys before the cut, only the 10 live ones after it
    before = {r.json()["k"] for r in inputs if r.offset < cut[str(r.partition)]}
    assert before == set(KEYS) and after == set(LIVE), (sorted(before), sorted(after))
    # the oracle: the new plan over all input, computed here
    want: dict = {}
    for r in inputs:
        v = r.json()
        if v["k"] == DROPPED:
            continue
        s, c = want.get(v["k"], (0, 0))
        want[v["k"]] = (s + v["x"], c + 1)
    view = compacted(records)
    assert set(view) == set(KEYS)
    assert view[DROPPED] is None, "the dropped group is tombstoned"
    got = {k: (v["s"], v["c"]) for k, v in view.items() if v is not None}
    assert got == want
    # the 20 keys untouched after the cut carry the new column, through exactly one
    # correction each (written once, nothing twice after a crash), after their old rows
    for k in set(KEYS) - set(LIVE):
        rows = [r for r in records if r.key_json()["k"] == k]
        new_rows = [r for r in rows if r.json() is not None and "c" in r.json()]
        assert len(new_rows) == 1, (k, [r.json() for r in rows])
        assert all(r.offset < new_rows[0].offset for r in rows if r is not new_rows[0])
    # one tombstone for the dropped key (the new plan never wrote it: the filter drops it)
    assert [r.json() for r in records if r.key_json()["k"] == DROPPED].count(None) == 1
    # every key's value before the cut was the old plan's; all 29 kept keys differ (the new
    # column), none is new, and the dropped one is deleted
    assert {k: m.counts[k] for k in ("corrected", "added", "deleted", "matched")} == \
        {"corrected": 29, "added": 0, "deleted": 1, "matched": 0}, m.counts


def test_reconciliation_makes_the_compacted_output_the_new_plan_over_all_input(kafka,
                                                                             tmp_path):
    inputs, records, m, status = run_reconciled(kafka, tmp_path)
    check_oracle(inputs, records, m)
    assert "29 corrected, 0 added, 1 deleted, 0 already right" in status.stdout, status.stdout
    # the side topic served the reconciliation only: deleted when the migration finished
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10).topics
    assert records[0].topic + ".shadow" not in topics


def test_reconciliation_survives_sigkill_of_migrator_and_shadow_host(kafka, tmp_path):
    """The shadow's host dies with the corrections written but not committed; the migrator
    dies right after recording the cutover. ``migrate resume`` starts the shadow again:
    Spark replays the batch, the corrections are written once."""
    marker = tmp_path / "kill-in-reconcile"
    marker.write_text("once")
    inputs, records, m, _ = run_reconciled(
        kafka, tmp_path, env_extra={"THESEUS_SINK_FAULT": f"reconcile:{marker}"},
        faults=["cutover"])
    assert not marker.exists(), "the shadow's host was not killed in the reconciliation"
    check_oracle(inputs, records, m)
