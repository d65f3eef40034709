"""Bad SQL: one message pointing at file:line:col with the offending text underlined, exit 2
from the CLI, never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from compat.errors import SqlError, TheseusError
from compat.sql import compile_sql
from migrate.cli import main
from tests.sql_util import DDL

PACKAGES = "CREATE TABLE packages (ship_id STRING, weight DOUBLE) USING kafka;\n"


def error(sql: str) -> SqlError:
    with pytest.raises(SqlError) as info:
        compile_sql(sql, "query.sql")
    return info.value


def test_the_cli_prints_one_line_and_the_underlined_sql_and_exits_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "query.sql").write_text(PACKAGES + "CREATE TABLE out USING kafka AS\n"
                                        "SELECT wieght FROM packages;\n")
    result = CliRunner().invoke(main, ["plan", "compile", "query.sql"])
    assert result.exit_code == 2
    assert result.output == (
        "theseus: error: query.sql:3:8: unknown column 'wieght' in SELECT "
        "(did you mean 'weight'?)\n"
        "    SELECT wieght FROM packages;\n"
        "           ^^^^^^\n")


def test_sql_error_is_a_theseus_error_with_a_position():
    e = error(PACKAGES + "CREATE TABLE out USING kafka AS\n  SELECT ship_id FROM packges;")
    assert isinstance(e, TheseusError) and e.exit_code == 2
    assert (e.file, e.line, e.col, e.length) == ("query.sql", 3, 23, 7)
    assert e.message == "unknown table 'packges' (did you mean 'packages'?) (declare it " \
        "with CREATE TABLE ... USING kafka)"


def underline(e: SqlError) -> str:
    """The underlined text of an error."""
    return e.source_line[e.col - 1:e.col - 1 + e.length]  # type: ignore[index]


# (script after DDL, message fragment, underlined text)
CASES = {
    "syntax": ("CREATE TABLE out USING kafka AS SELECT * FROM WHERE x;",
               "syntax error: expected table name but got 'WHERE'", "WHERE"),
    "unterminated_string": ("CREATE TABLE out USING kafka AS SELECT 'abc FROM orders;",
                            "unterminated string", "'abc FROM orders;"),
    "unknown_qualified_column": (
        "CREATE TABLE out USING kafka AS SELECT o.amont FROM orders o;",
        "unknown column 'amont' in table 'o' in SELECT (did you mean 'amount'?)", "amont"),
    "ambiguous": ("CREATE TABLE out USING kafka AS SELECT customer_id FROM orders o JOIN "
                  "customers c ON o.customer_id = upper(c.customer_id);",
                  "column 'customer_id' in SELECT is ambiguous: write c.customer_id or "
                  "o.customer_id", "customer_id"),
    "not_grouped": ("CREATE TABLE out USING kafka AS SELECT region, sum(amount) AS s "
                    "FROM orders GROUP BY customer_id;",
                    "column 'region' in SELECT is neither in GROUP BY nor inside an "
                    "aggregate function", "region"),
    "aggregate_in_where": ("CREATE TABLE out USING kafka AS SELECT * FROM orders "
                           "WHERE sum(amount) > 1;",
                           "aggregate function sum() is not allowed in WHERE", "sum(amount)"),
    "unknown_aggregate": ("CREATE TABLE out USING kafka AS SELECT region, "
                          "hll_sketch_aggr(amount) AS h FROM orders GROUP BY region;",
                          "column 'amount' in SELECT is neither in GROUP BY", "amount"),
    "order_by": ("CREATE TABLE out USING kafka AS SELECT * FROM orders ORDER BY amount;",
                 "ORDER BY is not supported in a streaming query (for the first N rows per "
                 "key, use the Top-N pattern", "amount"),
    "limit": ("CREATE TABLE out USING kafka AS SELECT * FROM orders LIMIT 10;",
              "LIMIT is not supported", "10"),
    "window_function": ("CREATE TABLE out USING kafka AS SELECT order_id, sum(amount) OVER "
                        "(PARTITION BY region) AS s FROM orders;",
                        "window functions are supported only in the Top-N pattern", None),
    "rank": ("CREATE TABLE out USING kafka AS SELECT * FROM (SELECT *, RANK() OVER "
             "(PARTITION BY region ORDER BY amount) AS r FROM orders) WHERE r <= 3;",
             "RANK() OVER (...) is not supported: the Top-N pattern uses ROW_NUMBER()",
             "RANK()"),
    "row_number_without_bound": (
        "CREATE TABLE out USING kafka AS SELECT * FROM (SELECT *, ROW_NUMBER() OVER "
        "(PARTITION BY region ORDER BY amount) AS rn FROM orders) WHERE amount > 1;",
        "ROW_NUMBER() needs a bound in the outer WHERE: rn <= N", "amount > 1"),
    "row_number_is_not_output": (
        "CREATE TABLE out USING kafka OPTIONS (key 'order_id') AS SELECT order_id, rn FROM "
        "(SELECT *, ROW_NUMBER() OVER (PARTITION BY region ORDER BY amount) AS rn "
        "FROM orders) WHERE rn <= 3;",
        "the row number 'rn' is not an output column", "rn"),
    "group_by_over_top_n": (
        "CREATE TABLE out USING kafka AS SELECT region FROM (SELECT *, ROW_NUMBER() OVER "
        "(PARTITION BY region ORDER BY amount) AS rn FROM orders) WHERE rn <= 3 "
        "GROUP BY region;", "GROUP BY or HAVING over the Top-N pattern is not supported",
        "region"),
    "top_n_needs_a_key": (
        "CREATE TABLE out USING kafka AS SELECT * FROM (SELECT *, ROW_NUMBER() OVER "
        "(PARTITION BY region ORDER BY amount) AS rn FROM orders) WHERE rn <= 3;",
        "the compiled plan is invalid at sink 'out': the input retracts rows, and a "
        "retraction is written as a tombstone for its key (expected key_columns, found "
        "none); set OPTIONS (key '<column>[,<column>...]') on table 'out'", "out"),
    "dedup_within_elsewhere": (
        "CREATE TABLE out USING kafka AS SELECT /*+ DEDUP_WITHIN('1 hour') */ * FROM orders;",
        "DEDUP_WITHIN applies to SELECT DISTINCT or to the deduplication pattern", None),
    "unknown_hint": ("CREATE TABLE out USING kafka AS SELECT /*+ BROADCAST(c) */ * "
                     "FROM orders;", "hint BROADCAST is not supported", None),
    "cross_join": ("CREATE TABLE out USING kafka AS SELECT * FROM orders, customers;",
                   "a join needs ON or USING with equality keys", None),
    "subquery_in_where": ("CREATE TABLE out USING kafka AS SELECT * FROM orders WHERE "
                          "customer_id IN (SELECT customer_id FROM customers);",
                          "subqueries in WHERE are not supported", None),
    "intersect": ("CREATE TABLE out USING kafka AS SELECT region FROM orders_eu INTERSECT "
                  "SELECT region FROM orders_us;", "INTERSECT is not supported", None),
    "group_by_without_aggregate": ("CREATE TABLE out USING kafka AS SELECT region FROM "
                                   "orders GROUP BY region;",
                                   "a GROUP BY needs at least one aggregate function", "region"),
    "bad_window_duration": ("CREATE TABLE out USING kafka AS SELECT page, count(*) AS n FROM "
                            "clicks GROUP BY window(ts, '5 minuts'), page;",
                            "window() takes durations such as '10 minutes'", "'5 minuts'"),
    "duplicate_output": ("CREATE TABLE out USING kafka AS SELECT amount, amount FROM orders;",
                         "duplicate output column 'amount'", "amount"),
    "unknown_option": ("CREATE TABLE out USING kafka OPTIONS (modee 'update') AS "
                       "SELECT * FROM orders;",
                       "unknown option 'modee' (did you mean 'mode'?)", "modee"),
    "bad_option_value": ("CREATE TABLE out USING kafka OPTIONS (mode 'upsert') AS "
                         "SELECT * FROM orders;",
                         "option 'mode' must be one of append, update, complete", "'upsert'"),
    "source_option_on_sink": ("CREATE TABLE out USING kafka OPTIONS (watermark '1 minute') "
                              "AS SELECT * FROM orders;",
                              "option 'watermark' does not apply to output table 'out'",
                              "watermark"),
    "bad_key_column": ("CREATE TABLE out USING kafka OPTIONS (key 'nope') AS "
                       "SELECT * FROM orders;",
                       "key column 'nope' is not an output column of the query", "'nope'"),
    "append_over_aggregate": (
        "CREATE TABLE out USING kafka OPTIONS (mode 'append') AS SELECT region, "
        "count(*) AS n FROM orders GROUP BY region;",
        "the compiled plan is invalid at aggregate 'aggregate_1': an append sink fed by an "
        "unwindowed aggregate", "region"),
    "distinct_aggregate": (
        "CREATE TABLE out USING kafka AS SELECT region, count(DISTINCT customer_id) AS n "
        "FROM orders GROUP BY region;",
        "Spark does not support distinct aggregations on streams", "region"),
    # over tables only, the tables are changelogs: an aggregate must retract rows
    "table_aggregate_cannot_retract": (
        "CREATE TABLE out USING kafka AS SELECT tier, first(country) AS c FROM customers "
        "GROUP BY tier;", "cannot", None),
    "reads_its_output": ("CREATE TABLE out (order_id STRING) USING kafka;\n"
                         "INSERT INTO out SELECT order_id FROM out;",
                         "the query reads its own output table 'out'", "out"),
    "insert_column_count": ("CREATE TABLE out (a STRING) USING kafka;\n"
                            "INSERT INTO out SELECT order_id, amount FROM orders;",
                            "the query gives 2 columns but table 'out' has 1", None),
    "unknown_setting": ("SET spark.sql.shufle.partitions = 3;\n"
                        "CREATE TABLE out USING kafka AS SELECT * FROM orders;",
                        "unknown setting 'spark.sql.shufle.partitions' (did you mean "
                        "'spark.sql.shuffle.partitions'?)", "spark.sql.shufle.partitions"),
    "unknown_rule": ("SET theseus.optimizer.excluded_rules = 'prune_column';\n"
                     "CREATE TABLE out USING kafka AS SELECT * FROM orders;",
                     "unknown optimizer rule 'prune_column' (did you mean 'prune_columns'?)",
                     "'prune_column'"),
    "two_queries": ("CREATE TABLE a USING kafka AS SELECT * FROM orders;\n"
                    "CREATE TABLE b USING kafka AS SELECT * FROM orders;",
                    "a plan has exactly one output: this is a second query", None),
    "other_statement": ("DROP TABLE orders;", "DROP statements are not supported here", None),
    "using_parquet": ("CREATE TABLE t (a INT) USING parquet;\n"
                      "CREATE TABLE out USING kafka AS SELECT * FROM orders;",
                      "tables are Kafka topics: USING parquet is not supported", None),
    "table_without_key": ("CREATE TABLE t (a INT) USING kafka OPTIONS (role 'table');\n"
                          "CREATE TABLE out USING kafka AS SELECT * FROM orders JOIN t "
                          "ON orders.quantity = t.a;",
                          "table 't' has role 'table' (latest value per key), so it needs "
                          "OPTIONS (key", "t"),
    "rollup": ("CREATE TABLE out USING kafka AS SELECT region, count(*) AS n FROM orders "
               "GROUP BY ROLLUP(region);", "GROUP BY ROLLUP is not supported", None),
    "table_function": ("CREATE TABLE out USING kafka AS SELECT * FROM range(10);",
                       "table functions are not supported in FROM", "range(10)"),
    "tablesample": ("CREATE TABLE out USING kafka AS SELECT * FROM orders TABLESAMPLE "
                    "(10 PERCENT);", "TABLESAMPLE on a table is not supported", None),
    "alias_twice": ("CREATE TABLE out USING kafka AS SELECT * FROM orders o JOIN payments o "
                    "ON o.order_id = o.order_id;",
                    "table name or alias 'o' is used twice in FROM", None),
    "unreadable_statement": ("CREATE TABLE out-put USING kafka AS SELECT * FROM orders;",
                             "cannot read this CREATE statement: unsupported syntax",
                             "CREATE TABLE out-put USING kafka AS SELECT * FROM orders"),
    "set_without_value": ("SET spark.sql.shuffle.partitions;\n"
                          "CREATE TABLE out USING kafka AS SELECT * FROM orders;",
                          "SET needs a key and a value", "SET spark.sql.shuffle.partitions"),
    "named_window": ("CREATE TABLE out USING kafka AS SELECT max(amount) OVER w AS m "
                     "FROM orders WINDOW w AS (PARTITION BY region);",
                     "WINDOW is not supported in a streaming query", None),
    "event_time_not_timestamp": ("CREATE TABLE t (a INT) USING kafka OPTIONS "
                                 "(event_time 'a', watermark '1 minute');\n"
                                 "CREATE TABLE out USING kafka AS SELECT * FROM t;",
                                 "event_time column 'a' must be a TIMESTAMP (it is int)",
                                 "'a'"),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_error_points_at_the_sql(case):
    script, fragment, marked = CASES[case]
    e = error(DDL + script)
    assert fragment in e.message
    assert e.line is not None and e.line > DDL.count("\n"), e.render()
    rendered = e.render()
    assert rendered.startswith(f"query.sql:{e.line}:{e.col}: ")
    src_line, carets = rendered.splitlines()[1:3]
    assert src_line == "    " + (DDL + script).splitlines()[e.line - 1]
    assert carets.strip() == "^" * len(carets.strip())
    if marked is not None:
        assert underline(e) == marked, rendered


def test_no_query_and_unreadable_files():
    e = error(DDL)
    assert e.message.startswith("no query: the script needs one INSERT INTO")
    runner = CliRunner()
    result = runner.invoke(main, ["plan", "compile", "does-not-exist.sql"])
    assert result.exit_code == 2
    assert result.output == "theseus: error: does-not-exist.sql: file not found\n"
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_tab_indented_line_keeps_the_carets_aligned():
    e = error(PACKAGES + "CREATE TABLE out USING kafka AS\n\tSELECT wieght FROM packages;")
    assert e.render().splitlines()[1:] == ["    \tSELECT wieght FROM packages;",
                                           "    \t       ^^^^^^"]
