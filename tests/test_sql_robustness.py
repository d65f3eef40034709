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


def test_a_script_too_large_to_compile(tmp_path):
    from compat.sql.compiler import MAX_SCRIPT_CHARS

    p = tmp_path / "big.sql"
    p.write_text("[" * (MAX_SCRIPT_CHARS + 1))
    r = run("plan", "compile", str(p))
    assert r.exit_code == 2 and "too large to compile" in r.output


def test_an_error_on_a_very_long_line_shows_a_window_of_it(tmp_path):
    q = tmp_path / "q.sql"
    q.write_text("SELECT " + "a, " * 100_000 + "FROM nowhere WHERE x = 'y")
    r = run("plan", "compile", str(q))
    assert r.exit_code == 2
    source, carets = r.output.splitlines()[1:3]
    assert len(source) < 300 and source.startswith("    ...")
    assert source[carets.index("^")] == "'"  # the carets still mark the unterminated string


@pytest.mark.parametrize("hint, message", [
    ("/*+ DEDUP_WITHIN('1 hour's') */", "unterminated string (missing ') in a /*+ ... */ hint"),
    ("/*+ DEDUP_WITHIN(('1 hour') */", "cannot read this hint"),
])
def test_a_hint_sqlglot_cannot_read(tmp_path, hint, message):
    q = _sql(tmp_path, "SELECT *", f"SELECT {hint} *")
    r = run("plan", "compile", q)
    assert r.exit_code == 2 and message in r.output and "q.sql:6:" in r.output
