"""Avro topics on a real schema registry (scripts/registry.sh: Apicurio, its Confluent API),
real Kafka and Spark: a plan reads an Avro topic written in the wire format under two writer
schemas, and its output is exact; the registry's compatibility verdicts agree with
compat.avro's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def schema_registry() -> str:
    """``$SCHEMA_REGISTRY_URL`` if a registry answers there, else the one
    ``scripts/registry.sh start`` starts or reuses (left running, as the broker is)."""
    if not os.environ.get("SCHEMA_REGISTRY_URL") and shutil.which("java") is None:
        pytest.skip("no SCHEMA_REGISTRY_URL and no java on PATH to start a registry")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "registry.sh"), "start"], cwd=ROOT,
                       capture_output=True, text=True, timeout=400)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("SCHEMA_REGISTRY_URL=")]
    if r.returncode != 0 or not lines:
        pytest.fail(f"scripts/registry.sh start failed (exit {r.returncode}):\n"
                    f"{r.stderr[-3000:]}")
    return lines[-1].split("=", 1)[1].strip()


def record(*fields: dict, name: str = "Order") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "shop",
                       "fields": list(fields)})


V1 = record({"name": "order_id", "type": "string"}, {"name": "amount", "type": "int"})
# v2: amount promoted to double, a nullable note and a qty with a default
V2 = record({"name": "order_id", "type": "string"}, {"name": "amount", "type": "double"},
            {"name": "note", "type": ["null", "string"], "default": None},
            {"name": "qty", "type": "int", "default": 1})


def test_start_again_reuses_the_running_registry(schema_registry):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "registry.sh"), "start"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"SCHEMA_REGISTRY_URL={schema_registry}"
    if not os.environ.get("SCHEMA_REGISTRY_URL"):
        assert "reusing the running registry" in r.stderr
        st = subprocess.run(["bash", str(ROOT / "scripts" / "registry.sh"), "status"],
                            capture_output=True, text=True, timeout=30)
        assert st.returncode == 0 and "running" in st.stdout


def test_subject_compatibility_agrees_with_avro_rules(schema_registry):
    from compat import avro as A
    from compat.registry import RegistryClient

    client = RegistryClient(schema_registry)
    subject = f"it-compat-{uuid.uuid4().hex[:8]}-value"
    client._request("PUT", f"/config/{subject}", {"compatibility": "BACKWARD"})
    client.register(subject, V1)
    no_default = record({"name": "order_id", "type": "string"}, {"name": "amount",
                                                                 "type": "int"},
                        {"name": "qty", "type": "int"})
    v = client.check(subject, no_default)
    assert (v.compatible, v.level) == (False, "BACKWARD")
    assert [i.rule for i in A.incompatibilities(A.parse(no_default), A.parse(V1))] == \
        ["READER_FIELD_MISSING_DEFAULT_VALUE"]
    v = client.check(subject, V2)
    assert v.compatible is True
    assert A.incompatibilities(A.parse(V2), A.parse(V1)) == []
    fresh = client.check(f"it-none-{uuid.uuid4().hex[:8]}-value", V1)
    assert fresh.compatible is None  # no version yet: anything goes


def _plan(topic: str, out: str, partitions: int = 2) -> dict:
    return {"format": "theseus.plan/1", "query": f"avro-{out}", "nodes": [
        {"id": "orders", "step": "source", "version": 1, "topic": topic,
         "partitions": partitions,
         "format": "avro", "role": "stream", "avro": {"record": "shop.Order"},
         "schema": [{"name": "order_id", "type": "string", "nullable": False},
                    {"name": "amount", "type": "double"},
                    {"name": "note", "type": "string"},
                    {"name": "qty", "type": "int"}]},
        {"id": "big", "step": "filter", "version": 1, "inputs": ["orders"],
         "predicate": "amount >= 10"},
        {"id": "out", "step": "sink", "version": 1, "inputs": ["big"], "topic": out,
         "format": "json", "key_columns": ["order_id"], "mode": "append",
         "delivery": "exactly_once"}]}


def _run(spark, kafka, plan_doc: dict, tmp_path: Path, output: str):
    from compat.serde import from_doc
    from migrate.build import Builder, BuildOptions

    p = from_doc(plan_doc)
    q = Builder(spark, p, BuildOptions(bootstrap=kafka.bootstrap, available_now=True,
                                       checkpoint=str(tmp_path / "ck"),
                                       query=f"q-{output}")).start()
    try:
        q.awaitTermination(180)
    except Exception as e:  # noqa: BLE001 - a failed query is an outcome here
        return e
    if q.isActive:
        q.stop()
        pytest.fail("the query did not finish within 180 s")
    return q.exception()


def test_a_plan_reads_an_avro_topic_across_two_writer_schemas_exactly(
        spark, kafka, schema_registry, tmp_path, monkeypatch):
    from compat.registry import RegistryClient
    from gates.avro import AvroEncoder

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", schema_registry)
    topic = kafka.topic("avro-in", partitions=2)
    out = kafka.topic("avro-out", partitions=1)
    client = RegistryClient(schema_registry)
    v1 = AvroEncoder(f"{topic}-value", V1, client)
    v2 = AvroEncoder(f"{topic}-value", V2, client)
    old = [{"order_id": f"a{i}", "amount": i} for i in range(40)]
    new = [{"order_id": f"b{i}", "amount": i + 0.5, "note": None if i % 3 else f"n{i}",
            "qty": i} for i in range(40)]
    kafka.produce(topic, [v1.encode(d) for d in old], keys=[d["order_id"] for d in old])
    kafka.produce(topic, [v2.encode(d) for d in new], keys=[d["order_id"] for d in new])
    assert v1.schema_id != v2.schema_id

    assert _run(spark, kafka, _plan(topic, out), tmp_path, out) is None
    got = sorted((r.json() for r in kafka.read_all(out)), key=lambda d: d["order_id"])
    # v1 records: the int amount promoted, note and qty the reader's defaults (null)
    want = [{"order_id": d["order_id"], "amount": float(d["amount"]), "note": None,
             "qty": None} for d in old if d["amount"] >= 10] + \
        [{"order_id": d["order_id"], "amount": d["amount"], "note": d["note"],
          "qty": d["qty"]} for d in new if d["amount"] >= 10]
    assert got == sorted(want, key=lambda d: d["order_id"])


def test_a_record_without_the_wire_format_fails_naming_its_offset(
        spark, kafka, schema_registry, tmp_path, monkeypatch):
    from compat.registry import RegistryClient
    from gates.avro import AvroEncoder

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", schema_registry)
    topic = kafka.topic("avro-bad", partitions=1)
    out = kafka.topic("avro-bad-out", partitions=1)
    enc = AvroEncoder(f"{topic}-value", V1, RegistryClient(schema_registry))
    kafka.produce(topic, [enc.encode({"order_id": "x", "amount": 20}), b'{"order_id":"y"}'],
                  partition=0)
    exc = _run(spark, kafka, _plan(topic, out, partitions=1), tmp_path, out)
    assert exc is not None
    text = str(exc)
    assert "not in the schema registry's wire format" in text
    assert f"topic '{topic}', partition 0" in text and "offset 1" in text


def test_an_avro_output_is_registered_first_and_written_exactly(
        spark, kafka, schema_registry, tmp_path, monkeypatch):
    from compat import avro as A
    from compat.registry import RegistryClient
    from gates.avro import AvroDecoder, AvroEncoder, unframe

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", schema_registry)
    topic = kafka.topic("avro-in2", partitions=2)
    out = kafka.topic("avro-out2", partitions=1)
    client = RegistryClient(schema_registry)
    v2 = AvroEncoder(f"{topic}-value", V2, client)
    rows = [{"order_id": f"c{i}", "amount": i * 1.5, "note": f"n{i}" if i % 2 else None,
             "qty": i} for i in range(30)]
    kafka.produce(topic, [v2.encode(d) for d in rows], keys=[d["order_id"] for d in rows])
    plan = _plan(topic, out)
    plan["nodes"][2].update(format="avro", avro={"record": "shop.OrderOut"})
    assert _run(spark, kafka, plan, tmp_path, out) is None

    writer = A.record_doc("shop.OrderOut", [("order_id", "string", True),
                                            ("amount", "double", True),
                                            ("note", "string", True), ("qty", "int", True)])
    records = kafka.read_all(out)
    ids = {unframe(r.value)[0] for r in records}
    (sid,) = ids
    # the id the records carry is the subject's registered version of the derived schema
    assert json.loads(client.schema(sid)) == json.loads(A.canonical(A.parse(writer)))
    dec = AvroDecoder(out, A.canonical(A.parse(writer)), client)
    pairs = [(r.key_json(), dec.decode(r.value, r.partition, r.offset)) for r in records]
    # keys stay JSON objects of the key columns
    assert all(k == {"order_id": v["order_id"]} for k, v in pairs)
    got = sorted((v for _, v in pairs), key=lambda d: d["order_id"])
    want = sorted((d for d in rows if d["amount"] >= 10), key=lambda d: d["order_id"])
    assert got == want
