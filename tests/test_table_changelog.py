"""Tables read as changelogs (source version 2, ``read``): inference of modes through the
steps, the join rule (stateful unless one side is a snapshot-read table), and the plans
refused with one clear message."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from compat.check import load_plan
from compat.infer import INSERT, RETRACT, UPSERT, characteristics
from migrate.cli import main
from tests.conftest import FIXTURES

CASES = FIXTURES / "upgrades"


def doc(case: str, side: str = "new.json") -> dict:
    return json.loads((CASES / case / side).read_text())


def infos(write_plan, d: dict):
    plan = load_plan(write_plan(d))
    return plan, plan.info


def refused(write_plan, d: dict, *needles: str) -> str:
    result = CliRunner().invoke(main, ["check", write_plan(d), write_plan(d)])
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    for n in needles:
        assert n in result.output, (n, result.output)
    assert "Traceback" not in result.output
    return result.output


def test_a_table_alone_runs_as_a_changelog(write_plan):
    plan, info = infos(write_plan, doc("table_filter_changed"))
    assert info["users"].changelog and info["users"].stream and info["users"].stateful
    assert info["users"].mode == RETRACT
    assert info["f"].mode == RETRACT and info["f"].changelog and not info["f"].stateful
    assert info["out"].mode == RETRACT
    assert characteristics(plan) == ["stateful"]


def test_version_1_keeps_a_table_a_snapshot_and_a_table_alone_refused(write_plan):
    d = doc("table_filter_changed")
    d["nodes"][0]["version"] = 1
    refused(write_plan, d, "/nodes/2/inputs", "snapshot-read tables only", "read: changelog")


def test_read_snapshot_in_version_2_means_version_1(write_plan):
    d = doc("table_source_version_bump_snapshot")
    _, info = infos(write_plan, d)
    assert not info["users"].changelog and not info["users"].stream
    assert info["users"].mode == UPSERT
    assert not info["j"].stateful and info["j"].mode == INSERT


def test_read_is_a_version_2_field(write_plan):
    d = doc("table_filter_changed")
    d["nodes"][0].update(version=1, read="changelog")
    refused(write_plan, d, "/nodes/0/read", "version 2")


def test_read_on_a_stream_is_refused(write_plan):
    d = doc("table_source_version_bump_snapshot")
    d["nodes"][0].update(version=2, read="changelog")
    refused(write_plan, d, "/nodes/0/read", "role 'table'")


def test_table_aggregate_retracts_and_is_stateful(write_plan):
    plan, info = infos(write_plan, doc("table_aggregate_function_added"))
    assert info["a"].mode == RETRACT and info["a"].stateful and info["a"].changelog
    assert [c for c, _ in info["a"].columns] == ["region", "n", "total", "top"]


@pytest.mark.parametrize("fn", ["first", "collect_list", "stddev"])
def test_table_aggregate_refuses_what_it_cannot_retract(write_plan, fn):
    d = doc("table_aggregate_function_added")
    d["nodes"][2]["aggregates"][2]["function"] = fn
    refused(write_plan, d, "/nodes/2/aggregates/2/function", "retract")


def test_table_aggregate_refuses_distinct(write_plan):
    d = doc("table_aggregate_function_added")
    d["nodes"][2]["aggregates"][0]["distinct"] = True
    refused(write_plan, d, "/nodes/2/aggregates/0", "distinct")


def test_table_table_join_is_stateful_and_retracts(write_plan):
    plan, info = infos(write_plan, doc("table_table_join_type_changed"))
    assert info["j"].stateful and info["j"].mode == RETRACT and info["j"].changelog
    assert "joined" in characteristics(plan)


def test_a_foreign_key_join_is_an_equi_join_on_a_column_of_the_left_row(write_plan):
    # orders.user_id is not orders' key: ksqlDB's foreign-key join
    _, info = infos(write_plan, doc("table_table_join_type_changed", "old.json"))
    assert [c for c, _ in info["j"].columns] == ["order_id", "user_id", "amount", "region",
                                                 "score"]


@pytest.mark.parametrize("how", ["right", "full", "left_semi"])
def test_table_table_join_types(write_plan, how):
    d = doc("table_table_join_type_changed")
    d["nodes"][2]["type"] = how
    refused(write_plan, d, "/nodes/2/type", "inner or left")


def test_table_table_join_refuses_a_condition(write_plan):
    d = doc("table_table_join_type_changed")
    d["nodes"][2]["condition"] = "orders.amount > users.score"
    refused(write_plan, d, "/nodes/2/condition", "keys only")


def test_a_changelog_joined_with_a_stream_is_refused(write_plan):
    d = doc("table_table_join_type_changed")
    d["nodes"][0].update(role="stream", version=1)
    d["nodes"][0].pop("key_columns")
    refused(write_plan, d, "/nodes/2/inputs/0", "a stream", "read: snapshot")


def test_a_changelog_joined_with_a_snapshot_is_refused(write_plan):
    d = doc("table_table_join_type_changed")
    d["nodes"][1]["read"] = "snapshot"
    refused(write_plan, d, "/nodes/2/inputs/1", "snapshot-read table")


@pytest.mark.parametrize("mode", ["append", "complete"])
def test_the_sink_of_a_changelog_writes_updates(write_plan, mode):
    d = doc("table_filter_changed")
    d["nodes"][2]["mode"] = mode
    refused(write_plan, d, "/nodes/2/mode")


def test_a_changelog_has_no_event_time(write_plan):
    d = doc("table_filter_changed")
    d["nodes"][0]["schema"].append({"name": "ts", "type": "timestamp"})
    d["nodes"][0]["event_time"] = {"column": "ts", "watermark": "1 minute"}
    refused(write_plan, d, "/nodes/0/event_time", "no event_time")


def test_a_changelog_is_not_deduplicated_or_ranked(write_plan):
    d = doc("table_filter_changed")
    d["nodes"][1] = {"id": "f", "step": "deduplicate", "version": 1, "inputs": ["users"],
                     "keys": ["user_id"]}
    refused(write_plan, d, "/nodes/1/inputs", "[I]")


# -- the sink's key must be unique per row of a changelog ------------------------------------
#
# The sink writes each key's last row and a retraction as a tombstone of its key: keyed by
# a column that several rows share (a region of many users), the retraction of one row
# would delete the key while the others are still in the table.

def _users_orders(how: str, key: list[str]) -> dict:
    """users JOIN orders ON user_id: one user, many orders."""
    d = doc("table_table_join_type_changed")
    orders, users, j, out = d["nodes"]
    j.update(inputs=["users", "orders"], type=how)
    out["key_columns"] = key
    return {**d, "nodes": [users, orders, j, out]}


def test_a_filter_keyed_by_a_column_that_is_not_unique_is_refused(write_plan):
    d = doc("table_filter_changed")
    d["nodes"][2]["key_columns"] = ["region"]
    out = refused(write_plan, d, "/nodes/2/key_columns", "['region']", "[user_id]",
                  "tombstone")
    assert "node 'out'" in out


def test_a_filter_keyed_by_the_table_key_and_more_is_accepted(write_plan):
    d = doc("table_filter_changed")
    d["nodes"][2]["key_columns"] = ["region", "USER_ID"]
    _, info = infos(write_plan, d)
    assert info["out"].keys == (("user_id",),)


def test_a_project_keeps_a_renamed_key_and_loses_a_computed_one(write_plan):
    d = doc("table_filter_changed")
    d["nodes"][1] = {"id": "f", "step": "project", "version": 1, "inputs": ["users"],
                     "columns": [{"name": "uid", "expr": "User_Id"},
                                 {"name": "region", "expr": "region"}]}
    d["nodes"][2]["key_columns"] = ["uid"]
    _, info = infos(write_plan, d)
    assert info["f"].keys == (("uid",),)
    d["nodes"][1]["columns"].append({"name": "again", "expr": "user_id"})
    d["nodes"][2]["key_columns"] = ["again"]
    _, info = infos(write_plan, d)
    assert info["f"].keys == (("uid",), ("again",))
    d["nodes"][1]["columns"].pop()
    d["nodes"][2]["key_columns"] = ["uid"]
    d["nodes"][1]["columns"][0]["expr"] = "upper(user_id)"  # 'a' and 'A' meet
    refused(write_plan, d, "/nodes/2/key_columns", "no columns are unique", "GROUP BY")


def test_an_aggregate_is_unique_by_its_groups_only(write_plan):
    d = doc("table_aggregate_function_added")
    assert d["nodes"][-1]["key_columns"] == ["region"]
    _, info = infos(write_plan, d)
    assert info["a"].keys == (("region",),)
    d["nodes"][-1]["key_columns"] = ["n"]
    refused(write_plan, d, "/nodes/3/key_columns", "[region]")


def test_an_explode_over_a_changelog_has_no_unique_key(write_plan):
    d = doc("table_filter_changed")
    d["nodes"][0]["schema"].append({"name": "tags", "type": "array<string>"})
    d["nodes"][1] = {"id": "f", "step": "explode", "version": 1, "inputs": ["users"],
                     "expr": "tags", "as": "tag"}
    refused(write_plan, d, "/nodes/2/key_columns", "no columns are unique", "explode")


def test_a_union_of_two_changelogs_has_no_unique_key(write_plan):
    d = doc("table_filter_changed")
    other = {**d["nodes"][0], "id": "users2", "topic": "users2"}
    d["nodes"][1] = {"id": "f", "step": "union", "version": 1, "inputs": ["users", "users2"]}
    d["nodes"].insert(1, other)
    refused(write_plan, d, "/nodes/3/key_columns", "no columns are unique", "union")


def test_one_user_many_orders_is_unique_by_the_order(write_plan):
    refused(write_plan, _users_orders("inner", ["user_id"]), "/nodes/3/key_columns",
            "['user_id']", "[order_id]")
    _, info = infos(write_plan, _users_orders("inner", ["order_id"]))
    assert info["j"].keys == (("order_id",), ("user_id", "order_id"))


def test_a_left_join_to_many_rows_is_unique_by_both_keys(write_plan):
    # a user without orders is one padded row whose order_id is null: order_id alone
    # would give every such user the same key
    refused(write_plan, _users_orders("left", ["order_id"]), "/nodes/3/key_columns",
            "[user_id, order_id]")
    _, info = infos(write_plan, _users_orders("left", ["user_id", "order_id"]))
    assert info["j"].keys == (("user_id", "order_id"),)


def test_a_foreign_key_join_is_unique_by_the_left_key(write_plan):
    for how in ("inner", "left"):
        d = doc("table_table_join_type_changed")
        d["nodes"][2]["type"] = how
        _, info = infos(write_plan, d)
        assert info["j"].keys[0] == ("order_id",), how


def test_a_join_on_a_right_column_that_is_not_its_key(write_plan):
    # orders JOIN users ON orders.user_id = upper(users.user_id): users 'a' and 'A'
    # both meet order o1, so order_id alone is not unique
    d = doc("table_table_join_type_changed")
    d["nodes"][2]["right_keys"] = ["upper(user_id)"]
    refused(write_plan, d, "/nodes/3/key_columns", "[order_id, users_user_id]")


@pytest.mark.parametrize("node,ptr", [(0, "/nodes/0/key_columns/1"),
                                      (2, "/nodes/2/key_columns/1")])
def test_a_key_column_listed_twice_is_refused(write_plan, node, ptr):
    d = doc("table_filter_changed")
    d["nodes"][node]["key_columns"] = ["user_id", "User_Id"]
    refused(write_plan, d, ptr, "listed twice", "each key column once")


@pytest.mark.parametrize("fn", ["sum", "avg"])
@pytest.mark.parametrize("arg,typ", [("region", "string"), ("upper(region)", "string"),
                                     ("score > 1", "boolean")])
def test_table_sum_and_avg_take_numbers_only(write_plan, fn, arg, typ):
    # the changelog operator adds the JSON values themselves: a string would fail at run
    # time (int += str), where Spark's own sum would cast it
    d = doc("table_aggregate_function_added")
    d["nodes"][2]["aggregates"][1].update(function=fn, args=[arg])
    out = refused(write_plan, d, "/nodes/2/aggregates/1", typ)
    assert "Traceback" not in out


@pytest.mark.parametrize("arg", ["score", "CAST(region AS double)", "score * 1.5",
                                 "CAST(score AS decimal(10,2))"])
def test_table_sum_and_avg_over_numbers(write_plan, arg):
    d = doc("table_aggregate_function_added")
    d["nodes"][2]["aggregates"][1].update(function="avg", args=[arg])
    infos(write_plan, d)


@pytest.mark.parametrize("case", ["table_filter_changed", "table_aggregate_filter_changed"])
def test_check_advises_a_shadow_not_a_restart_over_a_changelog(case):
    # the migrator refuses an in-place restart over changelogs (migrate.phases.check): the
    # check must not advise one, while keeping ksqlDB's verdict
    args = ["check", str(CASES / case / "old.json"), str(CASES / case / "new.json")]
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert text.output.startswith("verdict: in_place")
    assert "or stop and run" not in text.output
    assert "[changelog-restart-shadowed]" in text.output
    assert "theseus migrate start (a shadow)" in text.output.splitlines()[0]
    rep = json.loads(CliRunner().invoke(main, args + ["--format", "json"]).output)
    assert rep["verdict"] == "in_place" and rep["exit_code"] == 0
    in_place = [f for f in rep["findings"] if f["effect"] == "in_place"]
    assert in_place and all("shadow" in f["hint"] and "do not stop the query" in f["hint"]
                            for f in in_place)


def test_check_still_advises_a_restart_over_a_stream():
    case = CASES / "filter_changed_stream"
    out = CliRunner().invoke(main, ["check", str(case / "old.json"), str(case / "new.json")])
    assert out.exit_code == 0
    assert "or stop and run" in out.output and "changelog-restart-shadowed" not in out.output
