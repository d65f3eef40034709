"""Avro record keys (``avro.key``) at run time, without Spark or Kafka: the sink's key schema
and subject, the sink writing its keys in the wire format, the gated source reading a
table's keys from Avro records of any writer schema (the registry stand-in of
tests/test_avro_wire)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from compat.registry import RegistryClient
from tests.test_avro_wire import FakeRegistry, registry  # noqa: F401 - a fixture

fastavro = pytest.importorskip("fastavro")

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "fixtures" / "avro" / "output_field_added_with_default_backward" / "old.json"


def _keyed_plan():
    from compat.serde import from_doc

    doc = json.loads(PLAN.read_text())
    doc["nodes"][-1]["avro"]["key"] = True
    return from_doc(doc, str(PLAN))


def test_the_key_schema_is_a_record_of_the_key_columns_under_the_key_subject():
    from compat import avro as A
    from compat.infer import analyze
    from compat.steps.sink import avro_key_schema, avro_key_subject

    plan = _keyed_plan()
    analyze(plan)
    info = plan.info[plan.sink.id]
    schema = avro_key_schema(plan.sink, info)
    assert json.loads(A.canonical(schema)) == {
        "type": "record", "name": "shop.OrderAmountKey",
        "fields": [{"name": "order_id", "type": ["null", "string"], "default": None}]}
    assert avro_key_subject(plan.sink, info) == "order_amounts-key"
    import dataclasses

    by_record = dataclasses.replace(plan.sink, avro=dataclasses.replace(
        plan.sink.avro, subject="record_name"))
    assert avro_key_subject(by_record, info) == "shop.OrderAmountKey"


class _Producer:
    def __init__(self):
        self.sent = []

    def produce(self, topic, value, key):
        self.sent.append((topic, key, value))

    def poll(self, _):
        pass


def test_the_sink_writes_its_keys_in_the_wire_format(registry):  # noqa: F811
    from gates.avro import AvroDecoder, JsonToAvro, unframe
    from gates.sink import KafkaSink

    client = RegistryClient(registry)
    key_schema = json.dumps({"type": "record", "name": "shop.OrderKey", "fields": [
        {"name": "order_id", "type": ["null", "string"], "default": None}]})
    value_schema = json.dumps({"type": "record", "name": "shop.Order", "fields": [
        {"name": "order_id", "type": ["null", "string"], "default": None},
        {"name": "amount", "type": ["null", "double"], "default": None}]})
    sink = KafkaSink("127.0.0.1:1", "out", ["order_id"], "q", "at_least_once",
                     encode=JsonToAvro("out-value", value_schema, client),
                     encode_key=JsonToAvro("out-key", key_schema, client))
    producer = _Producer()
    sink._producer = producer
    sink._produce("out", ['{"order_id":"a"}', None],
                  ['{"order_id":"a","amount":1.5}', '{"order_id":null,"amount":2.0}'])
    (_, k1, v1), (_, k2, _v2) = producer.sent
    assert k2 is None  # a null key stays one
    assert unframe(k1)[0] == FakeRegistry.subjects["out-key"][0] != unframe(v1)[0]
    assert AvroDecoder("out", key_schema, client).decode(k1, 0, 0) == {"order_id": "a"}


def test_a_table_reads_its_key_columns_from_avro_keys_of_any_record_name(registry):  # noqa: F811,E501
    from gates.avro import AvroEncoder
    from gates.source import SourceOptions, _key_of

    client = RegistryClient(registry)
    opts = SourceOptions.parse({
        "bootstrap": "127.0.0.1:1", "topic": "ships", "format": "avro", "role": "table",
        "key_columns": "ship_id,port", "registry": registry, "avroKey": "true",
        "avroSchema": json.dumps({"type": "record", "name": "Ship", "fields": [
            {"name": "load", "type": "int"}]})})
    assert opts.avro_key
    # a producer's own key record: another name, another field order, one more field
    key = AvroEncoder("ships-key", json.dumps({
        "type": "record", "name": "com.acme.ShipKey", "fields": [
            {"name": "port", "type": "string"}, {"name": "ship_id", "type": "long"},
            {"name": "region", "type": "string"}]}), client).encode(
        {"port": "HAM", "ship_id": 7, "region": "eu"})

    class Msg:
        def key(self):
            return key

        def partition(self):
            return 1

        def offset(self):
            return 42

    ident, kd = _key_of(opts, Msg(), {"load": 3})
    assert ident == ("7", '"HAM"')
    assert kd["ship_id"] == 7 and kd["port"] == "HAM"

    class Bad(Msg):
        def key(self):
            return b'{"ship_id": 7}'

    from compat.errors import SourceError

    with pytest.raises(SourceError, match="not in the schema registry's wire format") as e:
        _key_of(opts, Bad(), None)
    assert "offset 42" in str(e.value)


@pytest.mark.parametrize("written", [None, "prove.q.out"])
def test_the_sink_registers_under_the_subject_of_the_topic_it_really_writes(
        registry, monkeypatch, written):  # noqa: F811
    # theseus prove writes the new plan's output to a topic of its own: registering its
    # schema under the plan's topic would put an undeployed schema on the production subject
    from compat.infer import analyze
    from migrate.build.core import Builder, BuildOptions

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", registry)
    plan = _keyed_plan()
    analyze(plan)
    b = Builder.__new__(Builder)  # no Spark: only the encoders are made
    b.plan, b.opts = plan, BuildOptions("127.0.0.1:1", output_topic=written)
    b._avro_encode()
    b._avro_encode(key=True)
    topic = written or plan.sink.topic
    assert sorted(FakeRegistry.subjects) == [f"{topic}-key", f"{topic}-value"]
