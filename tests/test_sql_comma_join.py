"""Tables listed with commas and joined in WHERE compile to the join ``JOIN ... ON`` gives.

Spark accepts ``FROM a, b WHERE a.k = b.k``: its optimizer turns the cross join and the filter
into an inner equi-join.  The equalities pairing the two sides become the join keys, a range
over both streams' event times the time bound, and the rest of WHERE stays a filter.
"""

from __future__ import annotations

from typing import Any

import pytest

from compat.errors import SqlError
from compat.sql import compile_sql
from tests.sql_util import DDL, nodes, plan

OUT = "CREATE TABLE out USING kafka AS "


def without_sql(doc: dict[str, Any]) -> dict[str, Any]:
    """The plan minus the SQL text it records (the two spellings differ only there)."""
    doc = dict(doc)
    doc["metadata"] = {k: v for k, v in doc["metadata"].items() if k != "sql"}
    return doc


# (comma join, the same query written with JOIN ... ON)
EQUIVALENT = {
    "stream_table_with_filters": (
        "SELECT o.order_id, c.tier FROM orders o, customers c "
        "WHERE o.customer_id = c.customer_id AND o.region = 'eu' AND c.tier <> 'gold';",
        "SELECT o.order_id, c.tier FROM orders o JOIN customers c "
        "ON o.customer_id = c.customer_id WHERE o.region = 'eu' AND c.tier <> 'gold';"),
    "keys_written_right_to_left": (
        "SELECT * FROM orders o, customers c WHERE c.customer_id = o.customer_id;",
        "SELECT * FROM orders o JOIN customers c ON c.customer_id = o.customer_id;"),
    "two_keys_and_an_expression_key": (
        "SELECT o.amount FROM orders o, customers c "
        "WHERE o.customer_id = c.customer_id AND upper(o.region) = c.country;",
        "SELECT o.amount FROM orders o JOIN customers c "
        "ON o.customer_id = c.customer_id AND upper(o.region) = c.country;"),
    "stream_stream_time_bound": (
        "SELECT o.order_id, p.paid FROM orders o, payments p WHERE o.order_id = 'x' "
        "AND p.pts BETWEEN o.ts AND o.ts + INTERVAL 1 HOUR AND o.order_id = p.order_id;",
        "SELECT o.order_id, p.paid FROM orders o JOIN payments p "
        "ON p.pts BETWEEN o.ts AND o.ts + INTERVAL 1 HOUR AND o.order_id = p.order_id "
        "WHERE o.order_id = 'x';"),
    "stream_stream_bound_as_two_comparisons": (
        "SELECT o.order_id, p.paid FROM orders o, payments p WHERE o.order_id = p.order_id "
        "AND p.pts >= o.ts AND p.pts <= o.ts + INTERVAL 10 MINUTES AND p.paid > o.amount;",
        "SELECT o.order_id, p.paid FROM orders o JOIN payments p ON o.order_id = p.order_id "
        "AND p.pts >= o.ts AND p.pts <= o.ts + INTERVAL 10 MINUTES WHERE p.paid > o.amount;"),
    "where_or_stays_a_filter": (
        "SELECT o.order_id FROM orders o, customers c WHERE o.customer_id = c.customer_id "
        "AND (o.region = 'eu' OR c.country = 'fr');",
        "SELECT o.order_id FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
        "WHERE o.region = 'eu' OR c.country = 'fr';"),
    "three_tables": (
        "SELECT * FROM orders o, payments p, customers c WHERE c.customer_id = o.customer_id "
        "AND p.pts BETWEEN o.ts AND o.ts + INTERVAL 1 HOUR AND o.order_id = p.order_id;",
        "SELECT * FROM orders o JOIN payments p "
        "ON p.pts BETWEEN o.ts AND o.ts + INTERVAL 1 HOUR AND o.order_id = p.order_id "
        "JOIN customers c ON c.customer_id = o.customer_id;"),
    # payments and customers share no key: customers waits until orders is joined
    "three_tables_joined_when_connected": (
        "SELECT p.paid, c.tier, o.amount FROM payments p, customers c, orders o "
        "WHERE c.customer_id = o.customer_id AND o.order_id = p.order_id;",
        "SELECT p.paid, c.tier, o.amount FROM payments p JOIN orders o "
        "ON o.order_id = p.order_id JOIN customers c ON c.customer_id = o.customer_id;"),
    "explicit_join_then_comma": (
        "SELECT o.order_id, c.tier FROM orders o JOIN payments p ON o.order_id = p.order_id, "
        "customers c WHERE c.customer_id = o.customer_id;",
        "SELECT o.order_id, c.tier FROM orders o JOIN payments p ON o.order_id = p.order_id "
        "JOIN customers c ON c.customer_id = o.customer_id;"),
    "cross_join_keyword": (
        "SELECT o.order_id FROM orders o CROSS JOIN customers c "
        "WHERE o.customer_id = c.customer_id;",
        "SELECT o.order_id FROM orders o JOIN customers c ON o.customer_id = c.customer_id;"),
    "subquery_and_lateral_view": (
        "SELECT k.click_id, t, c.tier FROM (SELECT * FROM clicks WHERE page <> 'x') k, "
        "customers c LATERAL VIEW explode(k.tags) e AS t "
        "WHERE k.user_id = c.customer_id AND t <> 'a';",
        "SELECT k.click_id, t, c.tier FROM (SELECT * FROM clicks WHERE page <> 'x') k "
        "JOIN customers c ON k.user_id = c.customer_id LATERAL VIEW explode(k.tags) e AS t "
        "WHERE t <> 'a';"),
}


@pytest.mark.parametrize("case", sorted(EQUIVALENT))
def test_a_comma_join_compiles_to_the_explicit_join(case):
    comma, explicit = EQUIVALENT[case]
    assert without_sql(plan(OUT + comma)) == without_sql(plan(OUT + explicit))


def test_keys_bound_and_filters_land_where_an_on_clause_puts_them():
    doc = plan(OUT + "SELECT o.order_id, p.paid FROM orders o, payments p "
               "WHERE o.region = 'eu' AND o.order_id = p.order_id AND o.order_id = 'x' "
               "AND p.pts BETWEEN o.ts AND o.ts + INTERVAL 1 HOUR AND p.paid > o.amount;")
    n = nodes(doc)
    join = n["join_1"]
    assert (join["left_keys"], join["right_keys"]) == (["order_id"], ["order_id"])
    assert "condition" not in join
    # pushdown treats it as any stream-stream join: a conjunct on the key moves below it...
    below = n[join["inputs"][0]]
    assert (below["step"], below["inputs"], below["predicate"]) == \
        ("filter", ["orders"], "order_id = 'x'")
    left = below["id"]
    assert join["time_bound"] == \
        f"payments.pts BETWEEN {left}.ts AND {left}.ts + INTERVAL '1' HOUR"
    # ...the others stay above; a range not reading both event times is no time bound
    above = [x for x in doc["nodes"] if x.get("inputs") == ["join_1"]]
    assert [(x["step"], x.get("predicate")) for x in above] == \
        [("filter", "region = 'eu' AND paid > amount")]


def test_select_star_lists_the_tables_in_from_order_when_they_join_in_another():
    doc = plan(OUT + "SELECT * FROM payments p, customers c, orders o "
               "WHERE c.customer_id = o.customer_id AND o.order_id = p.order_id;")
    n = nodes(doc)
    assert n["join_1"]["inputs"] == ["payments", "orders"]
    assert n["join_2"]["inputs"] == ["join_1", "customers"]
    sink_input = n[n["out"]["inputs"][0]]
    names = [c["name"] for c in sink_input["columns"]]
    assert names == ["payment_id", "order_id", "paid", "pts", "customer_id", "tier",
                     "country", "region", "amount", "quantity", "ts"]


def error(sql: str) -> SqlError:
    with pytest.raises(SqlError) as info:
        compile_sql(DDL + OUT + sql, "q.sql")
    return info.value


def underline(e: SqlError) -> str:
    return e.source_line[e.col - 1:e.col - 1 + e.length]  # type: ignore[index]


# (query, message fragment, underlined text)
ERRORS = {
    "no_where": ("SELECT * FROM orders, customers;",
                 "nothing in WHERE joins 'customers' to the other tables", "customers"),
    "no_equality_between_the_sides": (
        "SELECT * FROM orders o, customers c WHERE o.amount > 1 AND o.region <> c.country;",
        "nothing in WHERE joins 'c' to the other tables", "customers c"),
    "a_time_bound_is_not_a_key": (
        "SELECT * FROM orders o, payments p WHERE p.pts BETWEEN o.ts AND o.ts + "
        "INTERVAL 1 HOUR;", "nothing in WHERE joins 'p' to the other tables", "payments p"),
    "third_table_not_connected": (
        "SELECT o.amount FROM orders o, customers c, clicks k "
        "WHERE o.customer_id = c.customer_id;",
        "nothing in WHERE joins 'k' to the other tables", "clicks k"),
    "misspelt_key": (
        "SELECT o.amount FROM orders o, customers c WHERE o.customer_id = c.custmer_id;",
        "unknown column 'custmer_id' in table 'c' in WHERE (did you mean 'customer_id'?)",
        "custmer_id"),
    "unknown_table_in_where": (
        "SELECT o.amount FROM orders o, customers c WHERE o.customer_id = x.customer_id;",
        "unknown column 'x.customer_id' in WHERE", "x.customer_id"),
    # region is in orders and orders_eu: the first join alone would take it as o.region
    "ambiguous_across_all_tables": (
        "SELECT o.amount FROM orders o, customers c, orders_eu e "
        "WHERE region = c.country AND e.order_id = o.order_id;",
        "column 'region' in WHERE is ambiguous: write e.region or o.region", "region"),
    "same_alias_twice": (
        "SELECT o.amount FROM orders o, customers o WHERE o.customer_id = o.customer_id;",
        "table name or alias 'o' is used twice in FROM", "customers o"),
    "join_after_a_comma": (
        "SELECT o.amount FROM orders o, customers c JOIN payments p "
        "ON p.order_id = c.customer_id WHERE o.customer_id = c.customer_id;",
        "a JOIN after tables listed with commas is not supported",
        "payments p ON p.order_id = c.customer_id"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_comma_join_errors_point_at_the_sql(case):
    sql, message, text = ERRORS[case]
    e = error(sql)
    assert message in e.message
    assert e.line == DDL.count("\n") + 1
    assert underline(e) == text
