"""Signatures of subplans and shared subplans across the queries of a fleet."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from compat.fleet.signature import shared_subplans, signatures, source_reads
from compat.infer import analyze
from compat.serde import from_doc, to_doc
from tests.fleet_util import agg, filt, plan, proj, sink, source


def top(p) -> str:
    """The signature of the node under the sink."""
    return signatures(p)[p.sink.inputs[0]]


def test_written_differently_same_signature():
    a = plan("q1", source(), filt("f", "src", "a+b > 3"), sink("out", "f", "o1"))
    b = plan("q2", source("orders_in"), filt("keep", "orders_in", "3 < B + a"),
             sink("o", "keep", "o2"))
    assert top(a) == top(b)
    assert signatures(a)["out"] == signatures(b)["o"]  # sinks differ by topic only


def test_reordered_and_terms_and_filter_chains():
    one = plan("q1", source(), filt("f", "src", "a > 1 AND region = 'eu' AND b < 5"),
               sink("out", "f", "o1"))
    two = plan("q2", source(), filt("f", "src", "b < 5 and (a > 1 and 'eu' = region)"),
               sink("out", "f", "o2"))
    chain = plan("q3", source(), filt("f1", "src", "region = 'eu'"),
                 filt("f2", "f1", "5 > b AND 1 < a"), sink("out", "f2", "o3"))
    assert top(one) == top(two) == top(chain)


def test_filter_order_matters_only_across_a_project():
    ab = plan("q1", source(), filt("f1", "src", "a > 1"), filt("f2", "f1", "b > 2"),
              sink("out", "f2", "o"))
    ba = plan("q2", source(), filt("f1", "src", "b > 2"), filt("f2", "f1", "a > 1"),
              sink("out", "f2", "o"))
    assert top(ab) == top(ba)
    # a filter after a project that computes a column is another computation
    fp = plan("q3", source(), filt("f", "src", "a > 1"), proj("p", "f", ("x", "a + 1")),
              sink("out", "p", "o"))
    pf = plan("q4", source(), proj("p", "src", ("x", "a + 1")), filt("f", "p", "x > 1"),
              sink("out", "f", "o"))
    assert top(fp) != top(pf)


def test_aliases_and_column_order_do_not_count_in_a_prefix():
    a = plan("q1", source(), proj("p", "src", ("total", "a + b"), ("r", "upper(region)")),
             filt("f", "p", "total > 10"), sink("out", "f", "o1"))
    b = plan("q2", source(), proj("p", "src", ("R2", "UPPER(region)"), ("s", "b+a")),
             filt("f", "p", "10 < s"), sink("out", "f", "o2"))
    assert top(a) == top(b)
    # ... but the output names are data at the sink: not a complete sharing
    assert signatures(a)["out"] != signatures(b)["out"]


def test_different_semantics_different_signature():
    base = plan("q", source(), filt("f", "src", "a > 3"), sink("out", "f", "o"))
    other_topic = plan("q", source(topic="orders2"), filt("f", "src", "a > 3"),
                       sink("out", "f", "o"))
    other_const = plan("q", source(), filt("f", "src", "a > 4"), sink("out", "f", "o"))
    other_op = plan("q", source(), filt("f", "src", "a >= 3"), sink("out", "f", "o"))
    schema = [{"name": "order_id", "type": "string"}, {"name": "a", "type": "bigint"},
              {"name": "b", "type": "int"}, {"name": "region", "type": "string"},
              {"name": "ts", "type": "timestamp"}]
    other_type = plan("q", source(schema=schema), filt("f", "src", "a > 3"),
                      sink("out", "f", "o"))
    other_mode = plan("q", source(), filt("f", "src", "a > 3"),
                      {**sink("out", "f", "o"), "delivery": "at_least_once"})
    sigs = {top(p) for p in (base, other_topic, other_const, other_op, other_type)}
    assert len(sigs) == 5
    assert top(other_mode) == top(base)
    assert signatures(other_mode)["out"] != signatures(base)["out"]


def test_formatting_ids_and_partitions_do_not_count():
    a = plan("q", source(partitions=3), filt("f", "src", "a>3"), sink("out", "f", "o"))
    b = plan("other", source("s", partitions=6), {**filt("x", "s", "(A  >  3)"),
                                                  "description": "big a"},
             sink("y", "x", "o"))
    assert signatures(a)["out"] == signatures(b)["y"]


def test_aggregates_group_and_function_order():
    a = plan("q1", source(), agg("g", "src", [("r", "region"), ("o", "order_id")],
                                 [("s", "sum", ["a"]), ("n", "count", ["*"])]),
             sink("out", "g", "o1", mode="update", keys=["r", "o"]))
    b = plan("q2", source(), agg("g", "src", [("o", "order_id"), ("r", "region")],
                                 [("n", "COUNT", ["*"]), ("s", "sum", ["a"])]),
             sink("out", "g", "o2", mode="update", keys=["r", "o"]))
    c = plan("q3", source(), agg("g", "src", [("r", "region"), ("o", "order_id")],
                                 [("s", "max", ["a"]), ("n", "count", ["*"])]),
             sink("out", "g", "o3", mode="update", keys=["r", "o"]))
    assert top(a) == top(b) != top(c)


def _shared(*plans):
    return shared_subplans({p.query: p for p in plans})


def test_partial_sharing_is_maximal():
    common = [source(), filt("f", "src", "region <> 'test'"),
              proj("p", "f", ("order_id", "order_id"), ("total", "a * b"))]
    q1 = plan("q1", *common, filt("big", "p", "total > 100"), sink("out", "big", "o1"))
    q2 = plan("q2", source("in"), filt("keep", "in", "'test' <> region"),
              proj("cols", "keep", ("id", "order_id"), ("t", "b * a")),
              proj("p2", "cols", ("id", "id"), ("t2", "t * 2")), sink("out", "p2", "o2"))
    shared = _shared(q1, q2)
    assert len(shared) == 1
    (sh,) = shared
    assert sh.kind == "partial"
    assert sh.members == (("q1", "p"), ("q2", "cols"))
    assert sh.steps == 3 and sh.topics == ("orders",)
    assert sh.signature == signatures(q1)["p"]


def test_nested_sharing_reports_each_maximal_group():
    def q(name, tail):
        return plan(name, source(), filt("f", "src", "a > 0"), *tail)
    q1 = q("q1", [proj("p", "f", ("x", "a + b")), filt("g", "p", "x > 5"),
                  sink("out", "g", "o1")])
    q2 = q("q2", [proj("p", "f", ("x", "a + b")), filt("g", "p", "x > 6"),
                  sink("out", "g", "o2")])
    q3 = q("q3", [proj("p", "f", ("y", "b * 2")), sink("out", "p", "o3")])
    shared = _shared(q1, q2, q3)
    got = {(sh.kind, sh.members) for sh in shared}
    assert got == {("partial", (("q1", "f"), ("q2", "f"), ("q3", "f"))),
                   ("partial", (("q1", "p"), ("q2", "p")))}


def test_complete_sharing():
    q1 = plan("q1", source(), filt("f", "src", "a > 0"), sink("out", "f", "o1"))
    q2 = plan("q2", source("s"), filt("w", "s", "0 < a"), sink("k", "w", "o2"))
    q3 = plan("q3", source(), filt("f", "src", "a > 1"), sink("out", "f", "o3"))
    shared = _shared(q1, q2, q3)
    assert [(sh.kind, sh.members) for sh in shared] == \
        [("complete", (("q1", "out"), ("q2", "k")))]


def test_a_source_alone_is_not_shared_but_counted():
    q1 = plan("q1", source(), filt("f", "src", "a > 0"), sink("out", "f", "o1"))
    q2 = plan("q2", source(), filt("f", "src", "b > 0"), sink("out", "f", "o2"))
    assert _shared(q1, q2) == []
    assert source_reads({"q1": q1, "q2": q2}) == {"orders": 2}


def test_nondeterministic_subplans_are_marked():
    q1 = plan("q1", source(), filt("f", "src", "rand() < 0.5"), proj("p", "f", ("a", "a")),
              filt("g", "p", "a > 1"), sink("out", "g", "o1"))
    q2 = plan("q2", source(), filt("f", "src", "rand() < 0.5"), proj("p", "f", ("a", "a")),
              filt("g", "p", "a > 2"), sink("out", "g", "o2"))
    (sh,) = _shared(q1, q2)
    assert not sh.deterministic


def test_self_join_sides_are_told_apart():
    def q(name, cond):
        return plan(name, source("l", topic="t"), source("r", topic="t"),
                    {"id": "j", "step": "join", "inputs": ["l", "r"], "type": "inner",
                     "left_keys": ["order_id"], "right_keys": ["order_id"],
                     "condition": cond, "time_bound": "r.ts BETWEEN l.ts AND l.ts + "
                     "INTERVAL 1 HOUR"},
                    sink("out", "j", "o"))
    # the same shape, sides swapped in the condition: not the same rows
    assert top(q("q1", "l.a > r.b")) != top(q("q2", "r.a > l.b"))
    assert top(q("q1", "l.a > r.b")) == top(q("q2", "r.b < l.a"))


# -- property: renaming node ids never changes signatures ------------------------------------

_FLEET = [
    plan("q1", source(), filt("f", "src", "region <> 'test' AND a > 1"),
         proj("p", "f", ("id", "order_id"), ("t", "a * b")),
         agg("g", "p", [("id", "id")], [("s", "sum", ["t"])]),
         sink("out", "g", "o1", mode="update", keys=["id"])),
    plan("q2", source("l", topic="t"), source("r", topic="t"),
         {"id": "j", "step": "join", "inputs": ["l", "r"], "type": "inner",
          "left_keys": ["order_id"], "right_keys": ["order_id"], "condition": "l.a > r.b",
          "time_bound": "r.ts BETWEEN l.ts AND l.ts + INTERVAL 1 HOUR"},
         filt("f", "j", "a > 0"),
         # the join names a right column that a left one also has after the right input's
         # id: the project keeps the sink's output names independent of ids
         proj("p", "f", ("order_id", "order_id"), ("a", "a"), ("ts", "ts")),
         sink("out", "p", "o2")),
]

_ID = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,8}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_renaming_node_ids_never_changes_signatures(data):
    for p in _FLEET:
        ids = list(p.nodes)
        new = data.draw(st.lists(_ID, min_size=len(ids), max_size=len(ids),
                                 unique_by=str.lower))
        ren = dict(zip(ids, new))
        d = to_doc(p)
        for n in d["nodes"]:
            n["id"] = ren[n["id"]]
            if "inputs" in n:
                n["inputs"] = [ren[i] for i in n["inputs"]]
            for k in ("condition", "time_bound"):
                if k in n:  # qualified by input ids
                    # one pass per id through a marker no id holds, the new id quoted
                    # (an id may be a keyword, or hold what the marker would be)
                    for i, old in enumerate(ren):
                        n[k] = n[k].replace(f"{old}.", f"\0{i}\0.")
                    for i, nw in enumerate(ren.values()):
                        n[k] = n[k].replace(f"\0{i}\0.", f"`{nw}`.")
        d["query"] = "renamed_" + p.query
        q = from_doc(d)
        analyze(q)
        assert {ren[k]: v for k, v in signatures(p).items()} == signatures(q)
