"""An enforcing step that holds no state (a stream-table join: Spark re-reads the table at
every micro-batch and keeps nothing in the checkpoint) is judged as a passive step is:
added, removed or changed, it needs a restart, and only upstream of state does history
stay computed the old way (``--require backfill`` then makes it a migration)."""

from __future__ import annotations

import copy

from compat.check import check_plans
from compat.infer import analyze
from compat.serde import from_doc
from tests.conftest import FIXTURES, load_doc

CASES = FIXTURES / "upgrades"


def plan(doc: dict):
    p = from_doc(copy.deepcopy(doc), "plan.json")
    analyze(p)
    return p


def check(old: dict, new: dict, require: list[str] | None = None):
    return check_plans(plan(old), plan(new), require=require or [])


def stream_only(doc: dict) -> dict:
    """A stateless query: the join's output straight to the sink (no aggregate)."""
    doc = copy.deepcopy(doc)
    doc["nodes"] = [n for n in doc["nodes"] if n["step"] != "aggregate"]
    sink = next(n for n in doc["nodes"] if n["step"] == "sink")
    feeder = next(n["id"] for n in doc["nodes"] if n["step"] in ("join", "source")
                  and n.get("role") != "table")
    joins = [n["id"] for n in doc["nodes"] if n["step"] == "join"]
    sink["inputs"] = [joins[0] if joins else feeder]
    sink["mode"] = "append"
    sink["key_columns"] = []
    return doc


def test_join_added_upstream_of_an_aggregate_is_in_place_with_history():
    case = CASES / "join_stream_table_added_before_aggregate"
    old, new = load_doc(case / "old.json"), load_doc(case / "new.json")
    report = check(old, new)
    assert report.verdict == "in_place"
    (f,) = report.findings
    assert (f.code, f.effect, f.history) == ("enforcing-added", "in_place", True)
    assert "history stays computed the old way" in f.message
    assert "no history" not in f.message
    assert f.hint.startswith("Restart the query on its checkpoint")
    back = check(new, old)
    assert back.verdict == "in_place"
    assert [(g.code, g.history) for g in back.findings] == [("enforcing-removed", True)]
    assert check(old, new, ["backfill"]).verdict == "migrate"


def test_join_added_to_a_stateless_query_carries_no_history():
    case = CASES / "join_stream_table_added_before_aggregate"
    old = stream_only(load_doc(case / "old.json"))
    new = stream_only(load_doc(case / "new.json"))
    report = check(old, new)
    assert report.verdict == "in_place"
    (f,) = [f for f in report.findings if f.code == "enforcing-added"]
    assert (f.effect, f.history) == ("in_place", False)
    assert "before 'out'; it holds no state" in f.message
    assert not any(g.history for g in report.findings)
    # Nothing downstream keeps history: backfill has nothing to recompute.
    assert check(old, new, ["backfill"]).verdict == "in_place"


def test_join_change_carries_history_only_upstream_of_state():
    case = CASES / "join_stream_table_condition_changed_before_aggregate"
    old, new = load_doc(case / "old.json"), load_doc(case / "new.json")
    (f,) = check(old, new).findings
    assert (f.effect, f.history) == ("in_place", True)
    assert "upstream of stateful aggregate 'aggregate_1'" in f.message
    (g,) = check(stream_only(old), stream_only(new)).findings
    assert (g.code, g.effect, g.history) == ("join-condition-changed", "in_place", False)


def test_filter_behind_a_stateless_join_is_upstream_of_the_aggregate():
    case = CASES / "filter_changed_table_side_before_aggregate_backfill"
    old, new = load_doc(case / "old.json"), load_doc(case / "new.json")
    (f,) = check(old, new).findings
    assert f.code == "filter-changed" and f.history
    assert "upstream of stateful aggregate 'aggregate_1'" in f.message


def test_a_stream_stream_join_inserted_still_needs_a_migration():
    case = CASES / "join_stream_table_added_before_aggregate"
    old, new = load_doc(case / "old.json"), load_doc(case / "new.json")
    for n in new["nodes"]:
        if n.get("role") == "table":
            n["role"] = "stream"
            n["event_time"] = None
            n.pop("event_time")
    report = check(old, new)
    assert report.verdict == "migrate"
    (f,) = [f for f in report.findings if f.code == "enforcing-added"]
    assert f.effect == "migrate" and "its state has no history" in f.message
