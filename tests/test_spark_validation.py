"""Validation is Spark's, not just syntax: a plan Spark would refuse at analysis is invalid
before it is deployed.  Unknown functions here; type errors under ANSI mode in
``tests/test_ansi_types.py``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from compat import expr as E
from compat.errors import ExpressionError
from migrate.cli import main
from tests.conftest import ROOT, UPGRADES

CASE = {c.name: c for c in UPGRADES}
DOC = json.loads((ROOT / "compat" / "spark_functions.json").read_text())


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    return result


def with_predicate(tmp_path, predicate: str, name: str = "bad.json") -> str:
    doc = json.loads((CASE["filter_changed_stream"] / "old.json").read_text())
    (node,) = [n for n in doc["nodes"] if n["step"] == "filter"]
    node["predicate"] = predicate
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def test_the_function_list_is_spark_4_3s():
    assert DOC["spark_version"] == "4.3.0"
    names = set(DOC["functions"])
    assert len(names) > 500
    assert {"sum", "date_trunc", "regexp_extract", "transform", "window"} <= names
    assert not {"+", "<=>", "!", "my_udf", "product"} & names
    assert set(DOC["aggregates"]) <= names


def test_every_function_the_checker_types_is_a_spark_function():
    # the type tables of compat/expr.py name Spark functions only (a name outside Spark's
    # list could never be reached: it is refused first)
    tables = [v for k, v in vars(E).items()
              if k.endswith("_FNS") or k in ("NONDETERMINISTIC_FUNCTIONS", "FORBIDDEN_FUNCTIONS")]
    names = set().union(*tables) | set(E._FN_ALIASES) | set(E._FN_ALIASES.values())
    assert names - set(DOC["functions"]) == set()
    assert set(E.AGGREGATE_FUNCTIONS) - set(DOC["aggregates"]) == set()


@pytest.mark.parametrize("predicate, needles", [
    ("my_udf(amount) > 1", ["unknown function 'my_udf'", "Spark 4.3.0"]),
    ("amount > 1 AND upperr(region) = 'EU'", ["unknown function 'upperr'",
                                              "Did you mean 'upper'?"]),
    ("`default`.fn(amount) > 1", []),  # not a function call Spark has: refused one way or other
    ("position('a' IN region) > 0 AND my_udf(region)", ["unknown function 'my_udf'"]),
])
def test_an_unknown_function_is_refused_naming_it(tmp_path, predicate, needles):
    r = run("plan", "validate", with_predicate(tmp_path, predicate))
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert line.count("\n") == 0 and "/nodes/1/predicate" in line and "bad.json" in line
    for needle in needles:
        assert needle in line


def test_functions_sqlglot_names_its_own_way_are_not_unknown(tmp_path):
    # POSITION(a IN b) goes through the sqlglot fallback, which calls it STR_POSITION
    r = run("plan", "validate", with_predicate(tmp_path, "position('a' IN region) > 0"))
    assert r.exit_code == 0, r.output


def test_java_calling_functions_keep_their_own_refusal(tmp_path):
    for fn in ("reflect", "java_method", "try_reflect"):
        r = run("plan", "validate", with_predicate(tmp_path, f"{fn}('a', 'b') IS NOT NULL"))
        assert r.exit_code == 2 and "arbitrary Java code" in r.output


def test_an_aggregate_spark_does_not_have_is_refused(tmp_path):
    doc = json.loads((CASE["aggregate_function_changed"] / "old.json").read_text())
    (agg,) = [n for n in doc["nodes"] if n["step"] == "aggregate"]
    agg["aggregates"][0]["function"] = "product"  # PySpark has F.product; Spark SQL does not
    p = tmp_path / "agg.json"
    p.write_text(json.dumps(doc))
    r = run("plan", "validate", str(p))
    assert r.exit_code == 2 and "unknown aggregate function 'product'" in r.output


def test_unknown_function_in_sql_points_at_the_line(tmp_path):
    sql = (CASE["filter_changed_stream"] / "old.sql").read_text()
    p = tmp_path / "q.sql"
    p.write_text(sql.replace("WHERE ", "WHERE my_udf(amount) > 1 AND "))
    r = run("plan", "compile", str(p))
    assert r.exit_code == 2
    assert "q.sql:8:" in r.output and "unknown function 'my_udf'" in r.output


def test_expr_parse_refuses_unknown_functions_directly():
    with pytest.raises(ExpressionError, match="unknown function 'nope'"):
        E.parse("nope(1)")
    assert E.parse("date_trunc('hour', ts)")[0] == "fn"
