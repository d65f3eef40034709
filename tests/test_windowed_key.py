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
    assert "keep sink version 1" in f.hint
    assert f.new_pointer.endswith("/version")


def test_the_same_bytes_under_either_version_are_the_same_key():
    doc = load_doc(WINDOWED)
    old = with_sink(doc, key_columns=["page", "window"])
    found = codes(old, with_sink(doc, version=2))
    assert "sink-key-changed" not in found


def projected(doc: dict, *columns: tuple[str, str]) -> dict:
    """``doc`` with a project of ``columns`` (name, expression) between its aggregate and
    its sink."""
    new = copy.deepcopy(doc)
    agg = next(n for n in new["nodes"] if n["step"] == "aggregate")
    sink = next(n for n in new["nodes"] if n["step"] == "sink")
    new["nodes"].insert(-1, {"id": "select", "step": "project", "version": 1,
                             "inputs": [agg["id"]],
                             "columns": [{"name": n, "expr": e} for n, e in columns]})
    sink["inputs"] = ["select"]
    return new


@pytest.mark.parametrize("kept,new_key", [
    ((), ["page"]),  # the window leaves the output altogether
    ((("start", "window.start"),), ["page", "start"]),  # only its start stays
])
def test_the_window_leaving_the_output_of_a_version_2_sink_changes_the_key(kept, new_key):
    doc = with_sink(load_doc(WINDOWED), version=2)
    new = projected(doc, *kept, ("page", "page"), ("clicks", "clicks"))
    report = check_plans(plan(doc), plan(new))
    (f,) = [f for f in report.findings if f.code == "sink-key-changed"]
    assert f.effect == "unsupported" and "window enters or leaves" in f.message
    assert f"['page', 'window'] to {new_key}" in f.message


DAY = ("day", "window.start")
REST = (("page", "page"), ("clicks", "clicks"))


@pytest.mark.parametrize("columns,key_columns,v1,v2", [
    # a bound under any name is the window's part of the key
    ((DAY, *REST), ["page"], ("page",), ("page", "day")),
    ((("closes", "Window.`End`"), *REST), ["page"], ("page",), ("page", "closes")),
    ((DAY, ("until", "window.end"), *REST), ["page"], ("page",), ("page", "day", "until")),
    ((DAY, *REST), [], (), ("day",)),
    # the window itself under another name (Spark's session_window, an alias)
    ((("session_window", "window"), *REST), ["page"], ("page",),
     ("page", "session_window")),
    # the window and a bound: the window alone, as version 2 always keyed it
    ((("window", "window"), DAY, *REST), ["page"], ("page",), ("page", "window")),
    # a key that already says which window a row is of gets nothing more
    ((DAY, ("until", "window.end"), *REST), ["page", "day"], ("page", "day"),
     ("page", "day")),
    # a value computed from a bound is not the window: keyed by the group columns alone
    ((("d", "CAST(window.start AS date)"), *REST), ["page"], ("page",), ("page",)),
    ((("day", "date_trunc('hour', window.start)"), *REST), ["page"], ("page",), ("page",)),
])
def test_version_2_keys_a_windowed_output_by_the_window_bounds_it_carries(
        columns, key_columns, v1, v2):
    doc = with_sink(projected(load_doc(WINDOWED), *columns), key_columns=key_columns)
    assert key_of(doc) == v1
    assert key_of(with_sink(doc, version=2)) == v2


def test_a_bound_stays_the_window_through_steps_that_keep_their_columns():
    doc = with_sink(projected(load_doc(WINDOWED), DAY, *REST), version=2)
    sink = next(n for n in doc["nodes"] if n["step"] == "sink")
    doc["nodes"].insert(-1, {"id": "busy", "step": "filter", "version": 1,
                             "inputs": ["select"], "predicate": "clicks > 1"})
    doc["nodes"].insert(-1, {"id": "renamed", "step": "project", "version": 1,
                             "inputs": ["busy"],
                             "columns": [{"name": "page", "expr": "page"},
                                         {"name": "Opened", "expr": "day"},
                                         {"name": "clicks", "expr": "clicks"}]})
    sink["inputs"] = ["renamed"]
    assert key_of(doc) == ("page", "Opened")  # as written, in output order


def day_doc(version: int, topic: str = "clicks_per_day") -> dict:
    return with_sink(projected(load_doc(WINDOWED), DAY, *REST), version=version, topic=topic)


def test_moving_a_sink_over_a_window_start_to_version_2_changes_the_compacted_view():
    report = check_plans(plan(day_doc(1)), plan(day_doc(2)))
    assert report.verdict == "unsupported"
    (f,) = [f for f in report.findings if f.code == "sink-key-changed"]
    assert "['page'] to ['page', 'day'] (sink version 1 -> 2" in f.message
    assert "one row per page, its last window's" in f.message
    assert "one row per page and day" in f.message
    assert f.old_pointer.endswith("/version") and f.new_pointer.endswith("/version")
    assert "new output topic" in f.hint and "--schema-compat none" in f.hint
    # the version of a sink over an output with no window is only a restart
    found = codes(day_doc(1), with_sink(day_doc(1), version=1, topic="clicks_per_day"))
    assert "sink-key-changed" not in found


@pytest.mark.parametrize("schema_compat,verdict,key_finding", [
    ("forward", "unsupported", False),  # the new topic is a new output: consumers move
    ("none", "in_place", False),  # nobody to protect: restart writing the new topic
])
def test_window_keys_on_a_new_topic_are_no_key_change_of_the_old_one(schema_compat, verdict,
                                                                     key_finding):
    report = check_plans(plan(day_doc(1)), plan(day_doc(2, topic="clicks_by_day")),
                         schema_compat=schema_compat)
    assert report.verdict == verdict
    found = {f.code: f for f in report.findings}
    assert ("sink-key-changed" in found) is key_finding
    if schema_compat == "none":
        assert found["sink-topic-changed"].effect == "in_place"
        assert "keyed by ['page', 'day'] instead of ['page']" in \
            found["sink-topic-changed"].message


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
    ("window.start AS day, page, count(*) AS n", "window(ts, '1 day'), page", "", 2,
     ("page", "day")),
    ("page, window.`end` AS closed, count(*) AS n", "window(ts, '1 day'), page", "", 2,
     ("page", "closed")),
    ("session_window, page, count(*) AS n", "session_window(ts, '5 minutes'), page", "", 2,
     ("page", "session_window")),
    ("session_window.start AS opened, page, count(*) AS n",
     "session_window(ts, '5 minutes'), page", "", 2, ("page", "opened")),
    ("window.start AS day, count(*) AS n", "window(ts, '1 day')", "", 2, ("day",)),
    ("window.start AS day, page, count(*) AS n", "window(ts, '1 day'), page",
     ", key 'page,day'", 2, ("page", "day")),
    # a date computed from the window is a value, not the window: version 1
    ("CAST(window.start AS date) AS d, page, count(*) AS n", "window(ts, '1 day'), page", "",
     1, ("page",)),
])
def test_plan_compile_writes_version_2_for_a_windowed_output(select, group, key, version,
                                                              written):
    doc = compile_sql(SQL.format(select=select, group=group, key=key))
    sink = next(n for n in doc["nodes"] if n["step"] == "sink")
    assert sink["version"] == version
    assert key_of(doc) == written


@pytest.mark.parametrize("name,window", [("tumbling_window", "window"),
                                         ("daily_clicks", "day")])
def test_frozen_windowed_history_keeps_version_1_and_its_new_version_keys_windows(name,
                                                                               window):
    case = FIXTURES / "history" / name
    v1 = json.loads((case / "v1" / "plan.json").read_text())
    assert key_of(v1) == ("page",)
    latest = versions(case)[-1]
    doc = json.loads((latest / "plan.json").read_text())
    assert key_of(doc) == ("page", window)
    expected = json.loads((latest / "expected.json").read_text())["records"]
    keys = [json.dumps(r["key"], sort_keys=True) for r in expected]
    assert len(set(keys)) == len(keys)  # every window of a page has a key of its own
    assert all(list(r["key"]) == ["page", window] for r in expected)


@pytest.mark.parametrize("columns,job_key,version,key_columns", [
    # to_json(struct("page", "day")) with day = window.start: what version 2 writes
    ((DAY, *REST), ["page", "day"], 2, ["page"]),
    ((DAY, *REST), ["day"], 2, []),
    ((("window", "window"), *REST), ["page", "window"], 2, ["page"]),
    ((("session_window", "window"), *REST), ["page", "session_window"], 2, ["page"]),
    # keys version 2 would not write as they are: the job's own bytes, version 1
    ((DAY, *REST), ["page"], 1, ["page"]),
    ((DAY, *REST), ["day", "page"], 1, ["day", "page"]),
    ((DAY, ("until", "window.end"), *REST), ["page", "until"], 1, ["page", "until"]),
])
def test_plan_import_writes_version_2_for_a_key_that_ends_with_the_window(
        columns, job_key, version, key_columns):
    from migrate.adopt import _window_keyed

    doc = with_sink(projected(load_doc(WINDOWED), *columns), key_columns=job_key)
    _window_keyed(doc, "job.py")
    sink = next(n for n in doc["nodes"] if n["step"] == "sink")
    assert (sink["version"], sink["key_columns"]) == (version, key_columns)
    assert list(key_of(doc)) == job_key  # the bytes the job writes, either way


def test_plan_export_writes_the_window_bounds_into_the_key_of_a_version_2_sink():
    from compat.export import to_pyspark

    job = to_pyspark(plan(day_doc(2)))
    assert 'F.to_json(F.struct("page", "day")).alias("key")' in job
    assert 'F.to_json(F.struct("page")).alias("key")' in to_pyspark(plan(day_doc(1)))
