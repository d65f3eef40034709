"""``CREATE TABLE ... AS SELECT`` over tables: a query that reads tables only reads them as
changelogs and writes upserts and tombstones keyed as ksqlDB keys them, on the fastest step
versions (source 4, aggregate 2, join 3: the state per bucket of keys); a table joined to a
stream stays a snapshot (version 1), and option ``read`` says it explicitly."""

from __future__ import annotations

import pytest

from compat.errors import SqlError
from compat.sql import compile_sql
from tests.sql_util import nodes

DDL = """\
CREATE TABLE users (user_id STRING, region STRING, score BIGINT)
  USING kafka OPTIONS (role 'table', key 'user_id', partitions 3);
CREATE TABLE profiles (user_id STRING, tier STRING)
  USING kafka OPTIONS (role 'table', key 'user_id');
CREATE TABLE orders (order_id STRING, user_id STRING, amount BIGINT)
  USING kafka OPTIONS (role 'table', key 'order_id');
CREATE TABLE clicks (user_id STRING, page STRING) USING kafka;
"""


def compiled(sql: str) -> dict:
    return nodes(compile_sql(DDL + sql, "q.sql"))


def test_a_table_filter_and_select_reads_a_changelog_keyed_by_the_table_key():
    n = compiled("CREATE TABLE good USING kafka AS SELECT user_id, score * 2 AS s "
                 "FROM users WHERE score > 40;")
    assert n["users"]["version"] == 4 and "read" not in n["users"]
    assert "state_buckets" not in n["users"]  # the plan format's default
    assert n["good"]["mode"] == "update" and n["good"]["key_columns"] == ["user_id"]


def test_a_table_aggregate_is_keyed_by_its_groups():
    n = compiled("CREATE TABLE r USING kafka AS SELECT region, count(*) AS n, "
                 "min(score) AS lo FROM users GROUP BY region;")
    assert n["users"]["version"] == 4
    assert next(v for v in n.values() if v["step"] == "aggregate")["version"] == 2
    assert n["r"]["key_columns"] == ["region"] and n["r"]["mode"] == "update"


def test_a_foreign_key_join_is_keyed_by_the_left_table():
    n = compiled("CREATE TABLE fk USING kafka AS SELECT o.order_id, o.amount, u.region "
                 "FROM orders o JOIN users u ON o.user_id = u.user_id;")
    j = next(v for v in n.values() if v["step"] == "join")
    assert j["type"] == "inner" and j["left_keys"] == ["user_id"] and j["version"] == 3
    assert n["fk"]["key_columns"] == ["order_id"]


def test_a_left_table_table_join():
    n = compiled("CREATE TABLE lj USING kafka AS SELECT u.user_id, p.tier "
                 "FROM users u LEFT JOIN profiles p ON u.user_id = p.user_id;")
    assert {n["users"]["version"], n["profiles"]["version"]} == {4}
    assert next(v for v in n.values() if v["step"] == "join")["version"] == 3
    assert n["lj"]["key_columns"] == ["user_id"]


def test_a_table_joined_to_a_stream_stays_a_snapshot():
    n = compiled("CREATE TABLE e USING kafka AS SELECT c.user_id, c.page, u.region "
                 "FROM clicks c JOIN users u ON c.user_id = u.user_id;")
    assert n["users"]["version"] == 1 and n["e"]["mode"] == "append"
    assert next(v for v in n.values() if v["step"] == "join")["version"] == 1


def test_read_snapshot_alone_is_refused_as_before():
    ddl = DDL.replace("key 'user_id', partitions 3", "key 'user_id', read 'snapshot'")
    with pytest.raises(SqlError, match="snapshot-read tables only"):
        compile_sql(ddl + "CREATE TABLE x USING kafka AS SELECT * FROM users;", "q.sql")


def test_read_snapshot_says_version_2():
    ddl = DDL.replace("key 'user_id', partitions 3", "key 'user_id', read 'snapshot'")
    n = nodes(compile_sql(ddl + "CREATE TABLE e USING kafka AS SELECT c.page, u.region "
                          "FROM clicks c JOIN users u ON c.user_id = u.user_id;", "q.sql"))
    assert n["users"]["version"] == 2 and n["users"]["read"] == "snapshot"


def test_read_on_a_stream_is_refused():
    with pytest.raises(SqlError, match="option 'read'"):
        compile_sql(DDL.replace("USING kafka;", "USING kafka OPTIONS (read 'changelog');") +
                    "CREATE TABLE o USING kafka AS SELECT * FROM clicks;", "q.sql")


def test_a_key_option_that_is_not_unique_over_a_changelog_is_refused():
    with pytest.raises(SqlError) as e:
        compile_sql(DDL + "CREATE TABLE r USING kafka OPTIONS (key 'region') AS "
                    "SELECT region, score FROM users;", "q.sql")
    msg = str(e.value)
    assert "no columns are unique" in msg and "the table's key" in msg
    assert "found key_columns ['region']" in msg
    with pytest.raises(SqlError) as e:
        compile_sql(DDL + "CREATE TABLE r USING kafka OPTIONS (key 'region') AS "
                    "SELECT user_id, region, score FROM users;", "q.sql")
    msg = str(e.value)  # the key that would be unique is named
    assert "does not tell the rows" in msg and "key_columns including [user_id]" in msg


def test_one_user_many_orders_is_keyed_by_the_order():
    # the first table is users, but one user has many orders: keyed by user_id, the
    # retraction of one order would tombstone the user's other orders
    n = compiled("CREATE TABLE uo USING kafka AS SELECT u.user_id, u.region, o.order_id, "
                 "o.amount FROM users u JOIN orders o ON u.user_id = o.user_id;")
    assert n["uo"]["key_columns"] == ["order_id"]


def test_a_left_join_to_many_is_keyed_by_both_tables_keys():
    n = compiled("CREATE TABLE uo USING kafka AS SELECT u.user_id, o.order_id, o.amount "
                 "FROM users u LEFT JOIN orders o ON u.user_id = o.user_id;")
    assert n["uo"]["key_columns"] == ["user_id", "order_id"]


def test_a_renamed_table_key_is_the_output_key():
    n = compiled("CREATE TABLE k USING kafka AS SELECT user_id AS who, score FROM users;")
    assert n["k"]["key_columns"] == ["who"]


def test_an_output_without_a_unique_key_is_refused_with_the_reason():
    with pytest.raises(SqlError, match="retraction"):
        compile_sql(DDL + "CREATE TABLE r USING kafka AS SELECT region, score FROM users;",
                    "q.sql")
