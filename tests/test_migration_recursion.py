"""Issue 14: the live migration of a recursive query, step by step without services.

The loop query -> internal topic -> output query of each side is cut like a cascade's
upstream -> downstream: step 4 caps the loops at the sources' cut C (not the output
queries, which read the internal topic under the instance's own gate); step 5 waits until
both loops acknowledged C, writes one control event into every partition of each internal
topic (C' old, C'' new), caps the old output query at C' (retiring it) and the shadow's at
C'' following it, its start gate opening from C'', and only then lifts the shadow loop's
cap.  What the protocol does not cover is refused with the reason."""

from __future__ import annotations

import copy
import json
import os

import pytest

from compat.errors import DeadlineExceeded, InvalidRequest, Refused, Unsupported
from compat.serde import dumps, from_doc
from gates.startgate import read_start_gate
from gates.state import GateState, read_gate, write_ack
from migrate import migration, runner, sides
from migrate.context import Context
from migrate.phases import align as align_phase
from migrate.phases import check as check_phase
from migrate.phases import rollback
from migrate.phases.check import recursion_problem
from migrate.record import Migration
from migrate.runner import HANDLERS
from migrate.services.arming import GateArming
from migrate.services.topics import TopicAdmin
from migrate.store import DirectoryStore
from tests.recursion_util import plan

LOOPS = {"q": {"closure": {"gate": "q.closure.loop", "topic": "T.old"}},
         "q.g1": {"closure": {"gate": "q.g1.closure.loop", "topic": "T.new"}}}
C = {"edges": {"0": 10, "1": 7}}
C1 = {"T.old": {0: 40, 1: 33}}  # C': just past the control events in the old loop's topic
C2 = {"T.new": {0: 41, 1: 35}}  # C'': in the shadow loop's


def setup(tmp_path, phase: str, *, loops: bool = True, **fields) -> tuple[DirectoryStore,
                                                                          Migration]:
    store = DirectoryStore(tmp_path / "state")
    store.put_plan("q", dumps(from_doc(plan("q", "edges", "out", False))))
    for inst in ("q", "q.g1"):
        store.set_status(inst, status="running", pid=os.getpid(),
                         **({"loops": LOOPS[inst]} if loops else {}))
    new = tmp_path / "new.json"
    new.write_text(json.dumps(plan("q", "edges", "out", True)))
    m = Migration(id="m1", query="q", new_plan=str(new), old_instance="q",
                  new_instance="q.g1", generation=1, kind="shadow", phase=phase,
                  bootstrap="unused:9092", **{"reconcile": "off", **fields})
    m.save(store)
    return store, m


class ControlEvents:
    """``gates.control.write_control_events`` without Kafka: C' and C'' by topic."""

    def __init__(self, monkeypatch, order: list) -> None:
        import gates.control

        self.calls: list[list[str]] = []
        self.order = order
        monkeypatch.setattr(gates.control, "write_control_events", self)

    def __call__(self, bootstrap, topics, mid, deadline=None):
        self.calls.append(list(topics))
        self.order.append(("control events", tuple(topics)))
        # the control events' offsets: the old loop's at 39 and 32 (C' is just past them)
        return {t: {p: o - 1 if t in C1 else o for p, o in (C1 | C2)[t].items()}
                for t in topics}


def record_order(monkeypatch, order: list) -> None:
    """Every gate the migrator sets, and every start gate it writes, in order."""
    real_set, real_start = GateArming.set, align_phase.write_start_gate

    def set_gate(self, m, instance, mode, cap=None, follow=None, retire=None):
        order.append(("gate", instance, mode))
        return real_set(self, m, instance, mode, cap, follow, retire)

    def write_start_gate(store, instance, is_open, *a, **k):
        order.append(("start gate", instance, bool(k.get("from_offsets"))))
        return real_start(store, instance, is_open, *a, **k)

    monkeypatch.setattr(GateArming, "set", set_gate)
    monkeypatch.setattr(align_phase, "write_start_gate", write_start_gate)


def cutover_ends_it(monkeypatch) -> None:
    """Steps 6 and 7 without services: nothing happens after step 5."""
    for phase in ("cutover", "finish"):
        monkeypatch.setitem(HANDLERS, phase, lambda m, ctx: None)


def ack(store, gate: str, offsets: dict, state: GateState | None = None) -> None:
    for topic, parts in offsets.items():
        write_ack(store.root, gate, topic, {int(p): o for p, o in parts.items()},
                  state or GateState())


def ints(doc: dict) -> dict:
    return {t: {int(p): o for p, o in ps.items()} for t, ps in doc.items()}


# ------------------------------------------------------------------------- step 1

def doc_with(extra_nodes: list[dict], sink_input: str | None = None) -> dict:
    doc = plan("q", "edges", "out", False)
    doc["nodes"][-1:-1] = extra_nodes
    if sink_input:
        doc["nodes"][-1]["inputs"] = [sink_input]
    return doc


def test_one_recursive_step_read_only_by_the_output_query_can_be_cut():
    assert recursion_problem(from_doc(plan("q", "e", "o", True))) is None
    flat = copy.deepcopy(plan("q", "e", "o", False))
    flat["nodes"] = [n for n in flat["nodes"] if n["step"] != "recursive"]
    flat["nodes"][-2]["inputs"] = ["base"]
    assert recursion_problem(from_doc(flat)) is None  # no recursion: nothing to say


def test_two_recursive_steps_are_refused_naming_both():
    doc = plan("q", "e", "o", False)
    second = copy.deepcopy(doc["nodes"][2])
    second["id"] = "closure2"
    union = {"id": "both", "step": "union", "version": 1, "inputs": ["closure", "closure2"]}
    doc["nodes"][3]["inputs"] = ["both"]
    doc["nodes"][3:3] = [second, union]
    node, pointer, reason = recursion_problem(from_doc(doc))
    assert node == "closure2" and pointer == "/nodes/3"
    assert "2 recursive steps (closure, closure2)" in reason
    assert "one recursive step per plan" in reason


def test_an_output_query_reading_a_stream_besides_the_loop_is_refused():
    doc = plan("q", "e", "o", False)
    doc["nodes"][3:3] = [
        {"id": "more", "step": "source", "version": 1, "topic": "more_edges",
         "partitions": 1, "format": "json", "role": "stream",
         "schema": [{"name": "anc", "type": "string"}, {"name": "node", "type": "string"}]},
        {"id": "both", "step": "union", "version": 1, "inputs": ["closure", "more"]}]
    doc["nodes"][5]["inputs"] = ["both"]
    node, pointer, reason = recursion_problem(from_doc(doc))
    assert (node, pointer) == ("more", "/nodes/3")
    assert "'more_edges'" in reason and "recursive step 'closure'" in reason


def check(store, m, monkeypatch, lines) -> None:
    for name in ("require_access", "require_history"):  # Kafka: not here
        monkeypatch.setattr(check_phase, name, lambda *a: None)
    monkeypatch.setattr(check_phase, "preflight", lambda *a: {})
    monkeypatch.setattr(check_phase, "checkpoint_agrees", lambda *a: True)
    runner.step(m, Context(store, lines.append, 60))


def test_a_changed_body_goes_live_through_a_shadow_without_reconciliation(tmp_path,
                                                                           monkeypatch):
    store, m = setup(tmp_path, "check", reconcile="auto")
    lines: list[str] = []
    check(store, m, monkeypatch, lines)
    assert (m.verdict, m.kind, m.phase, m.reconciling) == ("migrate", "shadow", "shadow",
                                                           False)
    assert any("no reconciliation: a plan with a recursive step" in ln for ln in lines)


def test_reconcile_on_is_refused_with_the_reason(tmp_path, monkeypatch):
    store, m = setup(tmp_path, "check", reconcile="on")
    with pytest.raises(InvalidRequest) as e:
        check(store, m, monkeypatch, [])
    assert "cannot reconcile the output: a plan with a recursive step" in str(e.value)
    assert m.phase == "refused"


def test_an_old_query_that_does_not_record_its_loop_must_be_restarted_first(tmp_path,
                                                                           monkeypatch):
    store, m = setup(tmp_path, "check", loops=False)
    with pytest.raises(Refused) as e:
        check(store, m, monkeypatch, [])
    assert "restart it with theseus run" in str(e.value)
    assert m.phase == "refused" and "does not record its loop" in m.error


def test_a_refusal_names_the_plan_file_node_and_pointer(tmp_path, monkeypatch):
    store, m = setup(tmp_path, "check")
    doc = plan("q", "edges", "out", True)
    second = copy.deepcopy(doc["nodes"][2])
    second["id"] = "closure2"
    doc["nodes"][3]["inputs"] = ["both"]
    doc["nodes"][3:3] = [second, {"id": "both", "step": "union", "version": 1,
                                  "inputs": ["closure", "closure2"]}]
    with open(m.new_plan, "w") as f:
        json.dump(doc, f)
    with pytest.raises(Unsupported) as e:
        check(store, m, monkeypatch, [])
    assert e.value.file == m.new_plan and e.value.node == "closure2"
    assert e.value.pointer == "/nodes/3" and m.phase == "refused"


# ------------------------------------------------------------------------- steps 3 to 5

def test_pause_and_cut_cap_the_loops_not_the_output_queries(tmp_path, monkeypatch):
    store, m = setup(tmp_path, "cut", high={"edges": {"0": 9, "1": 7}})
    import gates.control

    monkeypatch.setattr(gates.control, "write_control_events",
                        lambda *a, **k: {"edges": {0: 10, 1: 7}})
    assert sides.instance_topics(store, m) == {"q.closure.loop": ["edges"],
                                               "q.g1.closure.loop": ["edges"]}
    runner.step(m, Context(store, lambda s: None, 60))
    assert m.cut == C and m.phase == "align"
    for gate in ("q.closure.loop", "q.g1.closure.loop"):
        g = read_gate(store.root, gate)
        assert (g.mode, g.cap, g.follow, g.retire) == ("capped", ints(C), None, None)
    # the output queries read their loop's topic: no cap on them yet, the start gate shut
    assert read_gate(store.root, "q").mode == "open"
    assert read_gate(store.root, "q.g1").mode == "open"
    assert read_start_gate(store.root, "q.g1").get("from") is None


def test_align_cuts_the_internal_topics_only_after_the_loops_reached_c(tmp_path,
                                                                      monkeypatch):
    store, m = setup(tmp_path, "align", cut=C)
    order: list = []
    events = ControlEvents(monkeypatch, order)
    record_order(monkeypatch, order)
    ack(store, "q.closure.loop", C)  # the old loop is there, the shadow's not yet
    with pytest.raises(DeadlineExceeded) as e:
        runner.run(m, Context(store, lambda s: None, 1.5))
    assert "'q.g1.closure.loop' to reach the cut" in str(e.value)
    # the old loop's topic is cut (C' recorded before anything acts on it), the shadow's
    # not: its loop may still be writing rows derived from input before C
    assert events.calls == [["T.old"]]
    assert migration.current(store, "q").output_cuts == {"old": {"T.old": {"0": 40,
                                                                             "1": 33}}}
    assert read_gate(store.root, "q").mode == "open"  # no output query capped yet

    ack(store, "q.g1.closure.loop", C)
    ack(store, "q", C1)  # both output queries read their topics to the cut
    ack(store, "q.g1", C2)
    order.clear()
    lines: list[str] = []
    m = migration.current(store, "q")
    cutover_ends_it(monkeypatch)
    runner.run(m, Context(store, lines.append, 5))
    assert events.calls == [["T.old"], ["T.new"]]  # the old topic is not cut twice
    assert m.output_cuts == {"old": {"T.old": {"0": 40, "1": 33}},
                             "new": {"T.new": {"0": 41, "1": 35}}}
    assert "  cut the new loop's topic: C'' = " + json.dumps(m.output_cuts["new"]) in lines
    g_old, g_new = read_gate(store.root, "q"), read_gate(store.root, "q.g1")
    assert (g_old.mode, g_old.cap, g_old.retire) == ("capped", C1, "m1")
    assert (g_new.mode, g_new.cap, g_new.follow) == ("capped", C2, "q")
    start = read_start_gate(store.root, "q.g1")
    assert (start["open"], ints(start["from"]), start["follow"], ints(start["follow_from"])) \
        == (False, C2, "q", C1)
    assert read_gate(store.root, "q.g1.closure.loop").mode == "open"
    assert read_gate(store.root, "q.closure.loop").mode == "capped"  # the old loop stays
    # the shadow's loop is let past C only once its output query is armed at C''
    assert order == [("control events", ("T.new",)), ("start gate", "q.g1", True),
                     ("gate", "q", "capped"), ("gate", "q.g1", "capped"),
                     ("gate", "q.g1.closure.loop", "open")]


def test_align_waits_for_both_output_queries_at_their_cuts(tmp_path, monkeypatch):
    store, m = setup(tmp_path, "align", cut=C,
                     output_cuts={"old": {"T.old": {"0": 40, "1": 33}},
                                  "new": {"T.new": {"0": 41, "1": 35}}})
    order: list = []
    events = ControlEvents(monkeypatch, order)
    ack(store, "q", {"T.old": {0: 40, 1: 32}})  # one partition short of C'
    ack(store, "q.g1", C2)
    with pytest.raises(DeadlineExceeded) as e:
        runner.run(m, Context(store, lambda s: None, 1.5))
    assert "'q' to reach its cut" in str(e.value)
    assert events.calls == []  # resumed past 5b: no control events again
    assert migration.current(store, "q").phase == "align"


def test_a_shadow_without_recursion_is_cut_at_c_and_its_start_gate_follows_c_prime(
        tmp_path, monkeypatch):
    """Old plan recursive, new plan without: the old output query retires at C', the
    shadow (which reads the edges itself) is capped at C and follows the old one there."""
    store, m = setup(tmp_path, "align", cut=C)
    flat = plan("q", "edges", "out", False)
    flat["nodes"] = [n for n in flat["nodes"] if n["step"] != "recursive"]
    flat["nodes"][-2]["inputs"] = ["base"]
    with open(m.new_plan, "w") as f:
        json.dump(flat, f)
    store.set_status("q.g1", loops={})
    ControlEvents(monkeypatch, [])
    ack(store, "q.closure.loop", C)
    ack(store, "q.g1", C)
    ack(store, "q", C1)
    cutover_ends_it(monkeypatch)
    runner.run(m, Context(store, lambda s: None, 5))
    g_new = read_gate(store.root, "q.g1")
    assert (g_new.mode, g_new.cap, g_new.follow) == ("capped", ints(C), "q")
    start = read_start_gate(store.root, "q.g1")
    assert (ints(start["from"]), ints(start["follow_from"])) == (ints(C), C1)


# ------------------------------------------------------------------------- abort

def test_abort_before_the_output_cut_reopens_the_loops(tmp_path, monkeypatch):
    store, m = setup(tmp_path, "align", cut=C)
    ctx = Context(store, lambda s: None, 5)
    ctx.gates.arm_loops(m, ints(C))
    monkeypatch.setattr(TopicAdmin, "tombstone_controls", lambda self, m: None)
    assert rollback.abort(m, ctx).phase == "aborted"
    for gate in ("q", "q.g1", "q.closure.loop", "q.g1.closure.loop"):
        assert read_gate(store.root, gate).mode == "open", gate
    assert store.stop_requested("q.g1") and not store.stop_requested("q")


def test_abort_after_the_old_output_query_reached_c_prime_is_refused(tmp_path,
                                                                     monkeypatch):
    store, m = setup(tmp_path, "align", cut=C)
    ControlEvents(monkeypatch, [])
    ack(store, "q.closure.loop", C)
    ack(store, "q.g1.closure.loop", C)
    ack(store, "q", C1)
    ack(store, "q.g1", C2)
    runner.step(m, Context(store, lambda s: None, 5))  # step 5 done
    m = migration.current(store, "q")
    m.phase = "align"  # as if killed before recording the end of step 5
    m.save(store)
    with pytest.raises(Refused) as e:
        rollback.abort(m, Context(store, lambda s: None, 5))
    assert "the old query finished the input before the cut" in str(e.value)


def test_migrate_status_shows_where_the_output_queries_are_cut(tmp_path):
    from click.testing import CliRunner

    from migrate.cli import main

    store, m = setup(tmp_path, "cutover", cut=C,
                     output_cuts={"old": {"T.old": {"0": 40, "1": 33}},
                                  "new": {"T.new": {"0": 41, "1": 35}}})
    r = CliRunner().invoke(main, ["migrate", "status", "q", "--state", str(store.root)])
    assert r.exit_code == 0, r.output
    assert '  cut C = {"edges": {"0": 10, "1": 7}}' in r.output
    assert """  old output query cut at C' = {"T.old": {"0": 40, "1": 33}}""" in r.output
    assert """  new output query cut at C'' = {"T.new": {"0": 41, "1": 35}}""" in r.output


def test_step_5_resumed_after_it_armed_everything_changes_nothing(tmp_path, monkeypatch):
    """Killed after step 5c (before the end of step 5 was recorded): resumed, it neither
    cuts the internal topics again nor re-arms a gate (a new epoch would have the loops and
    output queries acknowledge again; re-capping the shadow's loop at C would stop it)."""
    store, m = setup(tmp_path, "align", cut=C)
    order: list = []
    events = ControlEvents(monkeypatch, order)
    for gate, offsets in (("q.closure.loop", C), ("q.g1.closure.loop", C), ("q", C1),
                          ("q.g1", C2)):
        ack(store, gate, offsets)
    cutover_ends_it(monkeypatch)
    runner.run(m, Context(store, lambda s: None, 5))
    gates = {g: read_gate(store.root, g) for g in ("q", "q.g1", "q.closure.loop",
                                                    "q.g1.closure.loop")}
    m = migration.current(store, "q")
    m.phase = "align"
    m.save(store)
    record_order(monkeypatch, order)
    order.clear()
    runner.run(m, Context(store, lambda s: None, 5))
    assert events.calls == [["T.old"], ["T.new"]]  # from the first run only
    assert [o for o in order if o[0] == "gate"] == []
    assert {g: read_gate(store.root, g) for g in gates} == gates
