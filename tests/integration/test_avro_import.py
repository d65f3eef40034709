"""PySpark jobs on Avro topics, on real Spark with spark-avro: a job using ``from_avro`` and
``to_avro`` over the value imports to ``format: avro`` with its schemas; ``plan export
--pyspark`` of an Avro plan is a job that Spark runs on Kafka and the registry, whose output
is the plan's, and that imports back to the same plan."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_avro_registry import schema_registry  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "pyspark_avro"
CASES = sorted(p for p in FIX.iterdir() if (p / "job.py").exists())

pytestmark = pytest.mark.integration


@pytest.fixture
def avro_functions(kafka_connector):
    """The shared session, when spark-avro's functions load in it."""
    if not kafka_connector._jvm.org.apache.spark.util.Utils.classIsLoadable(
            "org.apache.spark.sql.avro.AvroDataToCatalyst"):
        pytest.skip("spark-avro is not on the session's class path (mvn, Maven Central)")
    return kafka_connector


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_an_avro_job_imports_to_its_expected_plan(case, avro_functions, monkeypatch):
    from migrate.adopt import import_job

    monkeypatch.delenv("TOPIC_PREFIX", raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")  # no broker: partitions from flag
    expected = json.loads((case / "plan.json").read_text())
    got = import_job(str(case / "job.py"), partitions=3, delivery="exactly_once")
    got.pop("metadata")
    for n in got["nodes"]:
        n.pop("x-origin")
    assert got == expected


def test_from_avro_options_and_other_columns_are_refused(avro_functions, tmp_path):
    from compat.errors import JobError
    from migrate.adopt import import_job

    job = (FIX / "big_orders" / "job.py").read_text()
    bad = {
        "permissive": (job.replace("length(value) - 5)\"), ORDER)",
                                   "length(value) - 5)\"), ORDER, {'mode': 'PERMISSIVE'})"),
                       "from_avro options cannot be expressed"),
        "key": (job.replace("F.expr(\"substring(value, 6, length(value) - 5)\")",
                            "F.col(\"key\")"),
                "from_avro must read the record value"),
    }
    for name, (text, words) in bad.items():
        assert text != job, name
        f = tmp_path / f"{name}.py"
        f.write_text(text)
        with pytest.raises(JobError, match=words):
            import_job(str(f), partitions=3)


def _produce(kafka, topic: str, client, rows: list[dict]) -> None:
    from gates.avro import AvroEncoder

    enc = AvroEncoder(f"{topic}-value", json.dumps(WRITER), client)
    kafka.produce(topic, [enc.encode(r) for r in rows], partition=lambda i: i % 2)


WRITER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"}, {"name": "amount", "type": "double"},
    {"name": "qty", "type": "int"}, {"name": "region", "type": ["null", "string"],
                                     "default": None}]}


def test_an_exported_avro_plan_runs_on_spark_and_imports_back(
        avro_functions, kafka, schema_registry, tmp_path, monkeypatch):  # noqa: F811
    import importlib.util

    from compat.check import check_plans
    from compat.export import to_pyspark
    from compat.infer import analyze
    from compat.registry import RegistryClient
    from compat.serde import from_doc
    from gates.avro import AvroDecoder, unframe
    from migrate.adopt import import_job

    spark = avro_functions
    src = kafka.topic("avro-job-in", partitions=2)
    out = kafka.topic("avro-job-out", partitions=1)
    doc = json.loads((FIX / "big_orders" / "plan.json").read_text())
    doc["nodes"][0].update(topic=src, partitions=2)
    doc["nodes"][-1]["topic"] = out
    plan = from_doc(doc, str(tmp_path / "plan.json"))
    analyze(plan)
    job = tmp_path / "exported.py"
    job.write_text(to_pyspark(plan))

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", schema_registry)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka.bootstrap)
    monkeypatch.setenv("CHECKPOINT", str(tmp_path / "ck"))
    client = RegistryClient(schema_registry)
    rows = [{"order_id": f"o{i}", "amount": i * 7.5, "qty": i % 4,
             "region": None if i % 5 == 0 else f"r{i % 3}"} for i in range(60)]
    _produce(kafka, src, client, rows)

    spec = importlib.util.spec_from_file_location("exported_avro_job", job)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    q = mod.build(spark).trigger(availableNow=True).start()
    try:
        q.awaitTermination(180)
    finally:
        if q.isActive:
            q.stop()
    assert q.exception() is None, q.exception()

    records = kafka.read_all(out)
    (sid,) = {unframe(r.value)[0] for r in records}
    # the id the job put in front is its schema's under <topic>-value
    versions = client._request("GET", f"/subjects/{out}-value/versions")
    assert sid == client._request("GET", f"/subjects/{out}-value/versions/{versions[-1]}"
                                  )["id"]
    dec = AvroDecoder(out, client.schema(sid), client)
    pairs = [(r.key_json(), dec.decode(r.value, r.partition, r.offset)) for r in records]
    assert all(k == {"order_id": v["order_id"]} for k, v in pairs)
    got = sorted((v for _, v in pairs), key=lambda d: d["order_id"])
    want = sorted(({"order_id": r["order_id"], "total": r["amount"] * r["qty"],
                    "region": r["region"]} for r in rows if r["amount"] * r["qty"] > 100),
                  key=lambda d: d["order_id"])
    assert got == want and len(want) > 20

    # and the job imports back to the plan it was written from
    back = from_doc(import_job(str(job), partitions=2, delivery=plan.sink.delivery),
                    str(job))
    report = check_plans(plan, back)
    assert report.verdict == "identical", [f.message for f in report.findings]
