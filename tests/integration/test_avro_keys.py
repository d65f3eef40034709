"""Avro record keys at run time (``avro.key``), on real Kafka, Spark and the registry: a table
whose keys and values are Avro (upserts and tombstones, the producer's own key record) is
aggregated into an output whose keys are Avro too, and the output, read back as a compacted
topic through the registry, is the aggregate of the table's last values."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.integration.test_avro_registry import _run, schema_registry  # noqa: F401

pytestmark = pytest.mark.integration

USER_KEY = json.dumps({"type": "record", "name": "UserKey", "namespace": "com.acme",
                       "fields": [{"name": "user_id", "type": "string"}]})
USER = json.dumps({"type": "record", "name": "User", "namespace": "shop", "fields": [
    {"name": "user_id", "type": "string"}, {"name": "region", "type": "string"},
    {"name": "score", "type": "long"}]})


def _plan(src: str, out: str) -> dict:
    return {"format": "theseus.plan/1", "query": "avro_keys", "config": {"state_partitions": 2},
            "nodes": [
                {"id": "users", "step": "source", "version": 2, "topic": src, "partitions": 2,
                 "format": "avro", "role": "table", "key_columns": ["user_id"],
                 "avro": {"record": "shop.User", "key": True},
                 "schema": [{"name": "user_id", "type": "string"},
                            {"name": "region", "type": "string"},
                            {"name": "score", "type": "bigint"}]},
                {"id": "per_region", "step": "aggregate", "version": 1, "inputs": ["users"],
                 "group_by": [{"name": "region", "expr": "region"}],
                 "aggregates": [{"name": "n", "function": "count", "args": ["*"]},
                                {"name": "total", "function": "sum", "args": ["score"]}]},
                {"id": "out", "step": "sink", "version": 1, "inputs": ["per_region"],
                 "topic": out, "format": "avro", "key_columns": ["region"], "mode": "update",
                 "delivery": "exactly_once",
                 "avro": {"record": "shop.RegionStats", "key": True}}]}


def test_a_table_with_avro_keys_aggregates_into_avro_keys_exactly(
        spark, kafka, schema_registry, tmp_path, monkeypatch):  # noqa: F811
    from compat.registry import RegistryClient
    from gates.avro import AvroDecoder, AvroEncoder, unframe

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", schema_registry)
    client = RegistryClient(schema_registry)
    src = kafka.topic("avro-keys-in", partitions=2)
    out = kafka.topic("avro-keys-out", partitions=1)
    keys = AvroEncoder(f"{src}-key", USER_KEY, client)
    values = AvroEncoder(f"{src}-value", USER, client)
    regions = ["north", "south", "east"]
    table: dict[str, dict] = {}
    batch_keys, batch_values = [], []

    def put(uid: str, doc: dict | None) -> None:
        batch_keys.append(keys.encode({"user_id": uid}))
        batch_values.append(values.encode(doc) if doc is not None else None)
        if doc is None:
            table.pop(uid, None)
        else:
            table[uid] = doc

    for i in range(60):
        put(f"u{i}", {"user_id": f"u{i}", "region": regions[i % 3], "score": i})
    for i in range(0, 60, 3):  # moves: north -> south, new scores
        put(f"u{i}", {"user_id": f"u{i}", "region": "south", "score": 100 + i})
    for i in range(1, 60, 6):  # deletions
        put(f"u{i}", None)
    kafka.produce(src, batch_values, keys=batch_keys)

    assert _run(spark, kafka, _plan(src, out), tmp_path, out) is None

    records = kafka.read_all(out)
    key_ids = {unframe(r.key)[0] for r in records}
    (key_sid,) = key_ids
    assert json.loads(client.schema(key_sid))["name"] == "shop.RegionStatsKey"
    kdec = AvroDecoder(out, client.schema(key_sid), client)
    last: dict[str, dict | None] = {}
    for r in sorted(records, key=lambda r: r.offset):
        k = kdec.decode(r.key, r.partition, r.offset)
        sid = unframe(r.value)[0] if r.value is not None else None
        last[k["region"]] = None if r.value is None else AvroDecoder(
            out, client.schema(sid), client).decode(r.value, r.partition, r.offset)
    got = {k: (v["n"], v["total"]) for k, v in last.items() if v is not None}
    n = Counter(d["region"] for d in table.values())
    want = {reg: (n[reg], sum(d["score"] for d in table.values() if d["region"] == reg))
            for reg in n}
    assert got == want and set(want) == {"south", "east"}  # every north user moved
