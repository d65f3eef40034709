"""A windowed output is keyed by its window too (sink version 2), as ksqlDB's windowed keys
are: keyed by its group columns alone, a compacted topic keeps only the last window of each
group.  Version 1 keeps its bytes; the checker sees a change of the key's window as a change
of the output key; ``plan compile`` writes version 2 for a windowed output."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

from compat.check import check_plans
from compat.infer import analyze
from compat.serde import from_doc
from compat.sql import compile_sql
from compat.sql.history import versions
from compat.steps.sink import written_key
from migrate.build.sink import sink_key
from tests.conftest import FIXTURES, load_doc

WINDOWED = FIXTURES / "upgrades" / "aggregate_tumbling_window_changed" / "old.json"
PLAIN = FIXTURES / "upgrades" / "filter_changed_before_aggregate" / "old.json"


def plan(doc: dict):
    p = from_doc(copy.deepcopy(doc), "plan.json")
    analyze(p)
    return p


def with_sink(doc: dict, **changes) -> dict:
    doc = copy.deepcopy(doc)
    for n in doc["nodes"]:
        if n["step"] == "sink":
            n.update(changes)
    return doc


def key_of(doc: dict) -> tuple[str, ...]:
    p = plan(doc)
    return written_key(p.sink, p.info[p.sink_id])


def codes(old: dict, new: dict) -> dict[str, str]:
    return {f.code: f.effect for f in check_plans(plan(old), plan(new)).findings}


def test_version_2_keys_a_windowed_output_by_its_window_last():
    doc = load_doc(WINDOWED)
    assert key_of(doc) == ("page",)  # version 1: today's bytes
    assert key_of(with_sink(doc, version=2)) == ("page", "window")
    # listed explicitly, the window is not added twice (and v1 writes the same key)
    explicit = with_sink(doc, key_columns=["page", "window"])
    assert key_of(explicit) == ("page", "window")
    assert key_of(with_sink(explicit, version=2)) == ("page", "window")
    # a windowed count with no group columns is keyed by its window alone
    assert key_of(with_sink(doc, version=2, key_columns=[])) == ("window",)


def test_version_2_without_a_window_writes_what_version_1_does():
    doc = load_doc(PLAIN)
    assert key_of(with_sink(doc, version=2)) == key_of(doc)
    found = codes(doc, with_sink(doc, version=2))
    assert found == {"step-version-changed": "in_place"}


def test_the_builder_passes_the_written_key_to_the_gated_sink():
    p = plan(with_sink(load_doc(WINDOWED), version=2))
    assert sink_key(SimpleNamespace(plan=p)) == ["page", "window"]
    p1 = plan(load_doc(WINDOWED))
    assert sink_key(SimpleNamespace(plan=p1)) == ["page"]


def test_moving_a_windowed_sink_to_version_2_changes_the_output_key():
    doc = load_doc(WINDOWED)
    found = codes(doc, with_sink(doc, version=2))
    assert found["sink-key-changed"] == "unsupported"
    report = check_plans(plan(doc), plan(with_sink(doc, version=2)))
    (f,) = [f for f in report.findings if f.code == "sink-key-changed"]
    assert "['page'] to ['page', 'window']" in f.message
    assert "Keep sink version 1" in f.hint
    assert f.new_pointer.endswith("/version")


def test_the_same_bytes_under_either_version_are_the_same_key():
    doc = load_doc(WINDOWED)
    old = with_sink(doc, key_columns=["page", "window"])
    found = codes(old, with_sink(doc, version=2))
    assert "sink-key-changed" not in found


def test_the_window_leaving_the_output_of_a_version_2_sink_changes_the_key():
    doc = with_sink(load_doc(WINDOWED), version=2)
    new = copy.deepcopy(doc)
    agg = next(n for n in new["nodes"] if n["step"] == "aggregate")
    sink = next(n for n in new["nodes"] if n["step"] == "sink")
    new["nodes"].insert(-1, {"id": "drop_window", "step": "project", "version": 1,
                             "inputs": [agg["id"]],
                             "columns": [{"name": "start", "expr": "window.start"},
                                         {"name": "page", "expr": "page"},
                                         {"name": "clicks", "expr": "clicks"}]})
    sink["inputs"] = ["drop_window"]
    report = check_plans(plan(doc), plan(new))
    (f,) = [f for f in report.findings if f.code == "sink-key-changed"]
    assert f.effect == "unsupported" and "window enters or leaves" in f.message
    assert "['page', 'window'] to ['page']" in f.message


SQL = """SET spark.sql.shuffle.partitions = 2;
CREATE TABLE clicks (user_id STRING, page STRING, ts TIMESTAMP)
  USING kafka OPTIONS (partitions 2, event_time 'ts', watermark '10 seconds');
CREATE TABLE out USING kafka OPTIONS (topic 'out'{key}) AS
SELECT {select}
FROM clicks
GROUP BY {group};
"""


@pytest.mark.parametrize("select,group,key,version,written", [
    ("window, page, count(*) AS n", "window(ts, '1 minute'), page", "", 2,
     ("page", "window")),
    ("window, page, count(*) AS n", "window(ts, '1 minute'), page", ", key 'page'", 2,
     ("page", "window")),
    ("window, page, count(*) AS n", "session_window(ts, '5 minutes'), page", "", 2,
     ("page", "window")),
    ("window, count(*) AS n", "window(ts, '1 minute')", "", 2, ("window",)),
    ("page, count(*) AS n", "page", "", 1, ("page",)),
])
def test_plan_compile_writes_version_2_for_a_windowed_output(select, group, key, version,
                                                              written):
    doc = compile_sql(SQL.format(select=select, group=group, key=key))
    sink = next(n for n in doc["nodes"] if n["step"] == "sink")
    assert sink["version"] == version
    assert key_of(doc) == written


def test_frozen_windowed_history_keeps_version_1_and_its_new_version_keys_windows():
    case = FIXTURES / "history" / "tumbling_window"
    v1 = json.loads((case / "v1" / "plan.json").read_text())
    assert key_of(v1) == ("page",)
    latest = versions(case)[-1]
    doc = json.loads((latest / "plan.json").read_text())
    assert key_of(doc) == ("page", "window")
    expected = json.loads((latest / "expected.json").read_text())["records"]
    keys = [json.dumps(r["key"], sort_keys=True) for r in expected]
    assert len(set(keys)) == len(keys)  # every window of a page has a key of its own
    assert all(list(r["key"]) == ["page", "window"] for r in expected)
