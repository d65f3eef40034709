"""compat.avro: parsing, Spark types and Avro's schema resolution rules (no Spark, no registry).

Every verdict of the resolution table is also checked against fastavro (the runtime's Avro
library): a pair judged compatible must decode a record the writer encoded, one judged
incompatible must be refused by fastavro's reader too."""
from __future__ import annotations

import io
import json

import pytest

from compat import avro as A


def rec(*fields, name="R", **extra):
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def fld(name, typ, **kw):
    return {"name": name, "type": typ, **kw}


# (case, reader, writer, rules of the incompatibilities expected, sample written)
CASES = [
    ("same", rec(fld("a", "int")), rec(fld("a", "int")), [], {"a": 1}),
    ("reader adds field with default", rec(fld("a", "int"), fld("b", "string", default="x")),
     rec(fld("a", "int")), [], {"a": 1}),
    ("reader adds field without default", rec(fld("a", "int"), fld("b", "string")),
     rec(fld("a", "int")), ["READER_FIELD_MISSING_DEFAULT_VALUE"], {"a": 1}),
    ("reader adds nullable field with null default",
     rec(fld("a", "int"), fld("b", ["null", "string"], default=None)),
     rec(fld("a", "int")), [], {"a": 1}),
    ("writer has extra field", rec(fld("a", "int")), rec(fld("a", "int"), fld("b", "long")),
     [], {"a": 1, "b": 2}),
    ("int promoted to long", rec(fld("a", "long")), rec(fld("a", "int")), [], {"a": 7}),
    ("int promoted to double", rec(fld("a", "double")), rec(fld("a", "int")), [], {"a": 7}),
    ("long narrowed to int", rec(fld("a", "int")), rec(fld("a", "long")),
     ["TYPE_MISMATCH"], {"a": 7}),
    ("float promoted to double", rec(fld("a", "double")), rec(fld("a", "float")), [],
     {"a": 1.5}),
    ("string read as bytes", rec(fld("a", "bytes")), rec(fld("a", "string")), [],
     {"a": "x"}),
    ("string read as int", rec(fld("a", "int")), rec(fld("a", "string")),
     ["TYPE_MISMATCH"], {"a": "x"}),
    ("record renamed", rec(fld("a", "int"), name="S"), rec(fld("a", "int")),
     ["NAME_MISMATCH"], {"a": 1}),
    ("record renamed with alias", rec(fld("a", "int"), name="S", aliases=["R"]),
     rec(fld("a", "int")), [], {"a": 1}),
    ("field renamed with alias", rec(fld("c", "int", aliases=["a"])), rec(fld("a", "int")),
     [], {"a": 1}),
    ("nullable reader of plain writer", rec(fld("a", ["null", "int"])), rec(fld("a", "int")),
     [], {"a": 1}),
    ("plain reader of nullable writer", rec(fld("a", "int")), rec(fld("a", ["null", "int"])),
     ["TYPE_MISMATCH"], {"a": None}),
    ("union lacks writer's branch", rec(fld("a", ["null", "string"])),
     rec(fld("a", "int")), ["MISSING_UNION_BRANCH"], {"a": 1}),
    ("union branch promoted", rec(fld("a", ["null", "long"])), rec(fld("a", "int")), [],
     {"a": 3}),
    ("enum symbol added to reader",
     rec(fld("e", {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]})),
     rec(fld("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]})), [], {"e": "B"}),
    ("enum symbol missing in reader",
     rec(fld("e", {"type": "enum", "name": "E", "symbols": ["A"]})),
     rec(fld("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]})),
     ["MISSING_ENUM_SYMBOLS"], {"e": "B"}),
    ("enum symbol missing, reader default",
     rec(fld("e", {"type": "enum", "name": "E", "symbols": ["A", "Z"], "default": "Z"})),
     rec(fld("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]})), [], {"e": "B"}),
    ("fixed size changed", rec(fld("f", {"type": "fixed", "name": "F", "size": 4})),
     rec(fld("f", {"type": "fixed", "name": "F", "size": 8})), ["FIXED_SIZE_MISMATCH"],
     {"f": b"12345678"}),
    ("array items promoted", rec(fld("xs", {"type": "array", "items": "long"})),
     rec(fld("xs", {"type": "array", "items": "int"})), [], {"xs": [1, 2]}),
    ("map values narrowed", rec(fld("m", {"type": "map", "values": "int"})),
     rec(fld("m", {"type": "map", "values": "double"})), ["TYPE_MISMATCH"], {"m": {"k": 1.0}}),
    ("nested field added without default",
     rec(fld("o", rec(fld("x", "int"), fld("y", "int"), name="O"))),
     rec(fld("o", rec(fld("x", "int"), name="O"))), ["READER_FIELD_MISSING_DEFAULT_VALUE"],
     {"o": {"x": 1}}),
]


@pytest.mark.parametrize("case,reader,writer,rules,sample", CASES, ids=[c[0] for c in CASES])
def test_resolution_rules(case, reader, writer, rules, sample):
    found = A.incompatibilities(A.parse(json.dumps(reader)), A.parse(json.dumps(writer)))
    assert [i.rule for i in found] == rules, [i.message for i in found]


@pytest.mark.parametrize("case,reader,writer,rules,sample", CASES, ids=[c[0] for c in CASES])
def test_fastavro_agrees(case, reader, writer, rules, sample):
    fastavro = pytest.importorskip("fastavro")
    w = fastavro.parse_schema(writer)
    r = fastavro.parse_schema(reader)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, w, sample)
    buf.seek(0)
    if rules:
        with pytest.raises(Exception):  # noqa: B017 - fastavro's errors have no one root
            fastavro.schemaless_reader(buf, w, r)
    else:
        fastavro.schemaless_reader(buf, w, r)


def test_the_incompatibility_names_the_field_path():
    reader = rec(fld("o", rec(fld("x", "int"), fld("y", "int"), name="O")))
    writer = rec(fld("o", rec(fld("x", "int"), name="O")))
    (inc,) = A.incompatibilities(A.parse(reader), A.parse(writer))
    assert inc.path == "o.y"
    assert "'o.y' (int) has no default" in inc.message


def test_levels_pick_the_direction():
    old = A.parse(rec(fld("a", "int")))
    new = A.parse(rec(fld("a", "int"), fld("b", "int")))
    assert [d for d, _ in A.check_level(old, new, A.LEVELS["BACKWARD"])] == ["backward"]
    assert list(A.check_level(old, new, A.LEVELS["FORWARD"])) == []
    assert [d for d, _ in A.check_level(old, new, A.LEVELS["FULL"])] == ["backward"]
    # dropping a field without a default is the mirror: old readers miss it
    assert [d for d, _ in A.check_level(new, old, A.LEVELS["FULL"])] == ["forward"]


def test_recursive_record_resolves():
    node = rec(fld("v", "int"), fld("next", ["null", "Node"], default=None), name="Node")
    s = A.parse(node)
    assert A.incompatibilities(s, s) == []
    assert A.canonical(A.parse(A.canonical(s))) == A.canonical(s)


@pytest.mark.parametrize("doc,where,words", [
    ("{", "", "not JSON"),
    ({"type": "record", "fields": []}, "/name", "needs a name"),
    (rec(fld("a", "int"), fld("a", "long")), "/fields/1/name", "declared twice"),
    (rec(fld("a", "int", default="x")), "/fields/0/default", "does not fit"),
    (rec(fld("a", ["null", "int"], default=1)), "/fields/0/default", "first branch"),
    (rec(fld("a", "Nope")), "/fields/0/type", "unknown Avro type 'Nope'"),
    (rec(fld("a", ["int", "int"])), "/fields/0/type/1", "twice"),
    ({"type": "enum", "name": "E", "symbols": ["A", "A"]}, "/symbols", "distinct"),
    ({"type": "bytes", "logicalType": "decimal", "precision": 0}, "", "precision"),
])
def test_invalid_schemas_point_inside_the_schema(doc, where, words):
    with pytest.raises(A.AvroSchemaError) as e:
        A.parse(doc if isinstance(doc, str) else json.dumps(doc))
    assert e.value.schema_pointer == where
    assert words in str(e.value)


def test_columns_become_a_record_and_read_back_as_the_same_types():
    cols = [("id", "bigint", False), ("name", "string", True), ("amount", "decimal(10,2)", True),
            ("ts", "timestamp", True), ("day", "date", True), ("tags", "array<string>", True),
            ("attrs", "map<string,int>", True), ("pos", "struct<x:double,y:double>", True),
            ("raw", "binary", True), ("small", "smallint", True)]
    doc = A.record_doc("shop.orders", cols)
    s = A.parse(doc)
    assert s["name"] == "shop.orders"
    back = [(f["name"], *A.spark_type(f["type"])) for f in s["fields"]]
    # smallint widens to int: Avro has no 16-bit integer
    assert back == [(n, "int" if t == "smallint" else t, nul) for n, t, nul in cols]
    # a nullable column defaults to null, so adding one keeps both directions compatible
    old = A.parse(A.record_doc("shop.orders", cols[:1]))
    assert list(A.check_level(old, s, A.LEVELS["FULL"])) == []


def test_unsupported_spark_types_are_refused():
    with pytest.raises(A.UnsupportedType, match="string keys"):
        A.avro_type("map<int,string>", "R")
    with pytest.raises(A.UnsupportedType, match="not one type or null"):
        A.spark_type(A.parse(json.dumps(["int", "string"])))


def test_record_name_of_a_topic():
    assert A.record_name("shop.orders-v2") == "shop_orders_v2"
    assert A.record_name("1x") == "_1x"
