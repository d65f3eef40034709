"""compat.sql.optimizer.predicate_pushdown: filters move toward the sources, but never change
what a stateful step keeps or what a nondeterministic predicate sees."""

from __future__ import annotations

from pathlib import Path

from compat.check import check_plans
from compat.infer import analyze
from compat.serde import from_doc
from compat.sql import compile_sql, ir
from compat.sql.optimizer import RULES
from compat.sql.optimizer.predicate_pushdown import predicate_pushdown
from tests.conftest import FIXTURES
from tests.sql_util import NO_RULES, graph, lines


def pushed(sql: str) -> tuple[list[str], list[str]]:
    """Non-source steps before and after the rule (and the input is left untouched)."""
    g = graph(sql, NO_RULES)
    before = ir.explain(g)
    out = predicate_pushdown(g)
    assert ir.explain(g) == before
    strip = lambda text: [x for x in lines(text) if " = source(" not in x]  # noqa: E731
    return strip(before), strip(ir.explain(out))


def test_through_a_projection_with_substitution():
    before, after = pushed("CREATE TABLE out USING kafka AS SELECT * FROM (SELECT order_id, "
                           "amount * quantity AS total FROM orders) WHERE total > 10;")
    assert before == ["select_1 = project(orders) columns=[order_id:order_id, "
                      "total:amount * quantity]",
                      "where_1 = filter(select_1) predicate=total > 10",
                      "out = sink(where_1) topic=out mode=append"]
    assert after == ["where_2 = filter(orders) predicate=(amount * quantity) > 10",
                     "select_1 = project(where_2) columns=[order_id:order_id, "
                     "total:amount * quantity]",
                     "out = sink(select_1) topic=out mode=append"]


def test_into_every_input_of_a_union():
    _, after = pushed("CREATE TABLE out USING kafka AS SELECT * FROM (SELECT * FROM orders_eu "
                      "UNION ALL SELECT * FROM orders_us) WHERE region = 'eu';")
    assert after[:3] == ["where_2 = filter(orders_eu) predicate=region = 'eu'",
                         "where_3 = filter(orders_us) predicate=region = 'eu'",
                         "union_1 = union(where_2, where_3)"]


def test_through_an_explode_unless_it_reads_the_exploded_column():
    _, after = pushed("CREATE TABLE out USING kafka AS SELECT * FROM (SELECT * FROM clicks "
                      "LATERAL VIEW explode(tags) t AS tag) WHERE page = 'home' AND tag <> 'x';")
    assert after[:3] == ["where_2 = filter(clicks) predicate=page = 'home'",
                         "explode_1 = explode(where_2) expr=tags alias=tag",
                         "where_1 = filter(explode_1) predicate=tag <> 'x'"]


def test_merges_adjacent_filters():
    _, after = pushed("CREATE TABLE out USING kafka AS SELECT * FROM (SELECT * FROM orders "
                      "WHERE amount > 0) WHERE region = 'eu';")
    assert after[0] == "where_1 = filter(orders) predicate=amount > 0 AND region = 'eu'"
    assert len(after) == 2


def test_across_an_aggregate_only_on_grouping_keys():
    # KLIP-6: y > 5 reads only a grouping key; cnt > 10 reads the state.
    _, after = pushed("CREATE TABLE out USING kafka AS SELECT quantity AS y, count(*) AS cnt "
                      "FROM orders GROUP BY quantity HAVING count(*) > 10 AND quantity > 5;")
    assert after[:3] == [
        "where_1 = filter(orders) predicate=quantity > 5",
        "aggregate_1 = aggregate(where_1) group_by=[y:quantity] aggregates=[cnt:count(*)]",
        "having_1 = filter(aggregate_1) predicate=cnt > 10",
    ]


def test_across_deduplicate_and_top_n_only_on_their_keys():
    _, after = pushed("CREATE TABLE out USING kafka OPTIONS (key 'click_id') AS SELECT * FROM "
                      "(SELECT *, ROW_NUMBER() OVER (PARTITION BY click_id ORDER BY ts) AS rn "
                      "FROM clicks) WHERE rn = 1 AND click_id <> 'x' AND page = 'home';")
    assert after[:3] == ["where_2 = filter(clicks) predicate=click_id <> 'x'",
                         "dedup_1 = deduplicate(where_2) keys=[click_id]",
                         "where_1 = filter(dedup_1) predicate=page = 'home'"]
    _, after = pushed("CREATE TABLE out USING kafka OPTIONS (key 'order_id') AS SELECT * FROM "
                      "(SELECT *, ROW_NUMBER() OVER (PARTITION BY region ORDER BY amount DESC) "
                      "AS rn FROM orders) WHERE rn <= 3 AND region = 'eu' AND amount > 5;")
    assert after[:3] == ["where_2 = filter(orders) predicate=region = 'eu'",
                         "top_n_1 = top_n(where_2) partition_by=[region] "
                         "order_by=[amount DESC] n=3",
                         "where_1 = filter(top_n_1) predicate=amount > 5"]


def test_into_the_matching_side_of_a_stream_table_join():
    _, after = pushed("CREATE TABLE out USING kafka AS SELECT * FROM orders o JOIN customers c "
                      "ON o.customer_id = c.customer_id WHERE c.tier = 'gold' "
                      "AND o.amount > 10 AND o.amount > c.country;")
    assert after[:4] == [
        "where_3 = filter(orders) predicate=amount > 10",
        "where_2 = filter(customers) predicate=tier = 'gold'",
        "join_1 = join(where_3, where_2) type=inner left_keys=[customer_id] "
        "right_keys=[customer_id]",
        "where_1 = filter(join_1) predicate=amount > country",
    ]


def test_not_into_the_null_padded_side_of_an_outer_join():
    _, after = pushed("CREATE TABLE out USING kafka AS SELECT * FROM orders o LEFT JOIN "
                      "customers c ON o.customer_id = c.customer_id WHERE c.tier = 'gold' "
                      "AND o.amount > 10;")
    assert after[:3] == ["where_2 = filter(orders) predicate=amount > 10",
                         "join_1 = join(where_2, customers) type=left left_keys=[customer_id] "
                         "right_keys=[customer_id]",
                         "where_1 = filter(join_1) predicate=tier = 'gold'"]


def test_across_a_stream_stream_join_only_on_key_columns():
    _, after = pushed("CREATE TABLE out USING kafka AS SELECT * FROM orders o JOIN payments p "
                      "ON o.order_id = p.order_id AND p.pts BETWEEN o.ts AND o.ts + INTERVAL "
                      "1 HOUR WHERE o.order_id <> 'x' AND p.paid > 1;")
    assert after[0] == "where_2 = filter(orders) predicate=order_id <> 'x'"
    assert after[-2] == "where_1 = filter(join_1) predicate=paid > 1"


def test_nondeterministic_predicates_stay_where_they_are():
    before, after = pushed("CREATE TABLE out USING kafka AS SELECT * FROM (SELECT * FROM orders "
                           "WHERE amount > 0) WHERE rand() < 0.1 AND region = 'eu';")
    assert after == before  # nothing moves past rand(), and rand() is not merged


def test_not_when_a_right_column_would_change_its_name():
    # regions.amount clashes with orders.amount and is written regions_amount: under a new
    # right input (a filter) it would be renamed <filter id>_amount.
    _, after = pushed("CREATE TABLE regions (region STRING, amount DOUBLE) USING kafka "
                      "OPTIONS (role 'table', key 'region');\n"
                      "CREATE TABLE out USING kafka AS SELECT * FROM orders o JOIN regions r "
                      "ON o.region = r.region WHERE r.amount > 1;")
    assert after[:2] == ["join_1 = join(orders, regions) type=inner left_keys=[region] "
                         "right_keys=[region]",
                         "where_1 = filter(join_1) predicate=regions_amount > 1"]


def test_end_to_end_the_klip6_move_compiles_to_one_plan():
    """Without the rule a HAVING on a grouping key stays after the aggregate, and the
    checker sees a moved predicate; with it both spellings compile to the same plan."""
    case = Path(FIXTURES) / "upgrades" / "klip6_having_filter_moved"
    old_sql = (case / "old.sql").read_text()
    new_sql = (case / "new.sql").read_text()
    assert "excluded_rules = 'predicate_pushdown'" in old_sql

    def check(old_text: str) -> tuple[str, list[str]]:
        plans = []
        for text in (old_text, new_sql):
            p = from_doc(compile_sql(text, "q.sql"), "q.sql")
            analyze(p)
            plans.append(p)
        r = check_plans(*plans)
        return r.verdict, sorted({f.code for f in r.findings})

    assert check(old_sql) == ("in_place", ["predicate-moved"])
    with_rule = "\n".join(x for x in old_sql.splitlines() if "excluded_rules" not in x)
    assert check(with_rule) == ("identical", [])
    assert "predicate_pushdown" in [n for n, _ in RULES]
