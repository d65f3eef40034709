"""SQL to plan, one construct at a time (``compat.sql.translate``, ``script``, ``emit``).

Most cases compile without the optimizer (``NO_RULES``) so that they show the translation
itself; the optimizer has its own tests.
"""

from __future__ import annotations

import pytest

from compat.sql import COMPILER_VERSION, compile_sql
from tests.sql_util import DDL, NO_RULES, explain, graph, lines, nodes, plan


def steps(sql: str, rules: tuple[str, ...] | None = NO_RULES) -> list[str]:
    """The explain lines of the non-source steps."""
    return [line for line in lines(explain(sql, rules)) if " = source(" not in line]


# -- statements, settings and defaults ---------------------------------------------------------


def test_filter_query_with_defaults():
    doc = plan("CREATE TABLE big USING kafka AS SELECT * FROM orders WHERE amount > 100;")
    assert doc["query"] == "big"  # the sink's name without SET theseus.query
    assert "config" not in doc  # no SET spark.sql.shuffle.partitions: no config at all
    n = nodes(doc)
    assert list(n) == ["orders", "where_1", "big"]  # unused tables are left out
    assert n["where_1"] == {"id": "where_1", "step": "filter", "version": 1,
                            "inputs": ["orders"], "predicate": "amount > 100"}
    assert n["big"] == {"id": "big", "step": "sink", "version": 1, "inputs": ["where_1"],
                        "topic": "big", "format": "json", "key_columns": [], "mode": "append",
                        "delivery": "exactly_once"}


def test_settings_become_query_name_config_and_metadata():
    sql = ("SET spark.sql.shuffle.partitions = 8;\nSET theseus.query = 'totals';\n"
           "SET theseus.config.trigger = '10 seconds';\n"
           "SET theseus.metadata.owner = 'team-orders';\n" + DDL +
           "CREATE TABLE out USING kafka AS SELECT * FROM orders;\n")
    doc = compile_sql(sql, "q.sql")
    assert doc["query"] == "totals"
    assert doc["config"] == {"state_partitions": 8, "trigger": "10 seconds"}
    assert doc["metadata"] == {"compiler": COMPILER_VERSION, "sql": sql,
                               "owner": "team-orders"}
    assert COMPILER_VERSION == "theseus-sql/1"


def test_source_options_and_column_declarations():
    doc = compile_sql("""
        CREATE TABLE raw (line STRING NOT NULL) USING kafka
          OPTIONS ('topic' = 'raw-lines', partitions = 12, format 'string',
                   starting_offsets 'latest');
        CREATE TABLE ships (ship_id STRING, capacity DECIMAL(10, 2), tags ARRAY<STRING>,
                            pos STRUCT<lat: DOUBLE, lon: DOUBLE>, ts TIMESTAMP)
          USING kafka OPTIONS (role 'table', key 'SHIP_ID');
        CREATE TABLE out USING kafka OPTIONS (format 'string', delivery 'at_least_once') AS
        SELECT r.line FROM raw r LEFT SEMI JOIN ships s ON r.line = s.ship_id;
    """, "q.sql")
    n = nodes(doc)
    assert n["raw"]["topic"] == "raw-lines" and n["raw"]["partitions"] == 12
    assert n["raw"]["format"] == "string" and n["raw"]["starting_offsets"] == "latest"
    assert n["raw"]["schema"] == [{"name": "line", "type": "string", "nullable": False}]
    assert n["ships"]["role"] == "table" and n["ships"]["key_columns"] == ["ship_id"]
    assert n["ships"]["topic"] == "ships" and n["ships"]["partitions"] == 1
    assert n["join_1"]["type"] == "left_semi"
    assert n["out"]["format"] == "string" and n["out"]["delivery"] == "at_least_once"


def test_all_column_types_are_spark_types():
    g = graph("CREATE TABLE out USING kafka AS SELECT * FROM clicks;")
    assert [c.type for c in g["clicks"].schema] == \
        ["string", "string", "string", "array<string>", "timestamp"]


def test_insert_into_a_declared_table_renames_by_position_and_casts():
    doc = plan("CREATE TABLE out (id STRING, qty DOUBLE) USING kafka OPTIONS (key 'id');\n"
               "INSERT INTO out SELECT order_id, quantity FROM orders;")
    n = nodes(doc)
    (project,) = [x for x in n.values() if x["step"] == "project"]
    assert project["columns"] == [{"name": "id", "expr": "order_id"},
                                  {"name": "qty", "expr": "CAST(quantity AS DOUBLE)"}]
    assert n["out"]["key_columns"] == ["id"]


def test_cte_view_and_subquery():
    sql = ("CREATE TEMPORARY VIEW big AS SELECT * FROM orders WHERE amount > 100;\n"
           "CREATE TABLE out USING kafka AS\n"
           "WITH eu AS (SELECT * FROM big WHERE region = 'eu')\n"
           "SELECT x.order_id FROM (SELECT * FROM eu) x;")
    assert steps(sql) == [
        "where_1 = filter(orders) predicate=amount > 100",
        "where_2 = filter(where_1) predicate=region = 'eu'",
        "select_1 = project(where_2) columns=[order_id:order_id]",
        "out = sink(select_1) topic=out mode=append",
    ]


def test_names_are_case_insensitive_and_keep_the_declared_case():
    assert steps("CREATE TABLE out USING kafka AS SELECT ORDER_ID, Amount FROM ORDERS O "
                 "WHERE o.AMOUNT > 1;") == [
        "where_1 = filter(orders) predicate=amount > 1",
        "select_1 = project(where_1) columns=[order_id:order_id, amount:amount]",
        "out = sink(select_1) topic=out mode=append",
    ]


def test_select_star_and_identity_projection_add_no_step():
    assert steps("CREATE TABLE out USING kafka AS SELECT * FROM orders;") == \
        ["out = sink(orders) topic=out mode=append"]
    assert steps("CREATE TABLE out USING kafka AS SELECT o.* FROM orders o;") == \
        ["out = sink(orders) topic=out mode=append"]


def test_projection_names_aliases_and_expressions():
    (proj, _sink) = steps("CREATE TABLE out USING kafka AS "
                          "SELECT order_id AS id, amount * 2, upper(region) FROM orders;")
    assert proj == ("select_1 = project(orders) columns=[id:order_id, (amount * 2):amount * 2, "
                    "upper(region):UPPER(region)]")


# -- aggregates -----------------------------------------------------------------------------


def test_group_by_gives_the_sink_its_key_and_update_mode():
    assert steps("CREATE TABLE out USING kafka AS SELECT customer_id, sum(amount) AS total "
                 "FROM orders GROUP BY customer_id;") == [
        "aggregate_1 = aggregate(orders) group_by=[customer_id:customer_id] "
        "aggregates=[total:sum(amount)]",
        "out = sink(aggregate_1) topic=out key_columns=[customer_id] mode=update",
    ]


def test_having_and_aggregate_expressions_become_outputs_and_a_project():
    assert steps("CREATE TABLE out USING kafka AS SELECT customer_id AS c, "
                 "sum(amount) / count(*) AS mean FROM orders GROUP BY customer_id "
                 "HAVING count(*) > 10 AND max(quantity) < 5;") == [
        "aggregate_1 = aggregate(orders) group_by=[c:customer_id] aggregates=[sum(amount):"
        "sum(amount), count(1):count(*), max(quantity):max(quantity)]",
        "having_1 = filter(aggregate_1) predicate=`count(1)` > 10 AND `max(quantity)` < 5",
        "select_1 = project(having_1) columns=[c:c, mean:`sum(amount)` / `count(1)`]",
        "out = sink(select_1) topic=out key_columns=[c] mode=update",
    ]


def test_klip6_query():
    doc = compile_sql("CREATE TABLE foo (x INT, y INT, payload STRING) USING kafka;\n"
                      "CREATE TABLE out USING kafka AS SELECT X, Y, COUNT(*) FROM FOO "
                      "WHERE X=3 GROUP BY X, Y HAVING COUNT(*) > 10 AND Y > 5;", "q.sql")
    n = nodes(doc)
    assert n["aggregate_1"]["group_by"] == [{"name": "x", "expr": "x"},
                                            {"name": "y", "expr": "y"}]
    assert n["aggregate_1"]["aggregates"] == [{"name": "count(1)", "function": "count",
                                               "args": ["*"]}]
    # y > 5 reads only a grouping key: the optimizer moves it before the aggregate.
    assert n["where_1"]["predicate"] == "x = 3 AND y > 5"
    assert n["having_1"]["predicate"] == "`count(1)` > 10"
    assert n["out"]["key_columns"] == ["x", "y"] and n["out"]["mode"] == "update"


def test_having_prefers_select_aliases():
    (agg, having, _sink) = steps(
        "CREATE TABLE out USING kafka AS SELECT p.ship_id, sum(amount) AS load, "
        "max(quantity) AS amount FROM orders p GROUP BY p.ship_id HAVING load > amount;"
        .replace("ship_id", "customer_id"))
    assert "aggregates=[load:sum(amount), amount:max(quantity)]" in agg
    assert having == "having_1 = filter(aggregate_1) predicate=load > amount"


@pytest.mark.parametrize("group", ["lower(customer_id)", "c", "1"])
def test_group_by_expression_alias_or_position(group):
    assert steps("CREATE TABLE out USING kafka AS SELECT lower(customer_id) AS c, "
                 f"count(*) AS n FROM orders GROUP BY {group};")[0] == \
        "aggregate_1 = aggregate(orders) group_by=[c:LOWER(customer_id)] aggregates=[n:count(*)]"


def test_global_aggregate():
    assert steps("CREATE TABLE out USING kafka AS SELECT count(*) AS n FROM orders;") == [
        "aggregate_1 = aggregate(orders) aggregates=[n:count(*)]",
        "out = sink(aggregate_1) topic=out mode=update",
    ]


def test_aggregate_functions_and_distinct():
    (agg, _sink) = steps(
        "CREATE TABLE out USING kafka AS SELECT region, min(amount) AS a, avg(amount) AS b, "
        "approx_count_distinct(customer_id) AS c, collect_list(order_id) AS d, "
        "count(quantity) AS e, max_by(order_id, amount) AS f FROM orders GROUP BY region;")
    assert ("aggregates=[a:min(amount), b:avg(amount), c:approx_count_distinct(customer_id), "
            "d:collect_list(order_id), e:count(quantity), f:max_by(order_id, amount)]") in agg


@pytest.mark.parametrize("group, window, select, extra", [
    ("window(ts, '5 minutes'), page", "tumbling(ts, 5 minutes)", "window, page", None),
    ("window(ts, INTERVAL 10 MINUTES, '1 minute'), page", "hopping(ts, 10 minutes, 1 minute)",
     "window, page", None),
    ("page, session_window(ts, '30 minutes')", "session(ts, 30 minutes, 30 minutes)",
     "window, page", None),
    ("window(ts, '5 minutes'), page", "tumbling(ts, 5 minutes)",
     "window.start AS starts, page",
     "select_1 = project(aggregate_1) columns=[starts:window.start, page:page, n:n]"),
])
def test_windows(group, window, select, extra):
    got = steps(f"CREATE TABLE out USING kafka AS SELECT {select}, count(*) AS n FROM clicks "
                f"GROUP BY {group};")
    assert got[0] == ("aggregate_1 = aggregate(clicks) group_by=[page:page] "
                      f"aggregates=[n:count(*)] window={window}")
    if extra:
        assert got[1] == extra
    # windowed on an event-time column: append mode, keyed by the GROUP BY columns
    assert got[-1].endswith("key_columns=[page] mode=append")


def test_window_output_column_comes_first():
    doc = plan("CREATE TABLE out USING kafka AS SELECT window, page, count(*) AS n FROM clicks "
               "GROUP BY window(ts, '5 minutes'), page;")
    assert nodes(doc)["aggregate_1"]["window"] == {"type": "tumbling", "column": "ts",
                                                   "size": "5 minutes"}
    assert [n["step"] for n in doc["nodes"]] == ["source", "aggregate", "sink"]


# -- joins, unions, explode -------------------------------------------------------------------


def test_stream_stream_join_with_time_bound():
    doc = plan("CREATE TABLE out USING kafka OPTIONS (key 'order_id') AS SELECT * "
               "FROM orders o JOIN payments p ON o.order_id = p.order_id "
               "AND p.pts BETWEEN o.ts AND o.ts + INTERVAL 1 HOUR;")
    j = nodes(doc)["join_1"]
    assert j["inputs"] == ["orders", "payments"]
    assert (j["type"], j["left_keys"], j["right_keys"]) == ("inner", ["order_id"], ["order_id"])
    # qualified by the input ids, as the plan format says
    assert j["time_bound"] == "payments.pts BETWEEN orders.ts AND orders.ts + INTERVAL '1' HOUR"
    assert "condition" not in j


def test_stream_table_join_condition_keys_swapped_and_left_join():
    doc = plan("CREATE TABLE out USING kafka AS SELECT o.order_id, c.tier FROM orders o "
               "LEFT JOIN customers c ON c.customer_id = o.customer_id "
               "AND c.country <> 'XX';")
    j = nodes(doc)["join_1"]
    assert (j["type"], j["left_keys"], j["right_keys"]) == ("left", ["customer_id"],
                                                            ["customer_id"])
    assert j["condition"] == "customers.country <> 'XX'"


def test_join_using_and_expression_keys():
    assert steps("CREATE TABLE out USING kafka AS SELECT * FROM orders "
                 "JOIN customers USING (customer_id);")[0] == \
        "join_1 = join(orders, customers) type=inner left_keys=[customer_id] " \
        "right_keys=[customer_id]"
    assert steps("CREATE TABLE out USING kafka AS SELECT o.order_id FROM orders o JOIN "
                 "customers c ON upper(o.customer_id) = upper(c.customer_id);")[0] == \
        "join_1 = join(orders, customers) type=inner left_keys=[UPPER(customer_id)] " \
        "right_keys=[UPPER(customer_id)]"


def test_join_output_columns_follow_the_plan_rules():
    # order_id is a paired key (dropped on the right); region is renamed <right id>_region.
    g = graph("CREATE TABLE out USING kafka AS SELECT e.region, u.region AS us_region, "
              "u.order_id AS uid FROM orders_eu e JOIN orders_us u ON e.order_id = u.order_id "
              "AND u.ts BETWEEN e.ts AND e.ts + INTERVAL 1 MINUTE;", NO_RULES)
    assert g.columns("join_1") == ["order_id", "region", "amount", "ts", "orders_us_region",
                                   "orders_us_amount", "orders_us_ts"]
    assert ir_cols(g["select_1"]) == [("region", "region"), ("us_region", "orders_us_region"),
                                      ("uid", "order_id")]


def ir_cols(project):
    return [(c.name, c.expr) for c in project.columns]


def test_a_table_read_twice_is_two_sources():
    doc = plan("CREATE TABLE out USING kafka AS SELECT a.order_id FROM orders a JOIN orders b "
               "ON a.order_id = b.order_id AND b.ts BETWEEN a.ts AND a.ts + INTERVAL 1 HOUR;")
    n = nodes(doc)
    assert n["join_1"]["inputs"] == ["orders", "orders_2"]
    assert n["orders_2"]["topic"] == "orders"


def test_union_all_flattens_and_renames_by_position():
    assert steps("CREATE TABLE out USING kafka AS SELECT * FROM orders_eu UNION ALL "
                 "SELECT * FROM orders_us UNION ALL SELECT * FROM orders_eu;")[0] == \
        "union_1 = union(orders_eu, orders_us, orders_eu_2)"
    got = steps("CREATE TABLE out USING kafka AS SELECT order_id AS id FROM orders_eu "
                "UNION ALL SELECT order_id FROM orders_us;")
    assert got[:3] == ["select_1 = project(orders_eu) columns=[id:order_id]",
                       "select_2 = project(orders_us) columns=[order_id:order_id]",
                       "select_3 = project(select_2) columns=[id:order_id]"]
    assert got[3] == "union_1 = union(select_1, select_3)"


def test_union_distinct_and_select_distinct_deduplicate_whole_rows():
    assert steps("CREATE TABLE out USING kafka AS SELECT region FROM orders_eu UNION "
                 "SELECT region FROM orders_us;")[3] == \
        "distinct_1 = deduplicate(union_1) keys=[region]"
    assert steps("CREATE TABLE out USING kafka AS SELECT DISTINCT user_id, page "
                 "FROM clicks;") == [
        "select_1 = project(clicks) columns=[user_id:user_id, page:page]",
        "distinct_1 = deduplicate(select_1) keys=[user_id, page]",
        "out = sink(distinct_1) topic=out mode=append",
    ]


def test_lateral_view_and_select_list_explode():
    assert steps("CREATE TABLE out USING kafka AS SELECT * FROM clicks "
                 "LATERAL VIEW OUTER explode(tags) t AS tag;")[0] == \
        "explode_1 = explode(clicks) expr=tags alias=tag outer=True"
    assert steps("CREATE TABLE out USING kafka AS SELECT click_id, explode(tags) AS tag "
                 "FROM clicks WHERE page = 'home';") == [
        "where_1 = filter(clicks) predicate=page = 'home'",
        "explode_1 = explode(where_1) expr=tags alias=tag",
        "select_1 = project(explode_1) columns=[click_id:click_id, tag:tag]",
        "out = sink(select_1) topic=out mode=append",
    ]
    assert steps("CREATE TABLE out USING kafka AS SELECT *, explode_outer(tags) AS tag "
                 "FROM clicks;") == [
        "explode_1 = explode(clicks) expr=tags alias=tag outer=True",
        "out = sink(explode_1) topic=out mode=append",
    ]
    assert steps("CREATE TABLE out USING kafka AS SELECT t.tag, count(*) AS n FROM clicks "
                 "LATERAL VIEW explode(tags) t AS tag GROUP BY t.tag;")[1] == \
        "aggregate_1 = aggregate(explode_1) group_by=[tag:tag] aggregates=[n:count(*)]"


# -- ROW_NUMBER(): Top-N and deduplication ------------------------------------------------------


TOPN = ("CREATE TABLE out USING kafka OPTIONS (key 'order_id') AS SELECT {outer} FROM "
        "(SELECT *, ROW_NUMBER() OVER (PARTITION BY region ORDER BY amount DESC, ts) AS rn "
        "FROM orders WHERE amount > 0) WHERE {bound};")


@pytest.mark.parametrize("bound, n", [("rn <= 3", 3), ("rn < 4", 3), ("3 >= rn", 3),
                                      ("rn = 1", 1), ("rn BETWEEN 1 AND 2", 2)])
def test_top_n(bound, n):
    got = steps(TOPN.format(outer="*", bound=bound))
    assert got[1] == ("top_n_1 = top_n(where_1) partition_by=[region] "
                      "order_by=[amount DESC, ts]" + (f" n={n}" if n != 1 else ""))
    # the row number is no output column: SELECT * is the input's columns
    assert got[2] == "out = sink(top_n_1) topic=out key_columns=[order_id] mode=update"


def test_top_n_with_more_conditions_and_a_projection():
    got = steps(TOPN.format(outer="order_id, amount", bound="rn <= 3 AND amount > 10"))
    assert got[2:] == ["where_2 = filter(top_n_1) predicate=amount > 10",
                       "select_1 = project(where_2) columns=[order_id:order_id, amount:amount]",
                       "out = sink(select_1) topic=out key_columns=[order_id] mode=update"]


def test_dedup_pattern_with_and_without_within():
    sql = ("CREATE TABLE out USING kafka AS SELECT {hint} * FROM (SELECT *, ROW_NUMBER() "
           "OVER (PARTITION BY click_id ORDER BY ts) AS rn FROM clicks) WHERE rn = 1;")
    assert steps(sql.format(hint=""))[0] == "dedup_1 = deduplicate(clicks) keys=[click_id]"
    assert steps(sql.format(hint="/*+ DEDUP_WITHIN('1 hour') */"))[0] == \
        "dedup_1 = deduplicate(clicks) keys=[click_id] within=1 hour"
    assert steps("CREATE TABLE out USING kafka AS SELECT /*+ DEDUP_WITHIN('10 minutes') */ "
                 "DISTINCT user_id, ts FROM clicks;")[1] == \
        "distinct_1 = deduplicate(select_1) keys=[user_id, ts] within=10 minutes"


def test_row_number_one_by_another_order_is_a_top_1():
    got = steps("CREATE TABLE out USING kafka OPTIONS (key 'click_id') AS SELECT * FROM "
                "(SELECT *, ROW_NUMBER() OVER (PARTITION BY click_id ORDER BY ts DESC) AS rn "
                "FROM clicks) WHERE rn = 1;")
    assert got[0] == "top_n_1 = top_n(clicks) partition_by=[click_id] order_by=[ts DESC]"


def test_the_compiled_plan_passes_the_checker_validation(tmp_path):
    from compat.check import load_plan
    from compat.sql import dumps

    doc = plan("CREATE TABLE out USING kafka AS SELECT customer_id, sum(amount) AS total "
               "FROM orders GROUP BY customer_id;")
    path = tmp_path / "plan.json"
    path.write_text(dumps(doc))
    loaded = load_plan(str(path))
    assert loaded.sink_id == "out" and loaded.info["out"].mode == "I,UA"


def test_docs_sample_is_the_ship_load_fixture():
    from compat.check import check_plans, load_plan
    from compat.infer import analyze
    from compat.serde import from_doc
    from tests.conftest import FIXTURES, ROOT

    page = (ROOT / "docs" / "sql.md").read_text()
    sql = page.split("```sql\n", 1)[1].split("```", 1)[0]
    compiled = from_doc(compile_sql(sql, "docs/sql.md"), "docs/sql.md")
    analyze(compiled)
    report = check_plans(load_plan(str(FIXTURES / "plans" / "ship_load.json")), compiled)
    assert report.verdict == "identical", [f.message for f in report.findings]
