"""A daily count whose SQL outputs ``window.start AS day`` (fixtures/history/daily_clicks),
written to a compacted topic: sink version 2 keys each record by page and day, so the table
the topic compacts to keeps one row per (page, day); version 1, frozen before, keys by page
alone and keeps each page's last day.  Both frozen versions run side by side in the one
Spark session, fed the case's input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from compat.infer import analyze
from compat.serde import from_doc
from tests.integration.test_qtt import assert_output

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "fixtures" / "history" / "daily_clicks"

pytestmark = pytest.mark.integration


def compacted(records: list) -> dict[str, dict]:
    """What a compacted topic keeps: each key's last value (offset order per partition; a
    key is on one partition), tombstones deleting it."""
    table: dict[str, dict] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.value is None:
            table.pop(r.key.decode(), None)
        else:
            table[r.key.decode()] = r.json()
    return table


def start(version: str, kafka, tmp_path: Path):
    from migrate.run import start_query
    from migrate.store import DirectoryStore

    doc = copy.deepcopy(json.loads((CASE / version / "plan.json").read_text()))
    inputs = json.loads((CASE / version / "input.json").read_text())
    src = next(n for n in doc["nodes"] if n["step"] == "source")
    sink = next(n for n in doc["nodes"] if n["step"] == "sink")
    src["topic"] = kafka.topic(prefix="clicks", partitions=src["partitions"])
    sink["topic"] = kafka.topic(prefix=f"daily-{version}", partitions=2,
                                config={"cleanup.policy": "compact"})
    kafka.produce(src["topic"], [r["value"] for r in inputs["clicks"]])
    plan = from_doc(doc, str(CASE / version / "plan.json"))
    analyze(plan)
    return plan, start_query(plan, bootstrap=kafka.bootstrap,
                             store=DirectoryStore(tmp_path / version),
                             master="local[2]", available_now=True,
                             query_name=f"daily-{version}-{tmp_path.name}")


def test_a_version_2_sink_keeps_one_row_per_page_and_day_on_a_compacted_topic(
        kafka, spark, tmp_path):
    runs = {v: start(v, kafka, tmp_path) for v in ("v1", "v2")}
    tables = {}
    try:
        for v, (plan, q) in runs.items():
            assert q.awaitTermination(120), f"{v} did not finish within 120 s"
            assert q.exception() is None, q.exception()
            assert plan.sink.version == int(v[1:])
            records = kafka.read_all(plan.sink.topic)
            # the frozen expectation of the version (plan history)
            assert_output(records, json.loads((CASE / v / "expected.json").read_text()))
            tables[v] = compacted(records)
    finally:
        for _, q in runs.values():
            if q.isActive:
                q.stop()
    days = {("home", "2026-01-01T00:00:00.000000Z"): 2,
            ("cart", "2026-01-01T00:00:00.000000Z"): 1,
            ("home", "2026-01-02T00:00:00.000000Z"): 1}
    # version 2: the key is page then day, as the value writes the day
    assert {json.dumps({"page": p, "day": d}, separators=(",", ":")) for p, d in days} == \
        set(tables["v2"])
    assert {(r["page"], r["day"]): r["clicks"] for r in tables["v2"].values()} == days
    # version 1 keeps its bytes: keyed by page, the topic compacts to each page's last day
    assert set(tables["v1"]) == {'{"page":"home"}', '{"page":"cart"}'}
    assert tables["v1"]['{"page":"home"}']["day"] == "2026-01-02T00:00:00.000000Z"
