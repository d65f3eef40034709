"""compat.sql.optimizer.constant_folding: only folds that give Spark's value and type."""

from __future__ import annotations

import copy

import pytest
import sqlglot

from compat.sql import ir
from compat.sql.optimizer import RULES
from compat.sql.optimizer.constant_folding import constant_folding, fold
from tests.sql_util import NO_RULES, graph, lines, nodes, plan


@pytest.mark.parametrize("text, folded", [
    ("1 + 2 + x", "3 + x"),
    ("x > 2 * 5", "x > 10"),
    ("(1 + 2) * x", "3 * x"),
    ("-5 + 3", "-2"),
    ("'a' || 'b'", "'ab'"),
    ("concat('a', 'b', 'c')", "'abc'"),
    ("x > 3 AND TRUE", "x > 3"),
    ("x > 3 OR FALSE", "x > 3"),
    ("x > 3 AND 1 = 2", "FALSE"),
    ("x > 3 OR 1 < 2", "TRUE"),
    ("NOT (1 = 1)", "FALSE"),
    ("'a' < 'b'", "TRUE"),
    ("x BETWEEN 1 + 1 AND 3", "x BETWEEN 2 AND 3"),
    ("9223372036854775806 + 1", "9223372036854775807"),
    # left alone: not safe, or not constant
    ("x + 1 + 2", "x + 1 + 2"),  # reassociation: doubles round, ANSI overflow differs
    ("2147483647 + 1", "2147483647 + 1"),  # int overflow in Spark
    ("9223372036854775807 + 1", "9223372036854775807 + 1"),
    ("1.5 * 2", "1.5 * 2"),  # decimal result type would change
    ("1e3 + 1", "1e3 + 1"),  # double, not int
    ("5 / 2", "5 / 2"),
    ("rand() < 0.5 AND rand() < 0.5", "RAND() < 0.5 AND RAND() < 0.5"),
    ("concat('a', NULL)", "CONCAT('a', NULL)"),
    ("x BETWEEN 1 AND 3", "x BETWEEN 1 AND 3"),  # no rewriting for taste
])
def test_fold(text, folded):
    e = sqlglot.parse_one(text, read="spark")
    before = e.sql(dialect="spark")
    assert fold(e).sql(dialect="spark") == folded
    assert e.sql(dialect="spark") == before  # the input is not mutated


def test_rule_in_isolation():
    g = graph("CREATE TABLE out USING kafka AS SELECT order_id, amount * (2 + 3) AS x "
              "FROM orders o JOIN customers c ON o.customer_id = c.customer_id AND 1 = 1 "
              "WHERE amount > 1 + 2 AND 2 > 1;", NO_RULES)
    before = copy.deepcopy(ir.explain(g))
    assert [line for line in lines(before) if "source(" not in line] == [
        "join_1 = join(orders, customers) type=inner left_keys=[customer_id] "
        "right_keys=[customer_id] condition=1 = 1",
        "where_1 = filter(join_1) predicate=amount > 1 + 2 AND 2 > 1",
        "select_1 = project(where_1) columns=[order_id:order_id, x:amount * (2 + 3)]",
        "out = sink(select_1) topic=out mode=append",
    ]
    out = constant_folding(g)
    assert [line for line in lines(ir.explain(out)) if "source(" not in line] == [
        "join_1 = join(orders, customers) type=inner left_keys=[customer_id] "
        "right_keys=[customer_id]",
        "where_1 = filter(join_1) predicate=amount > 3",
        "select_1 = project(where_1) columns=[order_id:order_id, x:amount * 5]",
        "out = sink(select_1) topic=out mode=append",
    ]
    assert ir.explain(g) == before  # rules never mutate their input


def test_a_filter_that_keeps_everything_is_removed():
    g = graph("CREATE TABLE out USING kafka AS SELECT * FROM orders WHERE 1 < 2;", NO_RULES)
    assert "where_1" in g.steps
    out = constant_folding(g)
    assert "where_1" not in out.steps and out["out"].inputs == ("orders",)


def test_end_to_end_needs_the_rule():
    sql = "CREATE TABLE out USING kafka AS SELECT * FROM orders WHERE amount > 1 + 2 AND TRUE;"
    assert nodes(plan(sql))["where_1"]["predicate"] == "amount > 3"
    without = tuple(n for n, _ in RULES if n != "constant_folding")
    assert graph(sql, without)["where_1"].predicate == "amount > 1 + 2 AND TRUE"
