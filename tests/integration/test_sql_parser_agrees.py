"""Theseus' SQL grammar against Spark's own parser (``sessionState.sqlParser``), statement
by statement: every script Theseus accepts (the fixtures' ``*.sql``) must parse in Spark,
and every statement Theseus refuses as a syntax error (``tests/test_sql_errors.py`` and the
cases of issue 27) must be refused by Spark's parser too.  Only the grammar is compared:
an unknown column or a type error is the analyzer's business, not the parser's.

Disagreements are listed in ``KNOWN`` with why; a new one fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compat.errors import TheseusError
from compat.sql.load import load_sql_plan
from tests.sql_util import DDL
from tests.test_sql_errors import CASES

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(ROOT.glob("fixtures/**/*.sql"))

pytestmark = pytest.mark.integration

#: statements Theseus refuses as syntax errors, each after the DDL of test_sql_errors
REFUSED = {
    **{name: script for name, (script, fragment, _) in CASES.items()
       if fragment.startswith(("syntax error", "unterminated"))},
    "empty_select_item": "CREATE TABLE out USING kafka AS SELECT customer_id,, amount "
                         "FROM orders;",
    "where_and": "CREATE TABLE out USING kafka AS SELECT * FROM orders WHERE AND amount > 1;",
}

#: (case, what Theseus says, what Spark says) -> why they differ
KNOWN: dict[tuple[str, str, str], str] = {
    ("syntax", "refuses", "accepts"):
        "`FROM WHERE x`: WHERE is not a reserved word in Spark's default parser, so it reads "
        "a table named WHERE aliased x; the analyzer then refuses the unknown table. Theseus "
        "refuses it at the keyword, which is where the author went wrong",
}


def statements(script: str) -> list[str]:
    """A script's statements: split at semicolons outside quotes and comments."""
    out, cur, i, quote = [], [], 0, None
    while i < len(script):
        ch = script[i]
        if quote:
            cur.append(ch)
            if ch == "\\" and i + 1 < len(script):
                cur.append(script[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
            cur.append(ch)
        elif script.startswith("--", i):
            j = script.find("\n", i)
            i = len(script) if j < 0 else j
            continue
        elif ch == ";":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def spark_parses(spark, statement: str) -> bool:
    parser = spark._jsparkSession.sessionState().sqlParser()
    try:
        parser.parsePlan(statement)
    except Exception as e:  # noqa: BLE001 - py4j wraps Spark's ParseException
        if "ParseException" in str(e) or "PARSE_SYNTAX_ERROR" in str(e) or \
                "UNCLOSED" in str(e):
            return False
        raise
    return True


def theseus_accepts(script: str) -> tuple[bool, str]:
    try:
        load_sql_plan("query.sql", script.encode())
    except TheseusError as e:
        return False, e.message
    return True, ""


def test_spark_parses_what_theseus_accepts_and_refuses_what_it_refuses(spark):
    assert len(SCRIPTS) >= 50
    disagree: dict[tuple[str, str, str], str] = {}
    accepted = 0
    for path in SCRIPTS:
        text = path.read_text()
        ok, _ = theseus_accepts(text)
        if not ok:
            continue  # a fixture refused for what it means, not its grammar
        accepted += 1
        for st in statements(text):
            if not spark_parses(spark, st):
                disagree[(str(path.relative_to(ROOT)), "accepts", "refuses")] = st[:200]
    assert accepted >= 50
    for name, script in REFUSED.items():
        ok, msg = theseus_accepts(DDL + script)
        ok = ok or not msg.startswith(("syntax error", "unterminated"))
        spark_ok = all(spark_parses(spark, st) for st in statements(script))
        if ok != spark_ok:
            disagree[(name, "accepts" if ok else "refuses",
                      "accepts" if spark_ok else "refuses")] = msg or script
    new = {k: v for k, v in disagree.items() if k not in KNOWN}
    assert not new, "\n".join(f"{k}: {v}" for k, v in new.items())
