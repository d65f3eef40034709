"""compat.sql.optimizer.merge_projects: a projection of a projection is one projection."""

from __future__ import annotations

from compat.model import Column, NamedExpr
from compat.sql import ir
from compat.sql.optimizer import RULES
from compat.sql.optimizer.merge_projects import merge_projects
from compat.steps import Project, Sink, Source
from tests.sql_util import NO_RULES, graph, lines, nodes, plan

NESTED = ("CREATE TABLE out USING kafka AS SELECT a * 2 AS b, order_id FROM "
          "(SELECT amount + 1 AS a, order_id FROM orders);")


def steps(g: ir.Graph) -> list[str]:
    return [x for x in lines(ir.explain(g)) if " = source(" not in x]


def test_rule_in_isolation():
    g = graph(NESTED, NO_RULES)
    before = ir.explain(g)
    assert steps(g) == ["select_1 = project(orders) columns=[a:amount + 1, order_id:order_id]",
                        "select_2 = project(select_1) columns=[b:a * 2, order_id:order_id]",
                        "out = sink(select_2) topic=out mode=append"]
    out = merge_projects(g)
    assert steps(out) == ["select_2 = project(orders) columns=[b:(amount + 1) * 2, "
                          "order_id:order_id]",
                          "out = sink(select_2) topic=out mode=append"]
    assert ir.explain(g) == before


def test_an_identity_projection_goes():
    # Built by hand: the translator itself never writes a projection that changes nothing.
    g = ir.Graph(sink="out")
    g.add(Source(id="t", topic="t", partitions=1, format="json", role="stream",
                 schema=(Column("a", "int"), Column("b", "int"))))
    g.add(Project(id="p", inputs=("t",), columns=(NamedExpr("a", "a"), NamedExpr("b", "b"))))
    g.add(Sink(id="out", inputs=("p",), topic="out", format="json", key_columns=(),
               mode="append", delivery="exactly_once"))
    out = merge_projects(g)
    assert list(out.steps) == ["t", "out"] and out["out"].inputs == ("t",)
    assert list(g.steps) == ["t", "p", "out"]


def test_a_nondeterministic_expression_is_not_duplicated():
    g = graph("CREATE TABLE out USING kafka AS SELECT r AS a, r AS b FROM "
              "(SELECT rand() AS r FROM orders);", NO_RULES)
    assert steps(merge_projects(g)) == steps(g)


def test_end_to_end_needs_the_rule():
    assert [n["step"] for n in plan(NESTED)["nodes"]] == ["source", "project", "sink"]
    without = tuple(n for n, _ in RULES if n != "merge_projects")
    assert [s.step for s in ir.walk_steps(graph(NESTED, without))] == \
        ["source", "project", "project", "sink"]
    assert nodes(plan(NESTED))["select_2"]["columns"][0] == {"name": "b",
                                                             "expr": "(amount + 1) * 2"}
