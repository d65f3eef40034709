"""Bad input: one clear message naming the file, the node and the JSON pointer, exit 2,
never a traceback.  Each case is what a new user would plausibly do wrong."""

from __future__ import annotations

import copy

import pytest
from click.testing import CliRunner

from migrate.cli import main
from tests.conftest import ship_load


def run_check(old: str, new: str):
    result = CliRunner().invoke(main, ["check", old, new])
    assert isinstance(result.exception, SystemExit) or result.exception is None, \
        f"unexpected exception: {result.exception!r}"
    return result


def mutate(fn):
    doc = copy.deepcopy(ship_load())
    fn(doc)
    return doc


CASES = {
    "unknown_step": (lambda d: d["nodes"][4].__setitem__("step", "fliter"),
                     ["/nodes/4/step", "over_capacity", "Did you mean 'filter'"]),
    "dangling_input": (lambda d: d["nodes"][3].__setitem__("inputs", ["with_capcity"]),
                       ["/nodes/3/inputs/0", "'load'", "Did you mean 'with_capacity'"]),
    "cycle": (lambda d: d["nodes"][2].__setitem__("inputs", ["packages", "load"]),
              ["cycle", "/inputs"]),
    "duplicate_id": (lambda d: d["nodes"][4].__setitem__("id", "load"),
                     ["duplicate node id 'load'", "/nodes/4/id", "/nodes/3"]),
    "two_sinks": (lambda d: d["nodes"].append({**d["nodes"][5], "id": "alerts2"}),
                  ["exactly one sink", "alerts2", "/nodes/6"]),
    "no_sink": (lambda d: d["nodes"].pop(5), ["exactly one sink", "found none"]),
    "schema_violation": (lambda d: d["nodes"][0].__setitem__("partitions", "three"),
                         ["/nodes/0/partitions", "'packages'", "integer"]),
    "missing_field": (lambda d: d["nodes"][5].pop("mode"),
                      ["missing required field 'mode'", "/nodes/5", "'alerts'"]),
    "unknown_field": (lambda d: d["nodes"][4].__setitem__("predicat", "x > 1"),
                      ["unknown field 'predicat'", "/nodes/4/predicat", "Did you mean"]),
    "bad_expression": (lambda d: d["nodes"][4].__setitem__("predicate", "load > > 1"),
                       ["/nodes/4/predicate", "over_capacity", "column 8"]),
    "unknown_column": (lambda d: d["nodes"][4].__setitem__("predicate", "lod > 1"),
                       ["column 'lod' does not exist", "/nodes/4/predicate"]),
    "java_function": (lambda d: d["nodes"][4].__setitem__(
        "predicate", "reflect('java.lang.Runtime','getRuntime') IS NOT NULL"),
                      ["arbitrary Java", "/nodes/4/predicate"]),
    "bad_type": (lambda d: d["nodes"][0]["schema"][1].__setitem__("type", "dubble"),
                 ["/nodes/0/schema/1/type", "dubble"]),
    "append_after_unwindowed_aggregate": (
        lambda d: (d["nodes"].pop(4), d["nodes"][4].__setitem__("inputs", ["load"]),
                   d["nodes"][4].__setitem__("mode", "append")),
        ["append sink fed by an unwindowed aggregate", "'load'", "/nodes/3"]),
    "wrong_arity": (lambda d: d["nodes"][2].__setitem__("inputs", ["packages"]),
                    ["takes exactly 2 input", "/nodes/2/inputs"]),
    "wrong_format": (lambda d: d.__setitem__("format", "theseus.plan/2"),
                     ["/format", "theseus.plan/1"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_plan_is_one_clear_error(name, write_plan):
    fn, needles = CASES[name]
    good = write_plan(ship_load(), "good.json")
    bad = write_plan(mutate(fn), "bad.json")
    result = run_check(good, bad)
    assert result.exit_code == 2
    err = result.output.strip()
    assert err.count("\n") == 0, err  # one line
    assert "Traceback" not in err
    assert "bad.json" in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def test_unreadable_and_malformed_files(write_plan, tmp_path):
    good = write_plan(ship_load(), "good.json")
    result = run_check(good, str(tmp_path / "missing.json"))
    assert result.exit_code == 2 and "missing.json: file not found" in result.output
    result = run_check(good, write_plan('{"format": "theseus.plan/1",\n  "nodes": [,]}',
                                        "broken.json"))
    assert result.exit_code == 2
    assert "broken.json" in result.output and "line 2" in result.output
    result = run_check(good, write_plan("", "empty.json"))
    assert result.exit_code == 2 and "empty.json" in result.output
    result = run_check(good, str(tmp_path))
    assert result.exit_code == 2 and "directory" in result.output
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    result = run_check(good, str(tmp_path / "bin.json"))
    assert result.exit_code == 2 and "UTF-8" in result.output


def test_bad_flag_values(write_plan):
    good = write_plan(ship_load(), "good.json")
    result = CliRunner().invoke(main, ["check", good, good, "--require", "backfil"])
    assert result.exit_code == 2 and "unknown requirement 'backfil'" in result.output
    result = CliRunner().invoke(main, ["check", good, good, "--schema-compat", "sideways"])
    assert result.exit_code == 2


def test_distinct_aggregate_on_a_stream_is_refused_before_deploy(write_plan):
    doc = ship_load()
    doc["nodes"][3]["aggregates"][0]["distinct"] = True
    r = run_check(write_plan(ship_load(), "good.json"), write_plan(doc, "bad.json"))
    assert r.exit_code == 2
    assert "distinct aggregations on streams" in r.output
    assert "/nodes/3/aggregates/0/distinct" in r.output


def test_a_cycle_is_named_in_flow_order(write_plan):
    doc = mutate(lambda d: d["nodes"][2].__setitem__("inputs", ["packages", "over_capacity"]))
    result = run_check(write_plan(ship_load()), write_plan(doc))
    assert result.exit_code == 2
    assert "with_capacity -> load -> over_capacity -> with_capacity" in result.output
