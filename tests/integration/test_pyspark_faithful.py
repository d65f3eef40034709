"""Faithful, proved on Kafka: every job of fixtures/pyspark/ runs twice on the same input
in the same broker, once as written (Spark's own Kafka connector) and once as its
imported plan (``theseus run``'s builder, gated source and sink); both output topics must
hold the same records: the parsed JSON values as multisets (append), the final value per
key (update).  The expected output is not written down anywhere: the original job is the
oracle.

Two representation differences are normalised, not hidden: timestamps compare as instants
(Spark's ``to_json`` writes milliseconds, Theseus microseconds) and a null field equals an
absent one (Spark's ``to_json`` leaves nulls out)."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from compat.infer import analyze
from compat.serde import from_doc

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted(p for p in (ROOT / "fixtures" / "pyspark").iterdir()
               if (p / "job.py").exists())

pytestmark = pytest.mark.integration

_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def normal(v):
    """A parsed JSON value with timestamps as instants and null fields left out."""
    if isinstance(v, dict):
        return {k: normal(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [normal(x) for x in v]
    if isinstance(v, str) and _TS.match(v):
        return datetime.fromisoformat(v.replace("Z", "+00:00")).isoformat()
    return v


def canon(v) -> str:
    return json.dumps(normal(v), sort_keys=True)


def outcome(records, mode: str):
    if mode != "update":
        return Counter(canon(r.json()) for r in records)
    table = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        k = canon(r.key_json())
        if r.value is None:
            table.pop(k, None)
        else:
            table[k] = canon(r.json())
    return table


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_job_and_imported_plan_write_the_same_records(case, kafka, kafka_connector,
                                                      tmp_path, monkeypatch):
    from migrate.adopt import import_job
    from migrate.adopt.job import run_job
    from migrate.run import start_query
    from migrate.store import DirectoryStore

    expected_plan = json.loads((case / "plan.json").read_text())
    inputs = json.loads((case / "input.json").read_text())
    prefix = f"it-pys-{uuid.uuid4().hex[:8]}-"
    monkeypatch.setenv("TOPIC_PREFIX", prefix)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka.bootstrap)
    monkeypatch.setenv("CHECKPOINT", str(tmp_path / "job-checkpoint"))
    parts = {n["topic"]: n["partitions"] for n in expected_plan["nodes"]
             if n["step"] == "source"}
    (sink,) = [n for n in expected_plan["nodes"] if n["step"] == "sink"]
    from confluent_kafka.admin import NewTopic

    for topic, recs in inputs.items():
        full = prefix + topic
        kafka.admin.create_topics([NewTopic(full, parts[topic], 1)])[full].result(30)
        kafka.created.append(full)
        by_index = [r.get("partition") for r in recs]
        kafka.produce(full, [r.get("value") for r in recs],
                      keys=[r.get("key") for r in recs] if any("key" in r for r in recs)
                      else None,
                      partition=(lambda i, b=by_index: b[i]) if any(
                          p is not None for p in by_index) else None)
    for out in (sink["topic"], sink["topic"] + "-theseus"):
        full = prefix + out
        kafka.admin.create_topics([NewTopic(full, 1, 1)])[full].result(30)
        kafka.created.append(full)

    # 1. The job as written, on Spark's Kafka connector.
    job = run_job(str(case / "job.py"))
    q = job.writer.trigger(availableNow=True).start()
    try:
        assert q.awaitTermination(240), "the job did not finish within 240 s"
    finally:
        if q.isActive:
            q.stop()
    assert q.exception() is None, q.exception()

    # 2. Its imported plan, run by Theseus, writing beside it.
    doc = import_job(str(case / "job.py"), delivery=sink["delivery"])
    for n in doc["nodes"]:
        if n["step"] == "source":
            assert n["partitions"] == parts[n["topic"][len(prefix):]]  # asked the broker
        if n["step"] == "sink":
            n["topic"] += "-theseus"
    plan = from_doc(doc, str(case / "job.py"))
    analyze(plan)
    tq = start_query(plan, bootstrap=kafka.bootstrap,
                     store=DirectoryStore(tmp_path / "state"), master="local[2]",
                     available_now=True, query_name=f"pys-{case.name}-{tmp_path.name}")
    try:
        assert tq.awaitTermination(240), "the plan did not finish within 240 s"
    finally:
        if tq.isActive:
            tq.stop()
    assert tq.exception() is None, tq.exception()

    by_spark = kafka.read_all(prefix + sink["topic"])
    by_theseus = kafka.read_all(prefix + sink["topic"] + "-theseus")
    assert by_spark, "the original job wrote nothing: the input proves nothing"
    assert outcome(by_theseus, sink["mode"]) == outcome(by_spark, sink["mode"])
