"""The gated sink's Avro batch from Spark's Arrow columns is byte for byte what it wrote
through Spark's ``to_json`` before (values, Avro keys, deletes and a changelog's signs), in
a session whose time zone is not UTC.  Spark and the registry; no Kafka."""
from __future__ import annotations

import pytest

from tests.integration.test_avro_registry import schema_registry  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration

ROWS = """
SELECT * FROM VALUES
  (1L, 3, 'a', 1.5D, CAST(0.1 AS FLOAT), TIMESTAMP'2026-01-02 03:04:05.000006',
   TIMESTAMP_NTZ'2026-01-02 03:04:05', DATE'2026-01-02', CAST(12.34 AS DECIMAL(10,2)),
   X'0001', true, 'U', 1),
  (-9223372036854775808L, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'U', 1),
  (2L, -7, 'ü', -1e300D, CAST(-2.5 AS FLOAT), TIMESTAMP'1960-05-06 07:08:09.999999',
   TIMESTAMP_NTZ'1900-01-01 00:00:00', DATE'1901-12-31', CAST(-99999999.99 AS DECIMAL(10,2)),
   X'', false, 'D', -1),
  (3L, 8191, repeat('é', 5000), 0D, CAST(0 AS FLOAT), TIMESTAMP'1970-01-01 00:00:00',
   TIMESTAMP_NTZ'1970-01-01 00:00:00', DATE'1970-01-01', CAST(0 AS DECIMAL(10,2)),
   X'FF', true, 'U', 1)
AS t(id, n, name, x, f, ts, local, day, price, raw, ok, _theseus_op, _theseus_sign)
"""


@pytest.mark.parametrize("extra", [[], ["_theseus_op"], ["_theseus_sign"]])
def test_the_avro_batch_from_arrow_is_what_to_json_wrote(spark, schema_registry, extra):  # noqa: F811,E501
    from compat import avro as A
    from compat.registry import RegistryClient
    from gates.avro import JsonToAvro
    from gates.sink import encode_batch

    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        df = spark.sql(ROWS)
        cols = [c for c in df.columns if not c.startswith("_theseus")]
        df = df.select(*cols, *extra)
        fields = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        client = RegistryClient(schema_registry)
        value = A.canonical(A.parse(A.record_doc(
            "it.ArrowOut", [(c, fields[c], c != "id") for c in cols])))
        key = A.canonical(A.parse(A.record_doc("it.ArrowOutKey", [("id", "bigint", False)])))
        enc = JsonToAvro("it-arrow-out-value", value, client)
        enc_key = JsonToAvro("it-arrow-out-key", key, client)
        # the float column is written as an Avro float: every column takes the Arrow path
        assert enc.arrow({c: fields[c] for c in cols}) is not None
        for keys in ([], ["id"]):
            fast = encode_batch(df, keys, enc, enc_key if keys else None)
            json_keys, json_values = encode_batch(df, keys)  # the JSON path, as before
            before_k = [None if k is None else enc_key(k) for k in json_keys]
            assert fast == (before_k, [enc(v) for v in json_values]), (extra, keys)
            assert all(v is None or v[:1] == b"\x00" for v in fast[1])
            if extra == ["_theseus_op"]:
                assert fast[1].count(None) == 1  # the deleted row: a tombstone
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
