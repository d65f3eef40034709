"""The registry's wire format (gates.avro) and the registry client (compat.registry) against a
registry stand-in served over HTTP on loopback; the gated source's Avro rows as Arrow.
No Spark JVM, no Kafka."""
from __future__ import annotations

import datetime as dt
import decimal
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from compat.errors import SourceError
from compat.registry import RegistryClient, RegistryError

fastavro = pytest.importorskip("fastavro")


API = "/apis/ccompat/v7"


class FakeRegistry(BaseHTTPRequestHandler):
    """The few ccompat v7 calls Theseus makes, answered as Apicurio answers them."""

    schemas: dict[int, str] = {}
    subjects: dict[str, list[int]] = {}
    levels: dict[str, str] = {}
    calls: list[str] = []
    auth: list[str | None] = []

    def log_message(self, *a):  # quiet
        pass

    def _send(self, code: int, doc) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self.calls.append(f"GET {self.path}")
        self.auth.append(self.headers.get("Authorization"))
        parts = self.path.removeprefix(API).strip("/").split("/")
        if parts[:2] == ["schemas", "ids"]:
            sid = int(parts[2])
            if sid in self.schemas:
                return self._send(200, {"schema": self.schemas[sid]})
            return self._send(404, {"error_code": 40403, "message": "no such id"})
        if parts[0] == "config":
            if len(parts) == 1:
                return self._send(200, {"compatibilityLevel": "BACKWARD"})
            if parts[1] in self.levels:
                return self._send(200, {"compatibilityLevel": self.levels[parts[1]]})
            return self._send(404, {"error_code": 40408, "message": "no config"})
        return self._send(404, {"error_code": 404, "message": "?"})

    def do_POST(self):  # noqa: N802
        self.calls.append(f"POST {self.path}")
        doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        parts = self.path.removeprefix(API).split("?")[0].strip("/").split("/")
        if parts[0] == "subjects":
            text = doc["schema"]
            sid = next((i for i, s in self.schemas.items() if s == text), None)
            if sid is None:
                sid = len(self.schemas) + 1
                self.schemas[sid] = text
            self.subjects.setdefault(parts[1], []).append(sid)
            return self._send(200, {"id": sid})
        if parts[0] == "compatibility":
            if parts[2] not in self.subjects:
                return self._send(404, {"error_code": 40401, "message": "no subject"})
            return self._send(200, {"is_compatible": "qty" not in doc["schema"],
                                    "messages": ["qty at /fields/2"]})
        return self._send(404, {"error_code": 404})


@pytest.fixture
def registry():
    FakeRegistry.schemas, FakeRegistry.subjects, FakeRegistry.levels = {}, {}, {}
    FakeRegistry.calls, FakeRegistry.auth = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/apis/ccompat/v7"
    srv.shutdown()
    srv.server_close()


V1 = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "int"}]})
V2 = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
    {"name": "note", "type": ["null", "string"], "default": None}]})
READER = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": ["null", "double"],
                                     "default": None},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "tag", "type": "string", "default": "none"}]})


def test_frame_and_unframe():
    from gates.avro import frame, unframe

    sid, body = unframe(frame(258, b"\x02\x04"))
    assert (sid, bytes(body)) == (258, b"\x02\x04")
    assert frame(258, b"")[:5] == b"\x00\x00\x00\x01\x02"
    for bad in (b"", b"{", b"\x00\x00\x01"):
        with pytest.raises(ValueError):
            unframe(bad)


def test_two_writer_schemas_decode_by_the_reader_schema(registry):
    from gates.avro import AvroDecoder, AvroEncoder

    client = RegistryClient(registry)
    a = AvroEncoder("t-value", V1, client).encode({"id": 1, "amount": 5})
    b = AvroEncoder("t-value", V2, client).encode({"id": 2, "amount": 2.5, "note": "x"})
    assert a[:5] == b"\x00\x00\x00\x00\x01" and b[:5] == b"\x00\x00\x00\x00\x02"
    dec = AvroDecoder("t", READER, RegistryClient(registry))
    assert dec.decode(a, 0, 10) == {"id": 1, "amount": 5.0, "note": None, "tag": "none"}
    assert dec.decode(b, 0, 11) == {"id": 2, "amount": 2.5, "note": "x", "tag": "none"}
    dec.decode(a, 1, 12)
    # each writer schema is fetched once
    assert [c for c in FakeRegistry.calls if c.startswith("GET")] == \
        ["GET /apis/ccompat/v7/schemas/ids/1", "GET /apis/ccompat/v7/schemas/ids/2"]
    # a writer schema that is the reader schema is read without a resolution (faster),
    # to the same values
    same = AvroDecoder("t", V2, RegistryClient(registry))
    assert same.decode(b, 0, 13) == {"id": 2, "amount": 2.5, "note": "x"}
    assert same.writers[2][1] is None and dec.writers[2][1] is not None


@pytest.mark.parametrize("value,words", [
    (b'{"id": 1}', "not in the schema registry's wire format"),
    (b"\x00\x00\x00\x00\x63\x02", "schema id 99 is unknown"),
    (b"\x00\x00\x00\x00\x01\x02", "does not decode with schema id 1"),
    (b"\x00\x00\x00\x00\x01\x02\x04\x06", "longer than schema id 1 says"),
])
def test_bad_records_name_topic_partition_and_offset(registry, value, words):
    from gates.avro import AvroDecoder, AvroEncoder

    client = RegistryClient(registry)
    AvroEncoder("t-value", V1, client).register()
    dec = AvroDecoder("orders", READER, client)
    with pytest.raises(SourceError) as e:
        dec.decode(value, 3, 41)
    text = str(e.value)
    assert words in text
    assert "topic 'orders', partition 3" in text and "offset 41" in text


def test_an_unreachable_registry_is_one_error_naming_it():
    from gates.avro import AvroDecoder

    dec = AvroDecoder("orders", READER, RegistryClient("http://127.0.0.1:9/x", timeout=2))
    with pytest.raises(SourceError, match="does not answer") as e:
        dec.decode(b"\x00\x00\x00\x00\x01\x02", 0, 7)
    assert "offset 7" in str(e.value)


def test_the_client_checks_a_subject_and_sends_its_credentials(registry):
    client = RegistryClient.configured(None, {"schema.registry.url": registry,
                                              "schema.registry.basic.auth.user.info": "u:p"})
    assert client is not None
    assert client.check("s-value", V1).compatible is None  # no subject yet
    client.register("s-value", V1)
    FakeRegistry.levels["s-value"] = "FULL"
    ok = client.check("s-value", V2)
    assert (ok.compatible, ok.level) == (True, "FULL")
    bad = client.check("s-value", V2.replace("note", "qty"))
    assert bad.compatible is False and bad.reasons == ("qty at /fields/2",)
    assert FakeRegistry.auth[-1] == "Basic dTpw"
    with pytest.raises(RegistryError) as e:
        client.schema(42)
    assert e.value.status == 404 and "HTTP 404: no such id" in str(e.value)


def test_the_url_comes_from_the_flag_then_the_settings_then_the_environment(monkeypatch):
    monkeypatch.setenv("SCHEMA_REGISTRY_URL", "http://env/")
    assert RegistryClient.configured().url == "http://env"
    assert RegistryClient.configured(None, {"schema.registry.url": "http://conf"}).url == \
        "http://conf"
    assert RegistryClient.configured("http://flag", {"schema.registry.url": "x"}).url == \
        "http://flag"
    monkeypatch.delenv("SCHEMA_REGISTRY_URL")
    assert RegistryClient.configured() is None


def test_the_gated_source_turns_avro_rows_into_its_arrow_schema(registry):
    pytest.importorskip("pyspark")
    from pyspark.sql import types as S

    from compat import avro as A
    from gates.avro import AvroEncoder
    from gates.source import SourceOptions, _ArrowBuilder

    cols = [("id", "bigint", False), ("ts", "timestamp", True), ("day", "date", True),
            ("price", "decimal(10,2)", True), ("tags", "array<string>", True),
            ("attrs", "map<string,int>", True), ("pos", "struct<x:double,y:double>", True),
            ("raw", "binary", True)]
    schema = A.canonical(A.parse(A.record_doc("shop.R", cols)))
    ddl = ", ".join(f"`{n}` {t}" for n, t, _ in cols)
    opts = SourceOptions.parse({"bootstrap": "b:1", "topic": "t", "format": "avro",
                                "schema": ddl, "avroSchema": schema, "registry": registry})
    xy = S.StructType([S.StructField("x", S.DoubleType()), S.StructField("y", S.DoubleType())])
    spark_schema = S.StructType([
        S.StructField("id", S.LongType(), False), S.StructField("ts", S.TimestampType()),
        S.StructField("day", S.DateType()), S.StructField("price", S.DecimalType(10, 2)),
        S.StructField("tags", S.ArrayType(S.StringType())),
        S.StructField("attrs", S.MapType(S.StringType(), S.IntegerType())),
        S.StructField("pos", xy), S.StructField("raw", S.BinaryType())])
    builder = _ArrowBuilder(spark_schema, "avro", opts)
    row = {"id": 7, "ts": dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
           "day": dt.date(2026, 1, 2), "price": decimal.Decimal("12.34"), "tags": ["a", None],
           "attrs": {"k": 1}, "pos": {"x": 1.0, "y": 2.0}, "raw": b"\x00\x01"}
    value = AvroEncoder("t-value", schema, RegistryClient(registry)).encode(row)
    empty = {"id": 8, **{n: None for n, _, _ in cols[1:]}}
    value2 = AvroEncoder("t-value", schema, RegistryClient(registry)).encode(empty)
    batch = builder.from_avro([builder.decoder.decode(v, 0, i)
                               for i, v in enumerate([value, value2])])
    got = batch.to_pylist()
    assert got[0] == {**row, "attrs": [("k", 1)]}
    assert got[1] == empty


# -- theseus check --registry ------------------------------------------------------------

def _check(case: str, *flags: str, env: dict | None = None, kind: str = "avro"):
    from pathlib import Path

    from click.testing import CliRunner

    from migrate.cli import main

    d = Path(__file__).resolve().parents[1] / "fixtures" / kind / case
    r = CliRunner().invoke(main, ["check", str(d / "old.json"), str(d / "new.json"),
                                  "--format", "json", *flags], env=env)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    return r.exit_code, json.loads(r.output)


def test_check_asks_the_registry_and_reports_its_answer(registry):
    case = "output_field_added_with_default_backward"
    code, rep = _check(case, "--registry", registry, "--schema-compat", "backward")
    (f,) = [f for f in rep["findings"] if f["code"].startswith("registry-")]
    assert f["code"] == "registry-accepts" and "no version yet" in f["message"]
    assert (code, rep["verdict"]) == (0, "in_place")
    # the subject now has a version; the stand-in refuses schemas with a field 'qty'
    RegistryClient(registry).register("order_amounts-value", "{}")
    code, rep = _check(case, env={"SCHEMA_REGISTRY_URL": registry})
    (f,) = [f for f in rep["findings"] if f["code"].startswith("registry-")]
    assert f["code"] == "registry-refuses"
    assert "subject 'order_amounts-value' (BACKWARD) refuses the new schema: qty at " \
        "/fields/2" in f["message"]
    assert (code, rep["verdict"]) == (3, "unsupported")
    assert f["new"]["pointer"] == "/nodes/2/avro/schema"


def test_an_unreachable_registry_is_a_finding_and_no_pass():
    code, rep = _check("output_column_added_nullable", "--registry",
                       "http://127.0.0.1:9/apis/ccompat/v7")
    (f,) = [f for f in rep["findings"] if f["code"].startswith("registry-")]
    assert f["code"] == "registry-unreachable"
    assert "does not answer" in f["message"]
    assert (code, rep["verdict"]) == (3, "unsupported")


def test_a_json_output_asks_no_registry():
    code, rep = _check("aggregate_arg_changed", "--registry", "http://127.0.0.1:9/x",
                       kind="upgrades")
    assert not [f for f in rep["findings"] if f["code"].startswith("registry-")]


# -- the gated sink's JSON values written as Avro ------------------------------------------

def test_sink_json_values_become_wire_format_avro_and_read_back(registry):
    from compat import avro as A
    from gates.avro import AvroDecoder, JsonToAvro

    cols = [("id", "bigint", False), ("ts", "timestamp", True), ("day", "date", True),
            ("price", "decimal(10,2)", True), ("tags", "array<string>", True),
            ("attrs", "map<string,int>", True), ("pos", "struct<x:double,y:double>", True),
            ("raw", "binary", True), ("local", "timestamp_ntz", True)]
    schema = A.canonical(A.parse(A.record_doc("shop.R", cols)))
    enc = JsonToAvro("out-value", schema, RegistryClient(registry))
    # registered when made: before any value is written
    assert FakeRegistry.subjects == {"out-value": [enc.schema_id]}
    # what Spark's to_json writes with the sink's options (gates.sink.JSON_OPTIONS)
    text = ('{"id":7,"ts":"2026-01-02T03:04:05.000006Z","day":"2026-01-02","price":12.34,'
            '"tags":["a",null],"attrs":{"k":1},"pos":{"x":1.0,"y":2.0},"raw":"AAE=",'
            '"local":"2026-01-02T03:04:05.000000"}')
    value = enc(text)
    assert value[:5] == b"\x00" + enc.schema_id.to_bytes(4, "big")
    back = AvroDecoder("out", schema, RegistryClient(registry)).decode(value, 0, 0)
    assert back == {"id": 7, "ts": dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
                    "day": dt.date(2026, 1, 2), "price": decimal.Decimal("12.34"),
                    "tags": ["a", None], "attrs": {"k": 1}, "pos": {"x": 1.0, "y": 2.0},
                    "raw": b"\x00\x01", "local": dt.datetime(2026, 1, 2, 3, 4, 5)}
    assert enc(None) is None  # a tombstone stays one
    assert enc(value) == value  # a record read back from the topic is written as it is
    nulls = AvroDecoder("out", schema, RegistryClient(registry)).decode(
        enc('{"id":8,"ts":null,"day":null,"price":null,"tags":null,"attrs":null,'
            '"pos":null,"raw":null,"local":null}'), 0, 1)
    assert nulls == {"id": 8, **{n: None for n, _, _ in cols[1:]}}


def test_the_sinks_converter_writes_what_the_walk_writes():
    """gates.avro.converter (made once per schema) against datum (a walk of each value):
    the same bytes for every kind of column, and no converter at all where the JSON
    value is written as it is."""
    import io

    from compat import avro as A
    from gates.avro import converter, datum

    cols = [("id", "bigint", False), ("ts", "timestamp", True), ("day", "date", True),
            ("price", "decimal(10,2)", True), ("tags", "array<string>", True),
            ("stamps", "array<timestamp>", True), ("attrs", "map<string,binary>", True),
            ("pos", "struct<x:double,at:date>", True), ("raw", "binary", True),
            ("n", "int", True), ("name", "string", True)]
    schema = A.parse(A.record_doc("shop.R", cols))
    writer = fastavro.parse_schema(json.loads(A.canonical(schema)))
    docs = [{"id": 7, "ts": "2026-01-02T03:04:05.000006Z", "day": "2026-01-02",
             "price": 12.34, "tags": ["a", None], "stamps": ["2026-01-02T03:04:05Z"],
             "attrs": {"k": "AAE="}, "pos": {"x": 1, "at": "2026-01-03"}, "raw": "AAE=",
             "n": 3, "name": "x"},
            {"id": 8, **{n: None for n, _, _ in cols[1:]}},
            {"id": 9, "stamps": [], "attrs": {}, "pos": {"x": 2.5, "at": None}}]

    def body(d):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, writer, d)
        return buf.getvalue()

    conv = converter(schema)
    assert conv is not None
    for d in docs:
        assert body(conv(json.loads(json.dumps(d)))) == body(datum(schema, d))
    plain = A.parse(A.record_doc("shop.P", [("id", "bigint", False), ("s", "string", True),
                                            ("xs", "array<double>", True),
                                            ("m", "map<string,int>", True)]))
    assert converter(plain) is None


def test_a_refused_schema_fails_before_anything_is_written(registry):
    from gates.avro import JsonToAvro

    with pytest.raises(RegistryError, match="refused POST"):
        JsonToAvro("out-value", V1, RegistryClient(registry + "/nowhere"))


def test_table_rows_read_from_avro_keep_their_types(registry):
    """A table's (or changelog's) rows go through ``from_dicts``: Avro's typed values must
    not meet the JSON converters, which would null a timestamp."""
    pytest.importorskip("pyspark")
    from pyspark.sql import types as S

    from compat import avro as A
    from gates.source import SourceOptions, _ArrowBuilder

    schema = A.canonical(A.parse(A.record_doc("R", [("k", "string", False),
                                                    ("ts", "timestamp", True)])))
    opts = SourceOptions.parse({"bootstrap": "b:1", "topic": "t", "format": "avro",
                                "schema": "k STRING, ts TIMESTAMP", "avroSchema": schema,
                                "registry": registry, "role": "changelog",
                                "key_columns": "k"})
    spark_schema = S.StructType([S.StructField("k", S.StringType()),
                                 S.StructField("ts", S.TimestampType()),
                                 S.StructField("_theseus_deleted", S.BooleanType()),
                                 S.StructField("_theseus_offset", S.LongType())])
    builder = _ArrowBuilder(spark_schema, "avro", opts)
    ts = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    rows = builder.from_dicts([{"k": "a", "ts": ts, "_theseus_deleted": False,
                                "_theseus_offset": 4}]).to_pylist()
    assert rows == [{"k": "a", "ts": ts, "_theseus_deleted": False, "_theseus_offset": 4}]


def test_the_kafka_config_file_carries_the_registry_settings_redacted(tmp_path):
    from gates import kafkaconf

    f = tmp_path / "client.properties"
    f.write_text("security.protocol=PLAINTEXT\nschema.registry.url=http://reg:8081/apis/"
                 "ccompat/v7\nschema.registry.basic.auth.user.info=alice:s3cret\n")
    try:
        conf = kafkaconf.use(f)
        # librdkafka never sees them (it would refuse the names)
        assert conf == {"security.protocol": "PLAINTEXT"}
        reg = kafkaconf.registry_settings()
        assert reg["schema.registry.url"] == "http://reg:8081/apis/ccompat/v7"
        assert kafkaconf.redact("auth alice:s3cret failed") == "auth [redacted] failed"
        client = RegistryClient.configured(None, reg)
        assert client is not None and client.url == "http://reg:8081/apis/ccompat/v7"
        assert "s3cret" not in repr(client)
    finally:
        kafkaconf.use(None)
