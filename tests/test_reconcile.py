"""Issue 13: reconciliation at the cut without services: the difference between the old
plan's last value per key and the new plan's, the record that makes it crash-safe, and the
migrator's decision (``--reconcile auto|on|off``) with its refusals."""

from __future__ import annotations

import json
import os

import pytest

from compat.errors import InvalidRequest
from compat.serde import dumps, from_doc
from gates.reconcile import Reconciler, diff, read_record, write_record
from gates.startgate import read_start_gate, write_start_gate
from migrate.context import Context
from migrate.phases.check import decide_reconcile
from migrate.record import Migration
from migrate.store import DirectoryStore


def b(doc) -> bytes:
    return json.dumps(doc).encode()


def test_diff_writes_changed_and_missing_keys_and_tombstones_orphans_only():
    old = {b"a": b({"k": "a", "s": 1}), b"b": b({"k": "b", "s": 2}),
           b"c": b({"k": "c", "s": 3}), b"d": None, b"e": b({"k": "e", "s": 5})}
    new = {b"a": b({"k": "a", "s": 1}),  # already right: nothing written
           b"b": b({"k": "b", "s": 20}),  # stale: corrected
           b"f": b({"k": "f", "s": 6}),  # only the new plan: added
           b"d": b({"k": "d", "s": 4}),  # the old plan deleted it, the new has it: added
           b"e": None}  # the new plan retracted it: deleted
    # c: only the old plan produced it: deleted
    out, counts = diff(old, new)
    assert dict(out) == {b"b": new[b"b"], b"c": None, b"d": new[b"d"], b"e": None,
                         b"f": new[b"f"]}
    assert [k for k, _ in out] == sorted(k for k, _ in out)
    assert counts == {"corrected": 1, "added": 2, "deleted": 2, "matched": 1}


def test_diff_compares_json_values_not_their_spelling():
    old = {b"a": b'{"k":"a","s":1}', b"b": b"not json"}
    new = {b"a": b'{"s": 1, "k": "a"}', b"b": b"not json either"}
    out, counts = diff(old, new)
    assert out == [(b"b", b"not json either")]
    assert counts["matched"] == 1 and counts["corrected"] == 1


def test_diff_of_two_absent_keys_writes_nothing():
    out, counts = diff({b"x": None}, {b"x": None, b"y": None})
    assert out == [] and sum(counts.values()) == 0


def test_reconciler_is_due_once_and_confirms_a_commit_it_did_not_record(tmp_path):
    r = Reconciler(tmp_path, "q.g1", "unused:9092", "out")
    assert r.due(None) is None  # no migration asked for it: inert
    spec = {"topic": "out.shadow", "from": {"0": 7}, "migration": "m1"}
    write_start_gate(tmp_path, "q.g1", False, "m1", reconcile=spec)
    assert r.due(None) == spec
    # recorded before it is written, for batch 5
    r.pending(spec, 5, {"corrected": 2, "added": 0, "deleted": 1, "matched": 4})
    # the host died before its commit: batch 5 is replayed and is due again
    again = Reconciler(tmp_path, "q.g1", "unused:9092", "out")
    assert again.due(4) == spec
    # the host died after the commit, before recording it: the sink's committed batch id
    # says it is done, and the record is completed
    third = Reconciler(tmp_path, "q.g1", "unused:9092", "out")
    assert third.due(5) is None
    rec = read_record(tmp_path, "q.g1")
    assert rec["state"] == "committed" and rec["counts"]["deleted"] == 1
    assert Reconciler(tmp_path, "q.g1", "unused:9092", "out").due(None) is None


def test_the_start_gate_keeps_the_reconcile_spec_when_it_opens(tmp_path):
    spec = {"topic": "o.shadow", "from": {"0": 0}, "migration": "m1"}
    write_start_gate(tmp_path, "q.g1", True, "m1", reconcile=spec)
    assert read_start_gate(tmp_path, "q.g1")["reconcile"] == spec
    write_record(tmp_path, "q.g1", {"migration": "m1", "state": "committed"})
    assert Reconciler(tmp_path, "q.g1", "x", "o").due(None) is None


def agg(query: str, mode: str = "update", keys=("k",), starting: str = "earliest") -> dict:
    return {"format": "theseus.plan/1", "query": query, "nodes": [
        {"id": "events", "step": "source", "version": 1, "topic": "in", "partitions": 1,
         "format": "json", "role": "stream", "starting_offsets": starting,
         "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]},
        {"id": "per_key", "step": "aggregate", "version": 1, "inputs": ["events"],
         "group_by": [{"name": "k", "expr": "k"}],
         "aggregates": [{"name": "s", "function": "sum", "args": ["x"]}]},
        {"id": "out", "step": "sink", "version": 1, "inputs": ["per_key"], "topic": "out",
         "format": "json", "key_columns": list(keys), "mode": mode,
         "delivery": "exactly_once"}]}


def table_agg(query: str, read: str, starting: str = "earliest") -> dict:
    """A keyed update sink over a table aggregate; the table read as ``read``."""
    doc = agg(query, starting=starting)
    doc["nodes"][0].update(version=2, role="table", read=read, key_columns=["id"],
                           schema=[{"name": "id", "type": "string"},
                                   {"name": "k", "type": "string"},
                                   {"name": "x", "type": "bigint"}])
    if read == "snapshot":  # a snapshot is the static side of a stream-table join
        doc["nodes"][1:1] = [
            {"id": "clicks", "step": "source", "version": 1, "topic": "clicks",
             "partitions": 1, "format": "json", "role": "stream",
             "schema": [{"name": "cid", "type": "string"}]},
            {"id": "j", "step": "join", "version": 1, "inputs": ["clicks", "events"],
             "type": "inner", "left_keys": ["cid"], "right_keys": ["id"]}]
        doc["nodes"][3]["inputs"] = ["j"]
    return doc


def migration(tmp_path, new_doc: dict, reconcile: str) -> tuple[Migration, Context]:
    store = DirectoryStore(tmp_path / "state")
    store.put_plan("q", dumps(from_doc(agg("q"))))
    store.set_status("q", status="running", pid=os.getpid())
    p = tmp_path / "new.json"
    p.write_text(json.dumps(new_doc))
    m = Migration(id="m1", query="q", new_plan=str(p), old_instance="q", new_instance="q.g1",
                  reconcile=reconcile, bootstrap="unused:9092")
    return m, Context(store, lambda s: None)


@pytest.mark.parametrize("doc,asked,want", [
    (agg("q"), "auto", True),  # keyed update sink
    (agg("q"), "off", False),
    (agg("q", mode="append"), "auto", False),  # append: off unless asked
    (agg("q", mode="append"), "on", True),
    (agg("q", mode="complete"), "auto", False),
    (agg("q", keys=()), "auto", False),
    (agg("q", starting="latest"), "auto", False),
    (table_agg("q", "changelog"), "auto", True),  # a table query: keyed update output
    # a changelog is read from its starting offsets: from latest, keys before are unseen
    (table_agg("q", "changelog", starting="latest"), "auto", False),
    # a snapshot is read whole at every batch, whatever its starting offsets
    (table_agg("q", "snapshot", starting="latest"), "auto", True),
])
def test_reconcile_decision(tmp_path, doc, asked, want):
    m, ctx = migration(tmp_path, doc, asked)
    assert decide_reconcile(m, ctx, from_doc(doc)) is want


@pytest.mark.parametrize("doc,reason", [
    (agg("q", mode="complete"), "complete sink rewrites its whole result"),
    (agg("q", keys=()), "no key columns"),
    (agg("q", starting="latest"), "start at the latest offsets"),
])
def test_reconcile_on_refuses_what_it_cannot_reconcile_with_the_reason(tmp_path, doc, reason):
    m, ctx = migration(tmp_path, doc, "on")
    with pytest.raises(InvalidRequest) as e:
        decide_reconcile(m, ctx, from_doc(doc))
    assert reason in e.value.message and "--reconcile off" in e.value.render()
    assert m.phase == "refused"
    saved = Migration.load(ctx.store, "m1")
    assert saved.phase == "refused" and reason in saved.error


def test_the_migration_record_schema_covers_every_field_and_a_reconciled_record():
    import dataclasses

    import jsonschema

    from compat.schema_check import load_schema
    from migrate.protocol import PHASES, TERMINAL

    schema = load_schema("migration.v1.json")
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(schema["properties"]) == {f.name for f in dataclasses.fields(Migration)}
    assert set(schema["properties"]["phase"]["enum"]) == set(PHASES) | set(TERMINAL)
    m = Migration(id="m20260101-abc", query="q", new_plan="p.json", old_instance="q",
                  new_instance="q.g1", kind="shadow", phase="done", reconcile="auto",
                  reconciling=True, side_from={"0": 12},
                  cut={"in": {"0": 5, "1": 7}}, history=[["check", 1.5], ["done", 2.0]],
                  counts={"corrected": 29, "added": 0, "deleted": 1, "matched": 0,
                          "seconds": 0.4})
    jsonschema.validate(dataclasses.asdict(m), schema)
    bad = dict(dataclasses.asdict(m), counts={"corrected": -1})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_diff_again_after_a_few_keys_changed_compares_only_those():
    old = {b"a": b'{"s":1}', b"b": b'{"s":2}'}
    new = {b"a": b'{"s": 1}', b"b": b'{"s": 3}'}
    memo: dict = {}
    _, first = diff(old, new, memo=memo)
    assert first["matched"] == 1 and first["corrected"] == 1 and set(memo) == {b"a", b"b"}
    # the same value objects: the memo answers (a planted answer shows it was not recomputed)
    memo[b"a"] = (old[b"a"], new[b"a"], False)
    _, again = diff(old, new, memo=memo)
    assert again["matched"] == 0 and again["corrected"] == 2
    # a key whose value changed (a new object) is compared again
    old2 = {**old, b"a": b'{"s": 1}'}
    _, third = diff(old2, new, memo=memo)
    assert third["matched"] == 1


def test_corrections_after_a_prefetch_take_the_outputs_tail_into_account(tmp_path,
                                                                         monkeypatch):
    """Both topics are read (and every key compared) while the old query finishes its last
    batch before the cut; what it writes then must still count at the hand-over."""
    import gates.reconcile as rec

    contents = {"out.shadow": {b"a": b'{"s":1,"c":1}', b"b": b'{"s":2,"c":1}'},
                "out": {b"a": b'{"s":1}', b"b": b'{"s":2,"c":1}'}}
    reads: list[str] = []

    class FakeView:
        def __init__(self, bootstrap, topic, start, timeout):
            self.topic, self.latest = topic, {}

        def refresh(self):
            reads.append(self.topic)
            self.latest.update(contents[self.topic])
            return self.latest

    monkeypatch.setattr(rec, "TopicView", FakeView)
    r = Reconciler(tmp_path, "q.g1", "unused:9092", "out")
    spec = {"topic": "out.shadow", "from": {}, "migration": "m1"}
    r.prefetch(spec)
    # the old query's last batch before the cut: it rewrites b (stale now) and adds c
    contents["out"] = {b"b": b'{"s":9}', b"c": b'{"s":3}'}
    contents["out.shadow"] = {}
    out, counts = r.corrections(spec)
    assert dict(out) == {b"a": b'{"s":1,"c":1}', b"b": b'{"s":2,"c":1}', b"c": None}
    assert {k: counts[k] for k in rec.COUNTS} == \
        {"corrected": 2, "added": 0, "deleted": 1, "matched": 0}
    assert counts["prefetched"] is True
    assert reads == ["out.shadow", "out", "out.shadow", "out"]  # one view each, read on


def test_read_ahead_starts_at_the_pause_and_stops_at_the_hand_over(tmp_path, monkeypatch):
    import time

    import gates.reconcile as rec
    from gates.state import GateState, write_gate

    reads: list[str] = []

    class FakeView:
        def __init__(self, bootstrap, topic, start, timeout):
            self.topic, self.latest = topic, {}

        def refresh(self):
            reads.append(self.topic)
            self.latest[b"a"] = b'{"s":1}' if self.topic == "out" else b'{"s":1,"c":1}'
            return self.latest

    monkeypatch.setattr(rec, "TopicView", FakeView)
    spec = {"topic": "out.shadow", "from": {}, "migration": "m1"}
    write_start_gate(tmp_path, "q.g1", False, "m1", reconcile=spec)
    write_gate(tmp_path, "q.g1", GateState("open", {}, 1))
    r = Reconciler(tmp_path, "q.g1", "unused:9092", "out")
    r.watch(every=0.02)
    time.sleep(0.3)
    assert reads == []  # backfilling: nothing read ahead yet
    write_gate(tmp_path, "q.g1", GateState("capped", {"in": {0: 5}}, 2))  # step 3
    deadline = time.monotonic() + 10
    while len(reads) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(reads) >= 4  # read ahead, again and again
    out, counts = r.corrections(spec)
    n = len(reads)
    time.sleep(0.2)
    assert len(reads) == n  # the hand-over stopped it
    assert out == [(b"a", b'{"s":1,"c":1}')] and counts["prefetched"] is True


def test_the_diff_kept_up_to_date_key_by_key_equals_the_full_diff_after_every_change():
    """The hand-over compares only the keys the last refreshes read: after any sequence of
    upserts and tombstones on either side, that equals comparing every key again."""
    import random

    from gates.reconcile import KeyDiff

    rnd = random.Random(7)
    keys = [f'{{"k":{i}}}'.encode() for i in range(60)]

    def value(side: str) -> bytes | None:
        r = rnd.random()
        if r < 0.2:
            return None
        s = rnd.randrange(4)  # few values: many keys match; spacing differs by side
        return (f'{{"s":{s}}}' if side == "old" else f'{{"s": {s}}}').encode()

    old = {k: value("old") for k in rnd.sample(keys, 40)}
    new = {k: value("new") for k in rnd.sample(keys, 40)}
    kd = KeyDiff()
    kd.update(old, new)
    assert kd.result(new) == diff(old, new)
    for _ in range(50):
        changed = set()
        for side in (old, new):
            for k in rnd.sample(keys, rnd.randrange(1, 8)):
                side[k] = value("old" if side is old else "new")
                changed.add(k)
        kd.update(old, new, changed)
        assert kd.result(new) == diff(old, new)
    assert sum(kd.counts.values()) == len(kd.kind)
