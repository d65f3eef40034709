"""The gated sink's Avro values written from Arrow columns (gates.avro.ArrowRows) against the
JSON path they replace (gates.avro.JsonToAvro over Spark's ``to_json`` text): the same
bytes, row for row.  No Spark JVM, no Kafka: the Arrow columns are of the types Spark's
``toArrow`` gives, the JSON text is what ``to_json`` writes with the sink's options."""
from __future__ import annotations

import datetime as dt
import decimal
import json

import pytest

from compat.registry import RegistryClient
from tests.test_avro_wire import registry  # noqa: F401 - a fixture

pa = pytest.importorskip("pyarrow")
pytest.importorskip("fastavro")

UTC = dt.UTC
COLS = [("id", "bigint", False), ("n", "int", True), ("small", "smallint", True),
        ("name", "string", True), ("ok", "boolean", True), ("x", "double", True),
        ("f", "float", True), ("ts", "timestamp", True), ("local", "timestamp_ntz", True),
        ("day", "date", True), ("price", "decimal(10,2)", True), ("raw", "binary", True)]
ARROW = {"bigint": pa.int64(), "int": pa.int32(), "smallint": pa.int16(),
         "string": pa.string(), "boolean": pa.bool_(), "double": pa.float64(),
         "float": pa.float32(), "timestamp": pa.timestamp("us", tz="UTC"),
         "timestamp_ntz": pa.timestamp("us"), "day": pa.date32(), "date": pa.date32(),
         "decimal(10,2)": pa.decimal128(10, 2), "binary": pa.binary()}
LONG_TEXT = "é" * 5000  # a length past the encoder's table of small lengths
ROWS = [
    # (the row as Arrow holds it, the same row as to_json writes it)
    ({"id": 7, "n": 3, "small": -2, "name": "x", "ok": True, "x": 1.5, "f": 0.1,
      "ts": dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
      "local": dt.datetime(2026, 1, 2, 3, 4, 5), "day": dt.date(2026, 1, 2),
      "price": decimal.Decimal("12.34"), "raw": b"\x00\x01"},
     '{"id":7,"n":3,"small":-2,"name":"x","ok":true,"x":1.5,"f":0.1,'
     '"ts":"2026-01-02T03:04:05.000006Z","local":"2026-01-02T03:04:05.000000",'
     '"day":"2026-01-02","price":12.34,"raw":"AAE="}'),
    ({"id": -(2 ** 63), "n": -(2 ** 31), "small": 32767, "name": LONG_TEXT, "ok": False,
      "x": -1e300, "f": -3.4028234663852886e38,
      "ts": dt.datetime(1960, 5, 6, 7, 8, 9, 999999, tzinfo=UTC),
      "local": dt.datetime(1900, 1, 1), "day": dt.date(1901, 12, 31),
      "price": decimal.Decimal("-99999999.99"), "raw": b""},
     json.dumps({"id": -(2 ** 63), "n": -(2 ** 31), "small": 32767, "name": LONG_TEXT,
                 "ok": False, "x": -1e300, "f": -3.4028235E38,
                 "ts": "1960-05-06T07:08:09.999999Z", "local": "1900-01-01T00:00:00.000000",
                 "day": "1901-12-31", "price": -99999999.99, "raw": ""})),
    ({"id": 2 ** 63 - 1, **{n: None for n, _, _ in COLS[1:]}},
     json.dumps({"id": 2 ** 63 - 1, **{n: None for n, _, _ in COLS[1:]}})),
    ({"id": 0, "n": 8191, "small": 8192, "name": "", "ok": True, "x": 0.0, "f": 0.0,
      "ts": dt.datetime(1970, 1, 1, tzinfo=UTC), "local": dt.datetime(1970, 1, 1),
      "day": dt.date(1970, 1, 1), "price": decimal.Decimal("0.00"), "raw": b"\xff" * 9000},
     '{"id":0,"n":8191,"small":8192,"name":"","ok":true,"x":0.0,"f":0.0,'
     '"ts":"1970-01-01T00:00:00.000000Z","local":"1970-01-01T00:00:00.000000",'
     '"day":"1970-01-01","price":0.00,"raw":"' + __import__("base64").b64encode(
         b"\xff" * 9000).decode() + '"}'),
]


def table(cols, rows):
    return pa.table({n: pa.array([r.get(n) for r in rows], type=ARROW[t])
                     for n, t, _ in cols})


def encoder(registry, cols, subject="out-value", schema=None):  # noqa: F811
    from compat import avro as A
    from gates.avro import JsonToAvro

    text = schema or A.canonical(A.parse(A.record_doc("shop.R", cols)))
    return JsonToAvro(subject, text, RegistryClient(registry))


def test_arrow_rows_are_the_bytes_the_json_path_wrote(registry):  # noqa: F811
    enc = encoder(registry, COLS)
    rows = enc.arrow({n: t for n, t, _ in COLS})
    assert rows is not None
    got = rows(table(COLS, [r for r, _ in ROWS]))
    assert got == [enc(text) for _, text in ROWS]
    assert all(v[:5] == b"\x00" + enc.schema_id.to_bytes(4, "big") for v in got)


def test_a_given_schema_in_another_order_with_a_defaulted_field_and_promotions(registry):  # noqa: F811,E501
    schema = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": "double"}, {"name": "note", "type": "string",
                                          "default": "none"},
        {"name": "id", "type": "long"}, {"name": "n", "type": ["long", "null"]},
        {"name": "f", "type": ["null", "double"], "default": None}]})
    cols = [("id", "int", False), ("n", "smallint", True), ("x", "bigint", False),
            ("f", "int", True)]
    enc = encoder(registry, cols, schema=schema)
    rows = enc.arrow({n: t for n, t, _ in cols})
    assert rows is not None
    data = [{"id": 1, "n": 2, "x": 3, "f": 4}, {"id": -1, "n": None, "x": 2 ** 40, "f": None}]
    assert rows(table(cols, data)) == [enc(json.dumps(d)) for d in data]


@pytest.mark.parametrize("cols,field", [
    ([("f", "float", True)], {"name": "f", "type": ["null", "double"], "default": None}),
    ([("xs", "array<int>", True)], {"name": "xs", "type": {"type": "array",
                                                          "items": "int"}}),
    ([("s", "string", True)], {"name": "s", "type": ["null", "string", "long"]}),
    ([("ts", "timestamp", True)], {"name": "ts", "type": {"type": "long",
                                                          "logicalType": "timestamp-millis"}}),
    ([("n", "bigint", True)], {"name": "n", "type": "int"}),
    ([("a", "int", True)], {"name": "b", "type": "int"}),
])
def test_pairs_it_does_not_write_keep_the_json_path(registry, cols, field):  # noqa: F811
    """A float column as an Avro double (Java's shortest text of the float, not its exact
    value), collections, unions of several types, millisecond timestamps, a narrowing, a
    field that is no column and has no default: no Arrow encoder, the JSON path."""
    schema = json.dumps({"type": "record", "name": "R", "fields": [field]})
    enc = encoder(registry, [], schema=schema)
    assert enc.arrow({n: t for n, t, _ in cols}) is None


def test_a_null_in_a_field_that_is_not_nullable_fails(registry):  # noqa: F811
    enc = encoder(registry, [("id", "bigint", False)])
    rows = enc.arrow({"id": "bigint"})
    with pytest.raises(TypeError):
        rows(pa.table({"id": pa.array([1, None], type=pa.int64())}))


def test_the_gated_source_builds_its_batch_from_the_rows_as_one_struct_array(
        registry, monkeypatch):  # noqa: F811
    """Avro rows to Arrow in one conversion (gates.source._ArrowBuilder.from_avro): the
    batch a list per column made, nulls, nested records and non-null columns kept."""
    pytest.importorskip("pyspark")
    from pyspark.sql import types as S

    from compat import avro as A
    from gates.source import SourceOptions, _ArrowBuilder

    cols = [("id", "bigint", False), ("name", "string", True), ("ts", "timestamp", True),
            ("price", "decimal(10,2)", True), ("tags", "array<string>", True),
            ("pos", "struct<x:double,y:double>", True)]
    schema = A.canonical(A.parse(A.record_doc("shop.R", cols)))
    opts = SourceOptions.parse({"bootstrap": "b:1", "topic": "t", "format": "avro",
                                "schema": ", ".join(f"`{n}` {t}" for n, t, _ in cols),
                                "avroSchema": schema, "registry": registry})
    xy = S.StructType([S.StructField("x", S.DoubleType()), S.StructField("y", S.DoubleType())])
    builder = _ArrowBuilder(S.StructType([
        S.StructField("id", S.LongType(), False), S.StructField("name", S.StringType()),
        S.StructField("ts", S.TimestampType()), S.StructField("price", S.DecimalType(10, 2)),
        S.StructField("tags", S.ArrayType(S.StringType())), S.StructField("pos", xy)]),
        "avro", opts)
    docs = [{"id": i, "name": f"n{i}" if i % 3 else None,
             "ts": dt.datetime(2026, 1, 2, 3, 4, i, tzinfo=UTC),
             "price": decimal.Decimal(f"{i}.25"), "tags": ["a", None][: i % 3],
             "pos": {"x": i / 2, "y": None} if i % 2 else None} for i in range(50)]
    by_column = pa.RecordBatch.from_arrays(
        [pa.array([d.get(f.name) for d in docs], type=f.type) for f in builder.pa_schema],
        schema=builder.pa_schema)
    calls = []
    real = pa.array
    monkeypatch.setattr(pa, "array", lambda *a, **kw: calls.append(kw.get("type")) or
                        real(*a, **kw))
    batch = builder.from_avro(docs)
    assert calls == [builder.pa_struct]  # one conversion, not one per column
    assert batch.schema == builder.pa_schema and batch.equals(by_column)
