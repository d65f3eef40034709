"""Cascading migrations without services: the chain of plans, the order the driver runs the
phases of its migrations in (and resumes them), the downstream shadow's source switching
from the side topic to the real topic at the propagated cut, the upstream's held start
gate, and the cascade record's schema."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from compat.errors import GateStateError, InvalidRequest, Refused
from compat.serde import from_doc
from gates.cascade import read_switch, write_switch
from gates.startgate import StartGate, write_start_gate
from gates.state import GateState, is_acked, write_ack
from migrate import cascade, runner
from migrate.cascade import ORDER, Cascade, Driver, chain
from migrate.context import Context
from migrate.phases import check as check_phase
from migrate.record import Migration
from migrate.services.processes import Processes
from migrate.services.topics import TopicAdmin
from migrate.store import DirectoryStore


def up_plan(query="up", src="s", mid="t", new=False) -> dict:
    cols = [{"name": "k", "expr": "k"}, {"name": "x", "expr": "x"}]
    if new:
        cols.append({"name": "w", "expr": "x * 10"})
    return {"format": "theseus.plan/1", "query": query, "nodes": [
        {"id": "events", "step": "source", "version": 1, "topic": src, "partitions": 3,
         "format": "json", "role": "stream",
         "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]},
        {"id": "enrich", "step": "project", "version": 1, "inputs": ["events"],
         "columns": cols},
        {"id": "out", "step": "sink", "version": 1, "inputs": ["enrich"], "topic": mid,
         "format": "json", "key_columns": ["k"], "mode": "append",
         "delivery": "exactly_once"}]}


def down_plan(query="down", mid="t", out="o", extra: str | None = None) -> dict:
    nodes = [
        {"id": "in", "step": "source", "version": 1, "topic": mid, "partitions": 2,
         "format": "json", "role": "stream",
         "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]}]
    agg_in = ["in"]
    if extra:
        nodes.append({"id": "other", "step": "source", "version": 1, "topic": extra,
                      "partitions": 1, "format": "json", "role": "stream",
                      "schema": [{"name": "k", "type": "string"},
                                 {"name": "x", "type": "bigint"}]})
        nodes.append({"id": "both", "step": "union", "version": 1, "inputs": ["in", "other"]})
        agg_in = ["both"]
    nodes += [
        {"id": "per_key", "step": "aggregate", "version": 1, "inputs": agg_in,
         "group_by": [{"name": "k", "expr": "k"}],
         "aggregates": [{"name": "s", "function": "sum", "args": ["x"]}]},
        {"id": "out", "step": "sink", "version": 1, "inputs": ["per_key"], "topic": out,
         "format": "json", "key_columns": ["k"], "mode": "update",
         "delivery": "exactly_once"}]
    return {"format": "theseus.plan/1", "query": query, "nodes": nodes}


def plans_of(*docs):
    plans = {d["query"]: from_doc(d) for d in docs}
    return plans, {q: f"{q}.json" for q in plans}


# -- the chain ----------------------------------------------------------------------------

def test_the_chain_is_ordered_upstream_first_whatever_the_order_given():
    order, links = chain(*plans_of(down_plan("c", mid="u", out="o"),
                                   down_plan("b", mid="t", out="u"), up_plan("a")))
    assert order == ["a", "b", "c"]
    assert links == [{"upstream": "b", "downstream": "c", "topic": "u"},
                     {"upstream": "a", "downstream": "b", "topic": "t"}]


@pytest.mark.parametrize("docs, words", [
    ((up_plan("a"), down_plan("b", mid="elsewhere")), "neither feeds nor reads"),
    ((up_plan("a"), up_plan("a2", mid="t2"), down_plan("b", extra="t2")),
     "reads the outputs of 2 queries"),
    ((up_plan("a"), down_plan("b", extra="raw")), "also reads raw"),
    ((up_plan("a"), up_plan("a2")), "two plans of the cascade write topic 't'"),
    ((down_plan("a", mid="o", out="t"), down_plan("b", mid="t", out="o")), "cycle"),
])
def test_chains_that_cannot_be_cut_at_one_point_are_refused_with_the_reason(docs, words):
    with pytest.raises(Refused) as e:
        chain(*plans_of(*docs))
    assert words in e.value.message, e.value.render()
    assert e.value.file and e.value.file.endswith(".json")


def test_a_downstream_of_two_upstreams_is_refused_naming_the_source_that_reads_the_second():
    """Supported: one upstream per downstream. The refusal points at the source node of the
    second upstream's topic, names both topics and their writers, and says what to do."""
    with pytest.raises(Refused) as e:
        chain(*plans_of(up_plan("a"), up_plan("a2", src="s2", mid="t2"),
                        down_plan("b", extra="t2")))
    err = e.value
    assert (err.file, err.node, err.pointer) == ("b.json", "other", "/nodes/1")
    assert err.found == "'t' written by 'a', 't2' written by 'a2'"
    assert "propagated cut of one upstream only" in err.message
    assert "on their own first" in err.hint and "'b' as a cascade" in err.hint
    # a source of a topic no query of the cascade writes is pointed at the same way
    with pytest.raises(Refused) as e:
        chain(*plans_of(up_plan("a"), down_plan("b", extra="raw")))
    assert (e.value.node, e.value.pointer) == ("other", "/nodes/1")


def test_the_cli_refuses_an_unchained_cascade_in_one_line_exit_2(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(up_plan("a")))
    b.write_text(json.dumps(down_plan("b", mid="nowhere")))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "migrate.cli", "migrate", "start", str(a),
                        str(b), "--bootstrap", "127.0.0.1:1", "--state",
                        str(tmp_path / "st")], cwd=root, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=root))
    assert r.returncode == 2, r.stderr  # the plans given are not a cascade: invalid input
    assert "Traceback" not in r.stderr and "neither feeds nor reads" in r.stderr
    assert str(a) in r.stderr and r.stderr.count("\n") == 1  # the first plan not chained


# -- the upstream refuses reconciliation ------------------------------------------------

@pytest.mark.parametrize("asked", ["auto", "on"])
def test_an_upstream_of_a_cascade_does_not_reconcile(tmp_path, asked):
    store = DirectoryStore(tmp_path)
    m = Migration(id="m1", query="a", new_plan="a.json", old_instance="a", reconcile=asked,
                  feeds=["m2"], cascade="c1")
    ctx = Context(store, lambda s: None)
    # a keyed update sink: alone, auto would reconcile it
    doc = down_plan("a", mid="s", out="t")
    if asked == "auto":
        assert check_phase.decide_reconcile(m, ctx, from_doc(doc)) is False
    else:
        with pytest.raises(InvalidRequest, match="feeds the downstream queries"):
            check_phase.decide_reconcile(m, ctx, from_doc(doc))


# -- the driver's order ---------------------------------------------------------------------

class Killed(Exception):
    pass


def fake_cascade(tmp_path, monkeypatch, kill_at: tuple[str, str] | None = None):
    """Two migrations whose steps only record their order and move to the next phase."""
    store = DirectoryStore(tmp_path)
    a = Migration(id="ma", query="a", new_plan="a.json", old_instance="a", cascade="c1",
                  feeds=["mb"], kind="shadow")
    b = Migration(id="mb", query="b", new_plan="b.json", old_instance="b", cascade="c1",
                  cut_from="ma", kind="shadow")
    for m in (a, b):
        m.save(store)
    c = Cascade(id="c1", migrations=["ma", "mb"], queries=["a", "b"],
                links=[{"upstream": "a", "downstream": "b", "topic": "t"}])
    c.save(store)
    ran: list[tuple[str, str]] = []
    kill = [kill_at]

    def step(m, ctx):
        ph = m.phase
        if kill[0] == (m.query, ph):
            kill[0] = None
            raise Killed  # the migrator dies before this step acts
        ran.append((m.query, ph))
        nxt = ORDER[ORDER.index(ph) + 1]
        if nxt == "propagate" and not m.feeds:
            nxt = "cutover"
        m.phase = nxt
        ctx.save(m)

    monkeypatch.setattr(runner, "step", step)
    return store, c, ran


def test_an_upstream_feeding_two_queries_cuts_over_once_both_adopted_its_cut(tmp_path,
                                                                            monkeypatch):
    from gates.deadline import Deadline

    store, c, ran = fake_cascade(tmp_path, monkeypatch)
    a = Migration.load(store, "ma")
    a.feeds = ["mb", "mc"]
    a.save(store)
    Migration(id="mc", query="c", new_plan="c.json", old_instance="c", cascade="c1",
              cut_from="ma", kind="shadow").save(store)
    c.migrations.append("mc")
    c.queries.append("c")
    c.links.append({"upstream": "a", "downstream": "c", "topic": "t"})
    c.save(store)
    Driver(store, c, lambda s: None, Deadline(10)).run()
    pos = {x: i for i, x in enumerate(ran)}
    assert pos[("b", "cut")] < pos[("c", "cut")] < pos[("a", "cutover")]
    assert pos[("a", "cutover")] < min(pos[("b", "cutover")], pos[("c", "cutover")])
    assert all(Migration.load(store, m).phase == "done" for m in ("ma", "mb", "mc"))


def test_the_driver_interleaves_the_chain_so_it_switches_at_one_point(tmp_path, monkeypatch):
    from gates.deadline import Deadline

    store, c, ran = fake_cascade(tmp_path, monkeypatch)
    out = Driver(store, c, lambda s: None, Deadline(10)).run()
    assert out.phase == "done"
    pos = {x: i for i, x in enumerate(ran)}
    # checks before any shadow starts; the upstream's shadow before the downstream's
    assert max(pos[("a", "check")], pos[("b", "check")]) < pos[("a", "shadow")]
    assert pos[("a", "shadow")] < pos[("b", "shadow")]
    # the downstream catches up, then the upstream pauses, cuts, aligns and propagates
    assert pos[("b", "pause")] < pos[("a", "pause")] < pos[("a", "cut")]
    assert pos[("a", "propagate")] < pos[("b", "cut")]  # its cut is the propagated one
    # the upstream's new query writes past the cut only once the downstream adopted it
    assert pos[("b", "cut")] < pos[("a", "cutover")]
    # ... and at once: the downstream's alignment is not part of the upstream's stall
    assert pos[("b", "cut")] + 1 == pos[("a", "cutover")] < pos[("b", "align")]
    assert pos[("a", "cutover")] < pos[("b", "cutover")]
    # the side topic goes (upstream's finish) once the downstream shadow switched
    assert pos[("b", "cutover")] < pos[("a", "finish")]
    assert ("b", "propagate") not in pos
    rec = json.loads(Cascade.path(store, "c1").read_text())
    assert [x["phase"] for x in rec["members"]] == ["done", "done"]


@pytest.mark.parametrize("where", [("a", "propagate"), ("b", "cut"), ("b", "cutover"),
                                   ("a", "finish")])
def test_a_killed_driver_resumes_where_it_stopped_from_any_query(tmp_path, monkeypatch,
                                                                 where):
    store, c, ran = fake_cascade(tmp_path, monkeypatch, kill_at=where)
    from gates.deadline import Deadline

    with pytest.raises(Killed):
        Driver(store, c, lambda s: None, Deadline(10)).run()
    before = list(ran)
    ran.clear()
    # resumed through the other query of the chain than the one killed
    other = "b" if where[0] == "a" else "a"
    m = cascade.resume(store, "c1", echo=lambda s: None, query=other)
    assert m.query == other and m.phase == "done"
    assert ran[0] == where and not set(before) & set(ran)  # nothing done twice
    assert Cascade.load(store, "c1").phase == "done"


def test_status_of_any_query_of_a_cascade_shows_the_whole_chain(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from migrate.cli import main

    store, c, ran = fake_cascade(tmp_path, monkeypatch)
    for q in ("a", "b"):
        r = CliRunner().invoke(main, ["migrate", "status", q, "--state", str(tmp_path)])
        assert r.exit_code == 0, r.output
        assert "cascade c1: running (a -> b)" in r.output
        assert "a: migration ma, phase check" in r.output
        assert "b: migration mb, phase check" in r.output
    r = CliRunner().invoke(main, ["migrate", "status", "b", "--state", str(tmp_path),
                                  "--format", "json"])
    import jsonschema

    from compat.schema_check import load_schema

    jsonschema.validate(json.loads(r.output), load_schema("cascade.v1.json"))


def test_the_cascade_record_schema_covers_every_field():
    import jsonschema

    from compat.schema_check import load_schema

    schema = load_schema("cascade.v1.json")
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(schema["properties"]) == {f.name for f in dataclasses.fields(Cascade)}
    c = Cascade(id="c1", migrations=["m1", "m2"], queries=["a", "b"],
                links=[{"upstream": "a", "downstream": "b", "topic": "t"}], phase="done",
                members=[{"query": "a", "migration": "m1", "phase": "done", "kind": "shadow",
                          "cut": {"s": {"0": 4}}, "out_cut": {"t": {"0": 9, "1": 3}},
                          "counts": {}}])
    jsonschema.validate(dataclasses.asdict(c), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(dataclasses.asdict(c), links=[{"upstream": "a"}]), schema)


# -- the upstream's held start gate ---------------------------------------------------------

def test_the_upstream_shadow_holds_its_batch_from_the_cut_until_the_migrator_opens(tmp_path):
    cut = {"s": {0: 10}}
    write_start_gate(tmp_path, "new", False, "m1", from_offsets=cut, follow="old",
                     follow_offsets=cut, hold=True)
    gate = StartGate(tmp_path, "new")
    write_ack(tmp_path, "old", "s", {0: 10}, GateState("capped", cut, 2, retire="m1"))
    write_ack(tmp_path, "new", "s", {0: 10}, GateState("capped", cut, 3, follow="old"))
    # the old query handed over: without hold the batch from the cut would go out now
    assert not gate.is_open(7, wait=False) and gate.at_cut()
    write_start_gate(tmp_path, "new", True, "m1")  # the migrator, after the propagation
    assert gate.is_open(7, wait=False)


# -- the downstream shadow's source --------------------------------------------------------

def test_the_switch_file_round_trips_and_a_malformed_one_names_the_field(tmp_path):
    write_switch(tmp_path, "b.g1", topic="t", side="t.shadow", side_from={0: 5})
    assert read_switch(tmp_path, "b.g1") == {"topic": "t", "side": "t.shadow",
                                            "side_from": {0: 5}}
    assert read_switch(tmp_path, "b.g1", "other") is None
    assert read_switch(tmp_path, "nobody") is None
    write_switch(tmp_path, "b.g1", topic="t", side="t.shadow", side_from={0: 5},
                 side_end={0: 40}, at={0: 7, 1: 9})
    assert read_switch(tmp_path, "b.g1", "t")["at"] == {0: 7, 1: 9}
    doc = json.loads((tmp_path / "gates" / "b.g1.switch.json").read_text())
    doc["at"] = {"0": "x"}
    (tmp_path / "gates" / "b.g1.switch.json").write_text(json.dumps(doc))
    with pytest.raises(GateStateError) as e:
        read_switch(tmp_path, "b.g1")
    assert e.value.pointer == "/at"
    with pytest.raises(GateStateError):
        write_switch(tmp_path, "b.g1", topic="t", side="t", side_from={})


class FakeKafka:
    """The broker as the gated source's driver side sees it: partitions and end offsets."""

    def __init__(self, ends: dict[str, dict[int, int]]) -> None:
        self.ends = ends

    def install(self, monkeypatch) -> None:
        import gates.source as src

        monkeypatch.setattr(src, "_kafka_partitions",
                            lambda opts, timeout=15.0: sorted(self.ends[opts.topic]))

        def offsets(opts, parts, which, timeout=15.0):
            return {p: 0 if which == "earliest" else self.ends[opts.topic][p] for p in parts}

        monkeypatch.setattr(src, "_list_offsets", offsets)


def test_the_downstream_shadow_reads_the_side_topic_then_the_topic_from_the_cut(
        tmp_path, monkeypatch):
    from gates.source import BackfillStreamReader, TheseusKafkaSource

    kafka = FakeKafka({"t.shadow": {0: 30}, "t": {0: 50, 1: 60}})
    kafka.install(monkeypatch)
    write_switch(tmp_path, "b.g1", topic="t", side="t.shadow", side_from={0: 2})
    source = TheseusKafkaSource({"bootstrap": "x:1", "topic": "t", "format": "json",
                                 "schema": "k STRING, x BIGINT", "store": str(tmp_path),
                                 "query": "b.g1", "node": "in",
                                 "maxRecordsPerBatch": "0"})
    reader = source.streamReader(None)
    assert isinstance(reader, BackfillStreamReader)
    first = reader.initialOffset()
    assert first == {"t.shadow": {"0": 2}}  # where the upstream shadow's output starts
    end = reader.latestOffset(first, None)
    assert end == {"t.shadow": {"0": 30}}
    assert [(r.topic, r.partition, r.start, r.end) for r in reader.partitions(first, end)] \
        == [("t.shadow", 0, 2, 30)]
    # the upstream's hand-over: its pre-cut output ends at 36, the cut in t is {0: 44, 1: 51}
    kafka.ends["t.shadow"][0] = 38  # (a later run of the upstream shadow: not ours)
    write_switch(tmp_path, "b.g1", topic="t", side="t.shadow", side_from={0: 2},
                 side_end={0: 36}, at={0: 44, 1: 51})
    # the batch that reads the side topic's tail enters t at the cut, reading none of it
    entry = reader.latestOffset(end, None)
    assert entry == {"t.shadow": {"0": 36}, "t": {"0": 44, "1": 51}}
    assert [(r.topic, r.partition, r.start, r.end) for r in reader.partitions(end, entry)] \
        == [("t.shadow", 0, 30, 36)]  # nothing of t before the cut is read
    assert not is_acked(tmp_path, "b.g1", {"t": {0: 44, 1: 51}})  # its output: pre-cut
    # from then on the real topic, acknowledged from the cut: the start gate opens there
    nxt = reader.latestOffset(entry, None)
    assert is_acked(tmp_path, "b.g1", {"t": {0: 44, 1: 51}})
    assert nxt == {"t.shadow": {"0": 36}, "t": {"0": 50, "1": 60}}
    assert [(r.topic, r.partition, r.start, r.end) for r in reader.partitions(entry, nxt)] \
        == [("t", 0, 44, 50), ("t", 1, 51, 60)]
    assert reader.latestOffset(nxt, None) is nxt  # nothing new: the same offsets
    # a reader already at the side topic's end when the switch arrives enters on its own
    write_switch(tmp_path, "b.g1", topic="t", side="t.shadow", side_from={0: 2})
    again = TheseusKafkaSource({"bootstrap": "x:1", "topic": "t", "format": "json",
                                "schema": "k STRING, x BIGINT", "store": str(tmp_path),
                                "query": "b.g1", "node": "in"}).streamReader(None)
    at_end = {"t.shadow": {"0": 36}}
    assert again.latestOffset(at_end, None) == {"t.shadow": {"0": 38}}  # not known: reads on
    write_switch(tmp_path, "b.g1", topic="t", side="t.shadow", side_from={0: 2},
                 side_end={0: 36}, at={0: 44, 1: 51})
    assert again.latestOffset(at_end, None) == {"t.shadow": {"0": 36},
                                                "t": {"0": 44, "1": 51}}
    # a query without a switch file reads the topic plainly
    plain = TheseusKafkaSource({"bootstrap": "x:1", "topic": "t", "format": "json",
                                "schema": "k STRING", "store": str(tmp_path),
                                "query": "other"}).streamReader(None)
    assert not isinstance(plain, BackfillStreamReader)


def test_a_tail_cut_short_by_the_batch_limit_does_not_enter_the_topic_yet(tmp_path,
                                                                         monkeypatch):
    """A batch that stops short of where the upstream shadow's output before the cut ends
    (``maxRecordsPerBatch``) must not enter the real topic: the batch after it would mix
    input from before and from the cut."""
    from gates.source import TheseusKafkaSource

    FakeKafka({"t.shadow": {0: 30}, "t": {0: 50, 1: 60}}).install(monkeypatch)
    write_switch(tmp_path, "b.g1", topic="t", side="t.shadow", side_from={0: 0},
                 side_end={0: 30}, at={0: 44, 1: 51})
    reader = TheseusKafkaSource({"bootstrap": "x:1", "topic": "t", "format": "json",
                                 "schema": "k STRING, x BIGINT", "store": str(tmp_path),
                                 "query": "b.g1", "node": "in",
                                 "maxRecordsPerBatch": "20"}).streamReader(None)
    from gates.source import ReadMaxRows

    limit = ReadMaxRows(20)
    first = reader.latestOffset({"t.shadow": {"0": 0}}, limit)
    assert first == {"t.shadow": {"0": 20}}
    assert reader.latestOffset(first, limit) == {"t.shadow": {"0": 30},
                                                 "t": {"0": 44, "1": 51}}


# -- abort -------------------------------------------------------------------------------

def abortable_cascade(tmp_path, a_phase: str, a_cut: dict | None = None):
    from compat.serde import dumps

    store = DirectoryStore(tmp_path)
    docs = {"a": up_plan("a"), "b": down_plan("b")}
    for q, doc in docs.items():
        store.put_plan(q, dumps(from_doc(doc)))
        (tmp_path / f"{q}.json").write_text(json.dumps(doc))
    a = Migration(id="ma", query="a", new_plan=str(tmp_path / "a.json"), old_instance="a",
                  new_instance="a.g1", cascade="c1", feeds=["mb"], kind="shadow",
                  phase=a_phase, cut=a_cut or {})
    b = Migration(id="mb", query="b", new_plan=str(tmp_path / "b.json"), old_instance="b",
                  new_instance="b.g1", cascade="c1", cut_from="ma", kind="shadow",
                  phase="cut" if a_cut else "pause")
    for m in (a, b):
        m.save(store)
    Cascade(id="c1", migrations=["ma", "mb"], queries=["a", "b"],
            links=[{"upstream": "a", "downstream": "b", "topic": "t"}]).save(store)
    return store


def test_abort_before_the_upstream_hand_over_aborts_every_query_of_the_chain(tmp_path,
                                                                              monkeypatch):
    from gates.state import read_gate

    store = abortable_cascade(tmp_path, "pause")
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(Processes, "wait_stopped",
                        lambda self, m, seconds=30.0: events.append(("stopped", m.query)))
    monkeypatch.setattr(TopicAdmin, "delete_side_topic",
                        lambda self, m: events.append(("deleted", m.query)))
    m = cascade.abort(store, "c1", echo=lambda s: None, query="b")
    # the upstream's side topic goes too (it feeds the chain), and only once every shadow
    # of the chain stopped: the downstream shadow reads it
    assert events[:2] == [("stopped", "a"), ("stopped", "b")]
    assert ("deleted", "a") in events[2:]
    assert m.query == "b" and m.phase == "aborted"
    assert Migration.load(store, "ma").phase == "aborted"
    assert Cascade.load(store, "c1").phase == "aborted"
    assert read_gate(tmp_path, "a").mode == read_gate(tmp_path, "b").mode == "open"
    assert store.stop_requested("a.g1") and store.stop_requested("b.g1")


def test_abort_after_the_upstream_old_query_finished_its_input_refuses_and_touches_nothing(
        tmp_path):
    cut = {"s": {"0": 10}}
    store = abortable_cascade(tmp_path, "propagate", a_cut=cut)
    from gates.state import write_gate

    at_cut = GateState("capped", {"s": {0: 10}}, 5, retire="ma")  # the cut retires it
    write_gate(tmp_path, "a", at_cut)
    write_ack(tmp_path, "a", "s", {0: 10}, at_cut)
    with pytest.raises(Refused, match="resume finishes"):
        cascade.abort(store, "c1", echo=lambda s: None, query="a")
    assert Migration.load(store, "ma").phase == "propagate"
    assert Migration.load(store, "mb").phase == "cut"
    assert not store.stop_requested("b.g1")
    assert Cascade.load(store, "c1").phase == "running"


# -- the downstream adopts the propagated cut ------------------------------------------------

def adopting(tmp_path, monkeypatch, seconds: float):
    """A downstream migration at step 4 whose old query 'b' reads topic t, with its
    upstream's propagated cut C = {t: {0: 7, 1: 3}}; no services."""
    from types import SimpleNamespace

    from gates.deadline import Deadline
    from migrate import sides

    store = DirectoryStore(tmp_path)
    m = Migration(id="mb", query="b", new_plan="b.json", old_instance="b",
                  new_instance="b.g1", cascade="c1", cut_from="ma", kind="shadow",
                  phase="cut")
    m.save(store)
    up = SimpleNamespace(id="ma", phase="cutover", out_cut={"t": {"0": 7, "1": 3}},
                         side_from={"0": 0, "1": 0}, side_end={"0": 5, "1": 2})
    monkeypatch.setattr(sides, "output_topic", lambda m: "t")
    monkeypatch.setattr(sides, "compare_topic", lambda m: "t.shadow")
    monkeypatch.setattr(sides, "instance_topics",
                        lambda store, m: {"b": ["t"], "b.g1": ["t"]})
    monkeypatch.setattr(sides, "reconcile_spec", lambda m: None)
    ctx = Context(store, lambda s: None, deadline=Deadline(seconds))
    ctx.records["ma"] = up  # type: ignore[assignment]
    return store, m, ctx


def test_an_idle_old_downstream_at_the_cut_hands_over_without_a_new_acknowledgement(
        tmp_path, monkeypatch):
    """The old downstream query read everything before C while it was still open (the
    upstream's old query retired, its new one holds): once capped it handed over at once,
    and its host stopped it before it acknowledged the new epoch. Adopting the cut must not
    wait for that acknowledgement (a CI run waited out its whole budget)."""
    from gates.state import read_gate, retired

    store, m, ctx = adopting(tmp_path, monkeypatch, 5)
    write_ack(tmp_path, "b", "t", {0: 7, 1: 3}, GateState())  # open, epoch 0, at C
    runner.step(m, ctx)
    assert m.phase == "align" and m.cut == {"t": {"0": 7, "1": 3}}
    g = read_gate(tmp_path, "b")
    assert (g.mode, g.cap, g.retire) == ("capped", {"t": {0: 7, 1: 3}}, "mb")
    assert retired(tmp_path, "b")  # its sink writes nothing more from here on


def test_an_old_downstream_that_read_the_propagated_control_event_hands_over(
        tmp_path, monkeypatch):
    """Its pause lifted while the migrator was dead (killed after the upstream's
    propagation), the old downstream read its topic to the end: the last record there is
    the control event the upstream propagated at C, so it acknowledged C + 1 and no row
    past the cut. Its cap at the adopted cut says the cut is control events, so it hands
    over there; a fresh-clone CI run waited out its whole budget at the start gate."""
    from gates.state import read_gate, retired

    store, m, ctx = adopting(tmp_path, monkeypatch, 5)
    write_ack(tmp_path, "b", "t", {0: 8, 1: 4}, GateState())  # open: read the events
    runner.step(m, ctx)
    assert m.phase == "align" and m.cut == {"t": {"0": 7, "1": 3}}
    g = read_gate(tmp_path, "b")
    assert (g.mode, g.cap, g.retire, g.marks) == ("capped", {"t": {0: 7, 1: 3}}, "mb", True)
    assert retired(tmp_path, "b")


def test_an_old_downstream_short_of_the_cut_is_waited_for(tmp_path, monkeypatch):
    from compat.errors import DeadlineExceeded

    store, m, ctx = adopting(tmp_path, monkeypatch, 1.5)
    write_ack(tmp_path, "b", "t", {0: 7, 1: 2}, GateState())  # one record short on p1
    with pytest.raises(DeadlineExceeded, match="'b' to see the propagated cut"):
        runner.step(m, ctx)
    assert m.phase == "cut"


def test_an_old_downstream_that_read_its_cap_short_of_the_cut_lets_the_upstream_go_on(
        tmp_path, monkeypatch):
    """Under the cap it plans no batch past C: the upstream's new query may write past C
    while it finishes its input before C (the alignment waits for that)."""
    import threading

    from gates.state import read_gate

    store, m, ctx = adopting(tmp_path, monkeypatch, 5)
    write_ack(tmp_path, "b", "t", {0: 5, 1: 1}, GateState())

    def source_reads_the_cap():  # the old query's next trigger, short of C
        for _ in range(100):
            g = read_gate(tmp_path, "b")
            if g.mode == "capped":
                write_ack(tmp_path, "b", "t", {0: 6, 1: 2}, g)
                return
            threading.Event().wait(0.05)

    t = threading.Thread(target=source_reads_the_cap)
    t.start()
    runner.step(m, ctx)
    t.join()
    assert m.phase == "align"
    assert not is_acked(tmp_path, "b", {"t": {0: 7, 1: 3}})  # it has not reached C


# -- the chain's hand-over: every wait as early as its condition allows ----------------------

def handing_over(tmp_path, monkeypatch):
    """The upstream 'a' (shadow 'a.g1') cut at C = {s: {0: 10}} and armed, feeding 'b'
    (shadow 'b.g1') through t; the driver's records and context. No services: t.shadow's
    end is 36."""
    from gates.deadline import Deadline

    cut = {"s": {"0": 10}}
    store = abortable_cascade(tmp_path, "align", a_cut=cut)
    monkeypatch.setattr(TopicAdmin, "high_watermarks",
                        lambda self, bootstrap, topics: {t: {0: 36} for t in topics})
    c = Cascade.load(store, "c1")
    d = Driver(store, c, lambda s: None, Deadline(5))
    ua, db = d.order
    assert d.ctx.record(db.cut_from) is ua  # one record in memory per migration
    d.ctx.gates.arm(ua, _cut(cut))
    return store, ua, db, d.ctx


def _cut(doc):
    return {t: {int(p): o for p, o in ps.items()} for t, ps in doc.items()}


def test_an_upstream_propagates_once_its_old_query_finished_not_waiting_for_its_shadow(
        tmp_path, monkeypatch):
    """Its output topic ends there (the old query retired, the new one holds its output),
    so the downstream's old query can be capped while the shadow finishes; the shadow's
    alignment is awaited before its output from the cut may be written."""
    from compat.errors import DeadlineExceeded
    from gates.deadline import Deadline
    from gates.startgate import read_start_gate

    store, ua, db, ctx = handing_over(tmp_path, monkeypatch)
    write_ack(tmp_path, "a", "s", {0: 10}, GateState("capped", {"s": {0: 10}}, 1,
                                                     retire="ma"))
    runner.step(ua, ctx)
    assert ua.phase == "propagate" and "old_at_cut" in [h[0] for h in ua.history]
    assert not is_acked(tmp_path, "a.g1", {"s": {0: 10}})  # the shadow still finishing
    # the cutover does not open the shadow's output before it finished the input before C
    ua.phase, ua.out_cut = "cutover", {"t": {"0": 7, "1": 3}}
    with pytest.raises(DeadlineExceeded, match="'a.g1' to reach the cut"):
        runner.step(ua, Context(store, lambda s: None, deadline=Deadline(0.6)))
    assert read_start_gate(tmp_path, "a.g1")["open"] is False
    assert not ua.side_end


def test_the_old_downstream_is_capped_before_the_upstream_shadow_reaches_its_cut(
        tmp_path, monkeypatch):
    """The downstream adopts the propagated cut: its old query is capped at once; the
    shadow's switch (where the upstream shadow's output before the cut ends) is written as
    soon as that shadow finished the input before C, and recorded in the upstream's
    migration (the driver's own record of it, so that no later save loses it)."""
    import threading

    from gates.cascade import read_switch
    from gates.state import read_gate

    store, ua, db, ctx = handing_over(tmp_path, monkeypatch)
    ua.phase, ua.out_cut = "cutover", {"t": {"0": 7, "1": 3}}
    ctx.save(ua)
    db.phase = "cut"
    seen: dict = {}

    def queries():
        for _ in range(200):  # the old downstream capped, the upstream shadow short of C
            g = read_gate(tmp_path, "b")
            if g.mode == "capped":
                seen["cap"] = (g.cap, g.retire)
                seen["switch_before"] = read_switch(tmp_path, "b.g1") or {}
                break
            threading.Event().wait(0.02)
        threading.Event().wait(0.2)
        write_ack(tmp_path, "a.g1", "s", {0: 10}, GateState("capped", {"s": {0: 10}}, 2,
                                                            follow="a"))
        write_ack(tmp_path, "b", "t", {0: 5, 1: 3}, read_gate(tmp_path, "b"))  # reads it

    t = threading.Thread(target=queries)
    t.start()
    runner.step(db, ctx)
    t.join()
    assert seen["cap"] == ({"t": {0: 7, 1: 3}}, "mb")
    assert "side_end" not in seen["switch_before"]  # capped before the shadow was there
    sw = read_switch(tmp_path, "b.g1")
    assert (sw["side_end"], sw["at"]) == ({0: 36}, {0: 7, 1: 3})
    assert ua.side_end == {"0": 36} == Migration.load(store, "ma").side_end
    marks = [h[0] for h in db.history]
    assert marks.index("capped") < marks.index("switch") < marks.index("seen")
    assert db.phase == "align"


@pytest.mark.parametrize("spacing, batches", [
    # cold first (2 s a batch under a 1 s trigger), then at the trigger's pace: waited for
    # until 3 batches in a row keep it
    ([2.0, 2.0, 1.0, 1.5, 1.0, 1.0, 1.0], 7),
    # never at the pace: not waited for beyond 3 x 3 batches near the head
    ([2.0] * 12, 9),
])
def test_the_downstream_shadow_is_cut_only_once_it_keeps_the_trigger_pace(
        tmp_path, monkeypatch, spacing, batches):
    import migrate.phases.pause as pause_phase
    from migrate.services.processes import Processes

    store = DirectoryStore(tmp_path)
    m = Migration(id="mb", query="b", new_plan="b.json", old_instance="b",
                  new_instance="b.g1", cascade="c1", cut_from="ma", kind="shadow",
                  phase="pause", trigger="1 second")
    write_switch(tmp_path, "b.g1", topic="t", side="t.shadow", side_from={0: 0})
    ctx = Context(store, lambda s: None, steady_batches=3)
    times = [100.0]
    for d in spacing:
        times.append(times[-1] + d)
    looks = {"n": 0, "planned": 0}

    def read_ack(root, inst):  # each look sees the next batch planned, at the lag head
        i = min(looks["n"], len(times) - 1)
        looks["n"] += 1
        looks["planned"] = i
        return {"topics": {"t.shadow": {"offsets": {"0": 500}, "time": times[i]}}}

    monkeypatch.setattr(pause_phase, "read_ack", read_ack)
    monkeypatch.setattr(Processes, "running", lambda self, inst: True)
    monkeypatch.setattr(TopicAdmin, "high_watermarks",
                        lambda self, bootstrap, topics: {"t.shadow": {0: 600}})

    def wait(self, m, what, cond, interval=0.2, show=True):
        while not cond():
            assert looks["n"] < 50, "never done"

    monkeypatch.setattr(Context, "wait", wait)
    runner.step(m, ctx)
    assert looks["planned"] == batches and m.phase == "cut"


def test_the_propagated_cut_is_written_with_a_producer_created_while_the_old_query_finished(
        tmp_path, monkeypatch):
    """An idempotent producer sends nothing for its first half second (librdkafka asks for
    its producer id again 500 ms after it is created): the upstream creates it before it
    waits for its old query at the cut, and propagates with it."""
    import gates.control as gc

    store, ua, db, ctx = handing_over(tmp_path, monkeypatch)
    made: list = []
    monkeypatch.setattr(gc, "control_producer",
                        lambda bootstrap, deadline: made.append(object()) or made[-1])
    used: list = []

    def write(bootstrap, topics, mid, deadline, producer=None, bare_topics=(),
              keyless_topics=()):
        used.append(producer)
        return {"t": {0: 7, 1: 3}}

    monkeypatch.setattr(gc, "write_control_events", write)
    before = {"made": None}

    def old_reaches_the_cut():  # the old query finishes after the producer exists
        before["made"] = len(made)
        write_ack(tmp_path, "a", "s", {0: 10}, GateState("capped", {"s": {0: 10}}, 1,
                                                         retire="ma"))

    real_wait = Context.wait

    def wait(self, m, what, cond, interval=0.2, show=True):
        if what == "'a' to reach the cut":
            old_reaches_the_cut()
        return real_wait(self, m, what, cond, interval, show)

    monkeypatch.setattr(Context, "wait", wait)
    runner.step(ua, ctx)  # 5. align
    runner.step(ua, ctx)  # propagate
    assert before["made"] == 1 and used == made and ua.id not in ctx.producers
    assert ua.out_cut == {"t": {"0": 7, "1": 3}} and ua.phase == "cutover"


# -- the control records' tombstones ------------------------------------------------------

@pytest.mark.parametrize("role", ["upstream", "middle", "downstream"])
def test_each_query_of_a_chain_tombstones_the_control_records_it_wrote(tmp_path, monkeypatch,
                                                                      role):
    """The head of a chain wrote its cut (its sources) and its propagated cut (its output);
    a query in the middle of a longer chain only its propagated cut (its own cut is its
    upstream's); the last one nothing."""
    import gates.control

    wrote: list[dict] = []
    monkeypatch.setattr(gates.control, "tombstone_control_events",
                        lambda bootstrap, mid, where, deadline, keyless_topics=():
                        wrote.append(where) or 1)
    src, mid_t, out_t = {"s": {"0": 4}}, {"t": {"0": 9, "1": 3}}, {"u": {"0": 7}}
    m = {"upstream": Migration(id="ma", query="a", new_plan="a.json", old_instance="a",
                               cut=src, out_cut=mid_t, feeds=["mb"]),
         "middle": Migration(id="mb", query="b", new_plan="b.json", old_instance="b",
                             cut=mid_t, out_cut=out_t, cut_from="ma", feeds=["mc"]),
         "downstream": Migration(id="mc", query="c", new_plan="c.json", old_instance="c",
                                 cut=out_t, cut_from="mb")}[role]
    Context(DirectoryStore(tmp_path), lambda s: None).topics.tombstone_controls(m)
    want = {"upstream": [{"s": {0: 4}, "t": {0: 9, 1: 3}}], "middle": [{"u": {0: 7}}],
            "downstream": []}[role]
    assert wrote == want
