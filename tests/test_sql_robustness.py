"""SQL scripts a user can break: nesting deeper than the compiler reads is one error at the
deepest parenthesis (not a RecursionError); comments stay out of the plan's expressions."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from migrate.cli import main
from tests.conftest import UPGRADES

CASE = {c.name: c for c in UPGRADES}


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert "Traceback" not in result.output
    return result


def _sql(tmp_path, old: str, new: str) -> str:
    text = (CASE["filter_changed_stream"] / "old.sql").read_text()
    assert old in text
    p = tmp_path / "q.sql"
    p.write_text(text.replace(old, new))
    return str(p)


@pytest.mark.parametrize("n", [60, 1000, 100_000])
def test_sql_nested_too_deeply_points_at_the_deepest_parenthesis(tmp_path, n):
    q = _sql(tmp_path, "WHERE amount > 100", "WHERE " + "(" * n + "amount" + ")" * n +
             " > 100 -- (((((")
    r = run("plan", "compile", q)
    assert r.exit_code == 2, r.output
    first = r.output.splitlines()[0]
    assert f"q.sql:8:{6 + n}:" in first and f"nests {n} levels of parentheses" in first


def test_a_long_or_chain_in_sql_is_one_error(tmp_path):
    q = _sql(tmp_path, "WHERE amount > 100",
             "WHERE " + " OR ".join(f"amount = {k}" for k in range(3000)))
    r = run("plan", "compile", q)
    assert r.exit_code == 2 and "q.sql:8:" in r.output and "nested too deeply" in r.output
    assert "IN (a, b, ...)" in r.output


def test_a_sql_comment_does_not_reach_the_plan(tmp_path):
    plain = json.loads(run("plan", "compile", _sql(tmp_path, "WHERE", "WHERE")).output)
    commented = run("plan", "compile", _sql(tmp_path, "WHERE amount > 100",
                                           "WHERE amount /* in cents */ > 100 -- big\n"))
    assert commented.exit_code == 0, commented.output
    doc = json.loads(commented.output)
    pred = [n["predicate"] for n in doc["nodes"] if n["step"] == "filter"]
    assert pred == ["amount > 100"]
    assert doc["nodes"] == plain["nodes"]
