"""compat.sql.optimizer.prune_columns: sources declare only what the query reads."""

from __future__ import annotations

from compat.sql import ir
from compat.sql.optimizer import RULES
from compat.sql.optimizer.prune_columns import prune_columns
from compat.steps import Project
from tests.sql_util import NO_RULES, graph, nodes, plan


def schema(g: ir.Graph, sid: str) -> list[str]:
    return [c.name for c in g[sid].schema]


def test_rule_in_isolation():
    g = graph("CREATE TABLE out USING kafka AS SELECT customer_id, sum(amount) AS total "
              "FROM orders WHERE region = 'eu' GROUP BY customer_id;", NO_RULES)
    before = ir.explain(g)
    assert schema(g, "orders") == ["order_id", "customer_id", "region", "amount", "quantity",
                                   "ts"]
    out = prune_columns(g)
    # region: the filter; customer_id, amount: the aggregate; ts: the event time.
    assert schema(out, "orders") == ["customer_id", "region", "amount", "ts"]
    assert ir.explain(g) == before


def test_key_columns_of_a_table_and_the_first_column_stay():
    out = prune_columns(graph("CREATE TABLE out USING kafka AS SELECT o.order_id FROM orders o "
                              "JOIN customers c ON upper(o.customer_id) = c.tier;", NO_RULES))
    assert schema(out, "customers") == ["customer_id", "tier"]  # the key stays
    out = prune_columns(graph("CREATE TABLE raw (a STRING, b STRING) USING kafka;\n"
                              "CREATE TABLE out USING kafka AS SELECT count(*) AS n FROM raw;",
                              NO_RULES))
    assert schema(out, "raw") == ["a"]  # a source reads at least one column


def test_inner_projections_are_pruned_but_not_the_output():
    out = prune_columns(graph("CREATE TABLE out USING kafka AS SELECT a FROM (SELECT "
                              "order_id AS a, amount AS b, upper(region) AS c FROM orders);",
                              NO_RULES))
    projects = [s for s in out.steps.values() if isinstance(s, Project)]
    assert [[c.name for c in p.columns] for p in projects] == [["a"], ["a"]]
    assert schema(out, "orders") == ["order_id", "ts"]


def test_union_inputs_keep_the_same_columns():
    out = prune_columns(graph("CREATE TABLE out USING kafka AS SELECT region, count(*) AS n "
                              "FROM (SELECT * FROM orders_eu UNION ALL SELECT * FROM "
                              "orders_us) GROUP BY region;", NO_RULES))
    assert schema(out, "orders_eu") == schema(out, "orders_us") == ["region", "ts"]


def test_a_clashing_left_column_stays_so_right_names_stay():
    g = graph("CREATE TABLE out USING kafka AS SELECT e.order_id, u.region AS us_region "
              "FROM orders_eu e JOIN orders_us u ON e.order_id = u.order_id "
              "AND u.ts BETWEEN e.ts AND e.ts + INTERVAL 1 MINUTE;", NO_RULES)
    out = prune_columns(g)
    # e.region is not read, but without it u.region would be named region, not
    # orders_us_region.
    assert schema(out, "orders_eu") == ["order_id", "region", "ts"]
    assert out.columns("join_1") == ["order_id", "region", "ts", "orders_us_region",
                                     "orders_us_ts"]


def test_end_to_end_needs_the_rule():
    sql = "CREATE TABLE out USING kafka AS SELECT order_id FROM orders;"
    assert [c["name"] for c in nodes(plan(sql))["orders"]["schema"]] == ["order_id", "ts"]
    without = tuple(n for n, _ in RULES if n != "prune_columns")
    assert len(graph(sql, without)["orders"].schema) == 6


def test_a_column_named_like_a_keyword_is_read():
    # `load > 5` alone would parse as a LOAD command that reads no column: the filter's
    # column must still keep its place in the source.
    out = plan("CREATE TABLE ships (ship_id STRING, load DOUBLE, extra STRING) USING kafka;\n"
               "CREATE TABLE out USING kafka AS SELECT ship_id FROM "
               "(SELECT ship_id, load FROM ships) WHERE load > 5;")
    assert [c["name"] for c in nodes(out)["ships"]["schema"]] == ["ship_id", "load"]
    assert [n["predicate"] for n in out["nodes"] if n["step"] == "filter"] == ["load > 5"]
