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
