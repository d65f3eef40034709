"""The step versions whose changelog operators are PySpark's row-based ``transformWithState``
(source 3, aggregate 2, join 2): where they are accepted, what a move to them is judged,
and which operator the builder picks for each version."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from compat.check import check_plans, load_plan
from compat.steps.source import CHANGELOG, table_read
from migrate.build import changelog
from migrate.cli import main
from tests.conftest import FIXTURES

CASES = FIXTURES / "upgrades"
ROWS = {"source": 3, "aggregate": 2, "join": 2}


def doc(case: str) -> dict:
    return json.loads((CASES / case / "old.json").read_text())


def rows(d: dict, steps=tuple(ROWS)) -> dict:
    d = json.loads(json.dumps(d))
    for n in d["nodes"]:
        if n["step"] in steps:
            n["version"] = ROWS[n["step"]]
    return d


def refused(write_plan, d: dict, *needles: str) -> None:
    result = CliRunner().invoke(main, ["check", write_plan(d), write_plan(d)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for n in needles:
        assert n in result.output, (n, result.output)


def check(write_plan, old: dict, new: dict):
    return check_plans(load_plan(write_plan(old)), load_plan(write_plan(new)))


@pytest.mark.parametrize("case", ["table_aggregate_function_added",
                                  "table_table_join_type_changed"])
def test_a_plan_on_the_new_versions_reads_its_tables_as_changelogs(write_plan, case):
    plan = load_plan(write_plan(rows(doc(case))))
    sources = [n for n in plan.nodes.values() if n.step == "source"]
    assert sources and all(n.version == 3 and table_read(n) == CHANGELOG for n in sources)
    stateful = [n for n in plan.nodes.values() if n.step in ("aggregate", "join")]
    assert stateful and all(n.version == 2 and plan.info[n.id].changelog for n in stateful)


def test_source_version_3_is_refused_on_a_stream_and_a_snapshot(write_plan):
    d = doc("table_source_version_bump_snapshot")  # a stream joined with a snapshot table
    i, stream = next((i, n) for i, n in enumerate(d["nodes"]) if n["role"] == "stream")
    stream["version"] = 3
    refused(write_plan, d, f"/nodes/{i}/version", "found version 3 on a stream")
    d = doc("table_source_version_bump_snapshot")
    d = json.loads((CASES / "table_source_version_bump_snapshot" / "new.json").read_text())
    i, table = next((i, n) for i, n in enumerate(d["nodes"]) if n.get("role") == "table")
    table["version"] = 3
    refused(write_plan, d, f"/nodes/{i}/version", "a table read as a snapshot")


def test_aggregate_and_join_version_2_are_refused_without_changelogs(write_plan):
    d = doc("join_stream_table_type_changed")
    i, j = next((i, n) for i, n in enumerate(d["nodes"]) if n["step"] == "join")
    j["version"] = 2
    refused(write_plan, d, f"/nodes/{i}/version", "only for a table-table join")
    d = json.loads((FIXTURES / "plans" / "ship_load.json").read_text())
    i, a = next((i, n) for i, n in enumerate(d["nodes"]) if n["step"] == "aggregate")
    a["version"] = 2
    refused(write_plan, d, f"/nodes/{i}/version", "over a table read as a changelog")


@pytest.mark.parametrize("case,steps", [
    ("table_aggregate_function_added", ("source", "aggregate")),
    ("table_aggregate_function_added", ("source",)),
    ("table_aggregate_function_added", ("aggregate",)),
    ("table_table_join_type_changed", ("source", "join")),
    ("table_table_join_type_changed", ("join",)),
])
def test_a_move_to_the_row_based_operators_is_a_migration(write_plan, case, steps):
    """Spark refuses a checkpoint whose operators' names differ
    (``STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA``, measured in
    ``tests/integration/test_checkpoint_tws.py``): never in place."""
    old = doc(case)
    report = check(write_plan, old, rows(old, steps))
    moved = {f.new_node for f in report.findings if f.code == "step-version-changed"}
    want = {n["id"] for n in old["nodes"] if n["step"] in steps}
    assert moved == want, report.findings
    assert all(f.effect == "migrate" for f in report.findings
               if f.code == "step-version-changed"), report.findings
    assert report.verdict == "migrate"


def test_the_same_new_version_plan_is_identical(write_plan):
    d = rows(doc("table_table_join_type_changed"))
    assert check(write_plan, d, d).verdict == "identical"


class _Grouped:
    def __init__(self) -> None:
        self.api = None

    def groupBy(self, key):  # noqa: N802
        return self

    def transformWithState(self, *args):  # noqa: N802
        self.api = "rows"
        return self

    def transformWithStateInPandas(self, *args):  # noqa: N802
        self.api = "pandas"
        return self

    def unionByName(self, other):  # noqa: N802
        return self


class _F:
    """The few ``pyspark.sql.functions`` the builder calls, recording nothing."""

    def __getattr__(self, name):
        return lambda *a, **k: _Col()


class _Col:
    def __getattr__(self, name):
        return lambda *a, **k: _Col()

    def __or__(self, other):
        return _Col()

    def __invert__(self):
        return _Col()


class _Df:
    def __init__(self, grouped: _Grouped) -> None:
        self.g = grouped
        self.columns = [changelog.KEY, changelog.SIDE, changelog.ROW, changelog.SIGN]
        self.selects = 0

    def where(self, *a):
        return self

    def select(self, *a):
        self.selects += 1
        return self

    def unionByName(self, other):  # noqa: N802
        return self

    def groupBy(self, key):  # noqa: N802
        return self.g.groupBy(key)


class _B:
    F = _F()


@pytest.mark.parametrize("rows_api,how,padded_apart", [
    (False, "left", True), (False, "inner", False), (True, "left", False),
    (True, "inner", False)])
def test_only_version_1_pads_a_left_joins_null_keys_apart(monkeypatch, rows_api, how,
                                                          padded_apart):
    """Version 1's left join reads the left input twice (the operator, and the null-key
    rows padded apart: a second normalisation of the left table); version 2 reads it once."""
    monkeypatch.setattr(changelog, "unpack", lambda b, df, c, n: df)
    reads = []

    class Left(_Df):
        def where(self, *a):
            reads.append("where")
            return self

    g = _Grouped()
    left, right = Left(g), _Df(g)
    out = [("id", "left", "id"), ("w", "right", "w")]
    changelog.join(_B(), left, right, ("id",), ("id",), how, out, ("id",), ("w",),
                   (("id", "string"), ("w", "string")), ("id", "w"), "join_x", rows_api)
    assert g.api == ("rows" if rows_api else "pandas")
    # the operator's side filters null keys out unless version 2 pads them (a left join)
    operator_filters = 0 if rows_api and how == "left" else 1
    assert len(reads) == operator_filters + padded_apart, reads
