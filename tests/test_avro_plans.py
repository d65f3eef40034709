"""``format: avro`` sources and sinks in plans: golden upgrade cases under fixtures/avro/ (the
check's Avro rules), validation errors, serde round trip.  No Spark, no registry."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compat import serde
from migrate.cli import main

ROOT = Path(__file__).resolve().parents[1]
CASES = sorted(p for p in (ROOT / "fixtures" / "avro").iterdir() if p.is_dir())
EXIT = {"identical": 0, "in_place": 0, "migrate": 1, "unsupported": 3}


def check(old: Path, new: Path, *flags: str):
    result = CliRunner().invoke(main, ["check", str(old), str(new), "--format", "json",
                                       *flags])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.output
    return result, json.loads(result.output)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_avro_upgrade_case(case):
    expect = json.loads((case / "expect.json").read_text())
    flags = ["--schema-compat", expect["schema_compat"]] if "schema_compat" in expect else []
    result, report = check(case / "old.json", case / "new.json", *flags)
    assert report["verdict"] == expect["verdict"], report["findings"]
    assert sorted({f["code"] for f in report["findings"]}) == expect["codes"]
    assert result.exit_code == EXIT[expect["verdict"]]


def test_the_finding_names_the_field_and_the_rule():
    case = ROOT / "fixtures/avro/output_field_added_without_default_backward"
    _, report = check(case / "old.json", case / "new.json", "--schema-compat", "backward")
    (f,) = [f for f in report["findings"] if f["code"] == "avro-backward-incompatible"]
    assert "field 'qty' (int) has no default" in f["message"]
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in f["message"]
    assert f["new"]["pointer"] == "/nodes/2/avro/schema"


@pytest.mark.parametrize("compat,verdict", [("backward", "in_place"), ("forward", "in_place"),
                                            ("full", "in_place"), ("none", "in_place")])
def test_a_nullable_column_added_passes_every_level_in_avro(compat, verdict):
    # JSON's rule refuses an added column under backward: it cannot know Avro's defaults
    case = ROOT / "fixtures/avro/output_column_added_nullable"
    _, report = check(case / "old.json", case / "new.json", "--schema-compat", compat)
    assert report["verdict"] == verdict
    assert not any(f["code"].startswith("output-column") for f in report["findings"])


def test_the_same_change_in_json_is_judged_by_the_json_rule(tmp_path):
    case = ROOT / "fixtures/avro/output_column_added_nullable"
    paths = []
    for name in ("old.json", "new.json"):
        doc = json.loads((case / name).read_text())
        for n in doc["nodes"]:
            if n["step"] in ("source", "sink"):
                n["format"] = "json"
        (tmp_path / name).write_text(json.dumps(doc))
        paths.append(tmp_path / name)
    _, report = check(*paths, "--schema-compat", "backward")
    assert report["verdict"] == "unsupported"
    assert "output-column-added" in {f["code"] for f in report["findings"]}


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_serde_round_trip(case):
    for name in ("old.json", "new.json"):
        doc = json.loads((case / name).read_text())
        assert json.loads(serde.dumps(serde.from_doc(doc))) == doc


BASE = json.loads((ROOT / "fixtures/avro/output_field_added_with_default_backward/old.json")
                  .read_text())


def mutate(path: list, value):
    doc = copy.deepcopy(BASE)
    at = doc
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = value
    return doc


def invalid_cases():
    json_source = mutate(["nodes", 0, "format"], "json")
    json_source["nodes"][0]["avro"] = {}
    yield "avro on a json source", json_source, "/nodes/0/avro", "format 'avro'"
    yield "schema not JSON", mutate(["nodes", 2, "avro", "schema"], "{nope"), \
        "/nodes/2/avro/schema", "not JSON"
    bad_default = json.loads(BASE["nodes"][2]["avro"]["schema"])
    bad_default["fields"][1]["default"] = "x"
    yield "bad default", mutate(["nodes", 2, "avro", "schema"], json.dumps(bad_default)), \
        "/nodes/2/avro/schema", "at /fields/1/default in the Avro schema"
    missing = json.loads(BASE["nodes"][2]["avro"]["schema"])
    missing["fields"] = missing["fields"][:1]
    yield "output column not in the schema", \
        mutate(["nodes", 2, "avro", "schema"], json.dumps(missing)), \
        "/nodes/2/avro/schema", "output column 'amount': column 'amount' is not a field"
    narrow = json.loads(BASE["nodes"][2]["avro"]["schema"])
    narrow["fields"][1]["type"] = ["null", "int"]
    yield "output column wider than its field", \
        mutate(["nodes", 2, "avro", "schema"], json.dumps(narrow)), \
        "/nodes/2/avro/schema", "expected double, found int"
    yield "a map with int keys", \
        mutate(["nodes", 0, "schema", 2, "type"], "map<int,string>"), \
        "/nodes/0/schema/2/type", "string keys"
    yield "avro key without key columns", \
        mutate(["nodes", 0, "avro"], {"key": True}), "/nodes/0/avro/key", "key columns"
    yield "unknown strategy", mutate(["nodes", 2, "avro", "subject"], "topic"), \
        "/nodes/2/avro/subject", "topic_name"


INVALID = list(invalid_cases())


@pytest.mark.parametrize("name,doc,pointer,words", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_avro_plans_get_one_clear_error(tmp_path, name, doc, pointer, words):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["plan", "validate", str(plan)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    line = result.output.strip().splitlines()
    assert len(line) == 1, result.output
    assert f"at {pointer}" in line[0]
    assert words in line[0]


SQL = """CREATE TABLE orders (order_id STRING NOT NULL, amount DOUBLE, qty INT)
  USING kafka OPTIONS (format 'avro', partitions 2, avro.record 'shop.Order',
                       avro.schema '{SCHEMA}');
CREATE TABLE order_amounts USING kafka OPTIONS (format 'avro', key 'order_id',
                                                avro.subject 'topic_record_name')
  AS SELECT order_id, amount FROM orders WHERE amount > 10;
"""
ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"}, {"name": "amount", "type": "double"},
    {"name": "qty", "type": "int"}]})


def test_sql_tables_take_format_avro_and_its_options(tmp_path):
    from compat.check import load_plan
    from compat.steps.sink import avro_subject

    path = tmp_path / "q.sql"
    path.write_text(SQL.replace("{SCHEMA}", ORDER))
    plan = load_plan(str(path))
    src, sink = plan.nodes["orders"], plan.nodes["order_amounts"]
    assert (src.format, src.avro.record, src.avro.schema) == ("avro", "shop.Order", ORDER)
    # the compiler prunes qty (nothing reads it): the reader schema still has it
    assert [c.name for c in src.schema] == ["order_id", "amount"]
    assert (sink.format, sink.avro.subject) == ("avro", "topic_record_name")
    assert avro_subject(sink, plan.info[sink.id]) == "order_amounts-order_amounts"


def test_an_avro_option_on_a_json_table_is_refused_where_it_is_written(tmp_path):
    path = tmp_path / "q.sql"
    path.write_text(SQL.replace("format 'avro', key", "format 'json', key")
                    .replace("{SCHEMA}", ORDER))
    result = CliRunner().invoke(main, ["plan", "validate", str(path)])
    assert result.exit_code == 2
    assert "q.sql:5:" in result.output
    assert "option 'avro.subject' says how an Avro topic is encoded" in result.output


# -- the fleet contract: a consumer's reader schema against the producer's writer schema ---

def _fleet(sink_avro: dict | None, consumer_cols, consumer_avro: dict | None = None):
    from compat.fleet.contract import impacts, produced
    from compat.infer import analyze

    producer = copy.deepcopy(BASE)
    producer["nodes"][2].pop("avro")
    if sink_avro is not None:
        producer["nodes"][2]["avro"] = sink_avro
    src = {"id": "amounts", "step": "source", "version": 1, "topic": "order_amounts",
           "partitions": 1, "format": "avro", "role": "stream",
           "schema": [{"name": n, "type": t, "nullable": nul} for n, t, nul in consumer_cols]}
    if consumer_avro is not None:
        src["avro"] = consumer_avro
    consumer = serde.from_doc({"format": "theseus.plan/1", "query": "reader", "nodes": [
        src, {"id": "o", "step": "sink", "version": 1, "inputs": ["amounts"], "topic": "x",
              "format": "json", "key_columns": [], "mode": "append",
              "delivery": "at_least_once"}]})
    p = serde.from_doc(producer)
    analyze(p)
    analyze(consumer)
    return impacts(None, produced(p), consumer, "amounts")


def test_a_consumer_that_resolves_the_writer_schema_has_no_finding():
    # the producer writes order_id and amount (nullable, derived); the consumer reads
    # amount and a note the producer never wrote, null by default
    found = _fleet(None, [("order_id", "string", True), ("amount", "double", True),
                          ("note", "string", True)],
                   {"record": "order_amounts"})
    assert found == []


def test_a_consumer_whose_reader_field_has_no_default_gets_upstream_avro_unreadable():
    found = _fleet(None, [("order_id", "string", True), ("amount", "double", True),
                          ("note", "string", False)], {"record": "order_amounts"})
    (f,) = found
    assert f.code == "upstream-avro-unreadable" and f.effect == "unsupported"
    assert "'note' (string) has no default" in f.message
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in f.message


def test_a_consumer_reading_a_nullable_field_as_not_null_cannot_resolve_it():
    found = _fleet(None, [("order_id", "string", True), ("amount", "double", False)],
                   {"record": "order_amounts"})
    assert [f.code for f in found] == ["upstream-avro-unreadable"]
    assert "TYPE_MISMATCH" in found[0].message


# -- control events on Avro topics ---------------------------------------------------------

def test_control_events_on_avro_topics_are_headers_with_a_null_value():
    from gates.control import parse_control, write_control_events
    from tests.test_control_producer import FakeProducer

    class Recording(FakeProducer):
        def __init__(self):
            super().__init__()
            self.records = []

        def produce(self, topic, value=None, key=None, partition=None, headers=None,
                    on_delivery=None):
            self.records.append((topic, partition, value, headers))
            super().produce(topic, value, key, partition, headers, on_delivery)

    p = Recording()
    write_control_events("h:1", ["avro_in", "json_in"], "m1", deadline=5, producer=p,
                         bare_topics={"avro_in"})
    by_topic = {}
    for topic, _part, value, headers in p.records:
        by_topic.setdefault(topic, []).append((value, parse_control(headers)))
    # an Avro consumer reads a null value (no JSON body without the magic byte)
    assert all(v is None for v, _ in by_topic["avro_in"])
    assert all(v is not None for v, _ in by_topic["json_in"])
    # Theseus reads the header on both
    assert {c["migration"] for _, c in by_topic["avro_in"] + by_topic["json_in"]} == {"m1"}


class KeyRecording:
    """A FakeProducer (tests/test_control_producer.py) that keeps each record's key."""

    @staticmethod
    def make():
        from tests.test_control_producer import FakeProducer

        class Recording(FakeProducer):
            def __init__(self):
                super().__init__()
                self.records = []

            def produce(self, topic, value=None, key=None, partition=None, headers=None,
                        on_delivery=None):
                self.records.append((topic, partition, key, value, headers))
                super().produce(topic, value, key, partition, headers, on_delivery)

        return Recording()


def test_control_events_on_avro_keyed_topics_have_a_null_key_unless_the_topic_compacts(
        monkeypatch):
    """A key deserializer of the wire format reads a null key as null; a compacted topic
    refuses one, so there the text key stays.  Every partition still gets its record (by
    number), and Theseus still reads each by its header."""
    import gates.control
    from gates.control import control_key, parse_control, write_control_events

    asked = []
    monkeypatch.setattr(gates.control, "compacted",
                        lambda bs, topics, deadline: asked.append(sorted(topics)) or
                        {t for t in topics if t.startswith("table")})
    p = KeyRecording.make()
    cut = write_control_events("h:1", ["avro_keys", "table_keys", "avro_in", "json_in"],
                               "m1", deadline=5, producer=p,
                               bare_topics={"avro_keys", "table_keys", "avro_in"},
                               keyless_topics={"avro_keys", "table_keys"})
    assert asked == [["avro_keys", "table_keys"]]  # only Avro-keyed topics are looked up
    keys = {}
    for topic, part, key, value, headers in p.records:
        keys.setdefault(topic, {})[part] = key
        assert parse_control(headers)["migration"] == "m1"
        assert value is None or topic == "json_in"
    assert keys["avro_keys"] == {0: None, 1: None}
    text = control_key("m1")
    assert keys["table_keys"] == keys["avro_in"] == keys["json_in"] == {0: text, 1: text}
    assert {t: sorted(ps) for t, ps in cut.items()} == {
        t: [0, 1] for t in ("avro_keys", "table_keys", "avro_in", "json_in")}


def test_no_tombstone_where_the_control_records_had_a_null_key(monkeypatch):
    import gates.control
    from gates.control import tombstone_control_events

    p = KeyRecording.make()
    monkeypatch.setattr(gates.control, "compacted",
                        lambda bs, topics, deadline: {t for t in topics if t == "table_keys"})
    monkeypatch.setattr(gates.control, "client_conf", lambda bs, **kw: kw)
    monkeypatch.setattr("confluent_kafka.Producer", lambda conf: p)
    n = tombstone_control_events("h:1", "m1", {"avro_keys": {0: 4, 1: 5},
                                               "table_keys": {0: 7}, "json_in": {1: 2}},
                                 deadline=5, keyless_topics={"avro_keys", "table_keys"})
    assert n == 2
    assert sorted((t, part) for t, part, *_ in p.records) == [("json_in", 1),
                                                              ("table_keys", 0)]


def test_a_migrations_avro_key_topics_are_its_plans_avro_keyed_nodes(tmp_path):
    from migrate.plantopics import control_layout

    old = tmp_path / "old.json"
    old.write_text(json.dumps(BASE))
    keyed = copy.deepcopy(BASE)
    keyed["nodes"][0].setdefault("avro", {})["key"] = True
    keyed["nodes"][0]["key_columns"] = ["order_id"]
    new = tmp_path / "new.json"
    new.write_text(json.dumps(keyed))
    layout = control_layout(str(new), str(old))
    assert layout["keyless_topics"] == {BASE["nodes"][0]["topic"]}
    assert layout["bare_topics"] >= layout["keyless_topics"]
    assert control_layout(str(old))["keyless_topics"] == set()


def test_a_migrations_avro_topics_are_its_plans_avro_sources_and_output(tmp_path):
    from migrate.plantopics import migration_avro_topics

    old = tmp_path / "old.json"
    old.write_text(json.dumps(BASE))
    new_doc = copy.deepcopy(BASE)
    new_doc["nodes"][0]["format"] = "json"
    new_doc["nodes"][2]["topic"] = "amounts_v2"
    new = tmp_path / "new.json"
    new.write_text(json.dumps(new_doc))
    assert migration_avro_topics(str(new), str(old)) == {"orders", "order_amounts",
                                                         "amounts_v2"}
    assert migration_avro_topics(str(new)) == {"amounts_v2"}


# -- plan export --pyspark ---------------------------------------------------------------

def test_an_avro_source_exports_as_from_avro_after_the_five_byte_header(tmp_path):
    import ast

    from compat import avro as A
    from compat.export import to_pyspark
    from compat.steps.source import avro_schema

    doc = copy.deepcopy(BASE)
    doc["nodes"][2]["format"] = "json"
    doc["nodes"][2].pop("avro")
    plan = serde.from_doc(doc)
    from compat.infer import analyze

    analyze(plan)
    text = to_pyspark(plan)
    ast.parse(text)
    assert "from pyspark.sql.avro.functions import from_avro" in text
    schema = A.canonical(avro_schema(plan.nodes["orders"]))
    assert f"from_avro(F.expr(\"substring(value, 6)\"), {schema!r})" in text


def test_an_avro_sink_by_another_subject_strategy_is_not_exported_and_says_why(tmp_path):
    # a job's import cannot tell the subject its header's id was registered under
    result = CliRunner().invoke(main, ["plan", "export", "--pyspark", str(
        ROOT / "fixtures/avro/output_subject_strategy_changed/new.json")])
    assert result.exit_code == 2
    assert "names its subject by topic_record_name" in result.output
    result = CliRunner().invoke(main, ["plan", "export", "--pyspark", str(
        ROOT / "fixtures/avro/output_column_added_nullable/old.json")])
    assert result.exit_code == 0 and "to_avro(F.struct(" in result.output


def test_checking_avro_plans_imports_no_runtime_library():
    import subprocess
    import sys

    case = ROOT / "fixtures/avro/output_field_added_without_default_backward"
    code = ("import sys\nfrom migrate.cli import main\n"
            "try:\n    main([\"check\", sys.argv[1], sys.argv[2]])\nexcept SystemExit:\n"
            "    pass\n"
            "bad = sorted({m.split('.')[0] for m in sys.modules} & {'fastavro', 'pyspark', "
            "'confluent_kafka', 'networkx', 'deepdiff', 'urllib3'})\n"
            "print('LOADED', bad)")
    r = subprocess.run([sys.executable, "-c", code, str(case / "old.json"),
                        str(case / "new.json")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert "LOADED []" in r.stdout, r.stdout + r.stderr
    # the default --schema-compat forward: old readers skip the new field
    assert "[avro-schema-changed]" in r.stdout
