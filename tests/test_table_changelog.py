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
