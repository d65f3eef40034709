"""Query translation tests (ksqlDB's QTT): every plan under fixtures/qtt/<case>/ is built by
the builder, fed its reference input through a real Kafka broker, run on real Spark with the
available-now trigger, and its output topic compared with the reference output.

``expected.json`` says how to compare: ``multiset`` (every record once, any order) or
``table`` (the final value per key, records applied in offset order, tombstones delete).
Topics get unique names per run, so a shared broker never mixes runs."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from compat.infer import analyze
from compat.serde import from_doc

from .conftest import in_groups

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted(p for p in (ROOT / "fixtures" / "qtt").iterdir() if p.is_dir())

pytestmark = pytest.mark.integration


def _canon(v) -> str:
    return json.dumps(v, sort_keys=True)


def start_case(case: Path, kafka, tmp_path: Path) -> SimpleNamespace:
    """The case's topics (fresh names) fed its input, and its query started available-now;
    ``finish_case`` waits for it."""
    from migrate.run import start_query
    from migrate.store import DirectoryStore

    doc = json.loads((case / "plan.json").read_text())
    inputs = json.loads((case / "input.json").read_text())
    expected = json.loads((case / "expected.json").read_text())
    doc = copy.deepcopy(doc)
    renamed: dict[str, str] = {}
    for node in doc["nodes"]:
        if node["step"] in ("source", "sink"):
            old = node["topic"]
            if old not in renamed:
                parts = node.get("partitions", 3)
                renamed[old] = kafka.topic(prefix=old.replace("_", "-"), partitions=parts)
            node["topic"] = renamed[old]
    # Tables first: a stream-static join reads the table as it is when a batch runs.
    order = sorted(inputs, key=lambda t: 0 if any(
        n.get("topic") == renamed.get(t) and n.get("role") == "table"
        for n in doc["nodes"]) else 1)
    for topic in order:
        recs = inputs[topic]
        keys = [r.get("key") for r in recs]
        parts = [r.get("partition") for r in recs]
        by_index = (lambda i, parts=parts: parts[i]) \
            if any(p is not None for p in parts) else None
        kafka.produce(renamed[topic], [r.get("value") for r in recs],
                      keys=keys if any(k is not None for k in keys) else None,
                      partition=by_index)
    plan = from_doc(doc, str(case / "plan.json"))
    analyze(plan)
    q = start_query(plan, bootstrap=kafka.bootstrap, store=DirectoryStore(tmp_path / "state"),
                    master="local[2]", available_now=True,
                    query_name=f"qtt-{case.name}-{tmp_path.name}")
    return SimpleNamespace(plan=plan, expected=expected, query=q, records=None)


def finish_case(run: SimpleNamespace, kafka) -> tuple[list, dict]:
    """Wait for ``start_case``'s query; its output records (read once) and expectation."""
    if run.records is None:
        q = run.query
        try:
            assert q.awaitTermination(240), "the query did not finish within 240 s"
        finally:
            if q.isActive:
                q.stop()
        assert q.exception() is None, q.exception()
        run.records = kafka.read_all(run.plan.sink.topic)
    return run.records, run.expected


def start_cases(cases: list[Path], kafka, tmp_path_factory) -> Iterator[dict]:
    """Every case run, a few side by side (they share no topic, checkpoint or store): yields
    ``{case: run or exception}``; each case's own test raises its exception or checks its
    output."""
    runs: dict[Path, Any] = {}
    try:
        for group in in_groups(cases):
            for case in group:
                try:
                    runs[case] = start_case(case, kafka, tmp_path_factory.mktemp(case.name))
                except Exception as e:  # noqa: BLE001 - reported by the case's own test
                    runs[case] = e
            for case in group:
                if isinstance(runs[case], SimpleNamespace):
                    try:
                        finish_case(runs[case], kafka)
                    except Exception as e:  # noqa: BLE001 - reported by the case's own test
                        runs[case] = e
        yield runs
    finally:
        for run in runs.values():
            if isinstance(run, SimpleNamespace) and run.query.isActive:
                run.query.stop()


def finished(runs: dict, case: Path, kafka) -> tuple[list, dict]:
    run = runs[case]
    if isinstance(run, Exception):
        raise run
    return finish_case(run, kafka)


@pytest.fixture(scope="module")
def qtt_runs(kafka, spark, tmp_path_factory):
    yield from start_cases(CASES, kafka, tmp_path_factory)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_query_translation(case, qtt_runs, kafka):
    records, expected = finished(qtt_runs, case, kafka)
    assert_output(records, expected)


def assert_output(records: list, expected: dict) -> None:
    want = [(r["key"], r["value"]) for r in expected["records"]]
    if expected["compare"] == "multiset":
        got = Counter((_canon(r.key_json()), _canon(r.json())) for r in records)
        assert got == Counter((_canon(k), _canon(v)) for k, v in want)
    else:
        table: dict[str, object] = {}
        for r in sorted(records, key=lambda r: (r.partition, r.offset)):
            k = _canon(r.key_json())
            if r.value is None:
                table.pop(k, None)
            else:
                table[k] = r.json()
        assert {k: _canon(v) for k, v in table.items()} == \
            {_canon(k): _canon(v) for k, v in want}



def _with_event_time(doc: dict, group_by_time: bool = False) -> dict:
    """The plan with an event-time column and a watermark on its (first) source."""
    src = next(n for n in doc["nodes"] if n["step"] == "source")
    src["schema"].append({"name": "ts", "type": "timestamp"})
    src["event_time"] = {"column": "ts", "watermark": "10 seconds"}
    if group_by_time:
        agg = next(n for n in doc["nodes"] if n["step"] == "aggregate")
        agg["group_by"].append({"name": "ts", "expr": "ts"})
    return doc


@pytest.mark.parametrize("case,change,kept", [
    ("ship_load", None, False),  # a plain aggregate by ship reads no watermark
    ("aggregate_update", "event_time", False),
    ("aggregate_update", "group_by_time", True),  # a key on the event time evicts by it
    ("tumbling_window", None, True),
    ("stream_join", None, True),
    ("dedup", "event_time", True),  # any stateful step but a plain aggregate keeps it
])
def test_a_watermark_reaches_spark_only_when_a_stateful_step_reads_it(case, change, kept,
                                                                        spark):
    """A watermark nothing reads only makes Spark run empty batches (state eviction with
    nothing to evict) whenever it advances: the builder leaves it out, and keeps every one
    a step needs."""
    from migrate.build import Builder, BuildOptions

    doc = json.loads((ROOT / "fixtures" / "qtt" / case / "plan.json").read_text())
    if change:
        doc = _with_event_time(doc, group_by_time=change == "group_by_time")
    plan = from_doc(doc)
    analyze(plan)
    df = Builder(spark, plan, BuildOptions(bootstrap="127.0.0.1:1", query="wm")).dataframe()
    logical = df._jdf.queryExecution().logical().toString()
    assert ("EventTimeWatermark" in logical) is kept, logical


def test_a_windowed_key_is_written_key_columns_then_the_window(qtt_runs, kafka):
    """Sink version 2's key bytes: the key columns in order, then the window as the value
    writes it (``{"start": ..., "end": ...}``); version 1 (tumbling_window) writes the key
    columns alone.  The output is the hopping_window_key case's (the same run)."""
    records, _ = finished(qtt_runs, ROOT / "fixtures" / "qtt" / "hopping_window_key", kafka)
    assert records
    for r in records:
        key = json.loads(r.key, object_pairs_hook=list)
        assert [k for k, _ in key] == ["page", "window"], r.key
        assert [k for k, _ in key[1][1]] == ["start", "end"], r.key
        assert r.key.startswith(b'{"page":'), r.key
