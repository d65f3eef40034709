"""SQL equivalents of the golden upgrade cases.

For every ``fixtures/upgrades/<case>/`` that has a faithful SQL equivalent, ``old.sql`` and
``new.sql`` sit next to the hand-written plans.  Both are compiled, written to files and
checked exactly as hand-written plans are (``compat.check.check_files``); the verdict must be
the hand-written pair's.

Finding codes must match too, except where the compiler writes the same query with different
steps; each such difference is listed in ``CODE_DIFFERENCES`` with the reason.  Cases without
a SQL equivalent: ``recursive_*`` (a recursive step has no SQL here) and
``transparent_stream_source_version_bump`` (SQL has no step versions).
"""

from __future__ import annotations

import json

import pytest

from compat.check import check_files, parse_require
from compat.sql import compile_sql, dumps
from tests.conftest import UPGRADES

SQL_CASES = [c for c in UPGRADES if (c / "old.sql").exists()]

ADDED = "source-column-added"  # a query reading a new column declares it (prune_columns)
REMOVED = "source-column-removed"

#: case -> (codes only the compiled pair has, codes only the hand-written pair has)
CODE_DIFFERENCES: dict[str, tuple[set[str], set[str]]] = {
    # A second WHERE conjunct is the same filter step, not a new one.
    "filter_added_stream": ({"filter-changed"}, {"passive-added"}),
    "filter_added_before_aggregate": ({"filter-changed", ADDED}, {"passive-added"}),
    # WHERE c.tier = 'gold' already sits on the table side (predicate_pushdown), so the new
    # conjunct changes that filter.
    "filter_added_table_side_join": ({"filter-changed"}, {"passive-added"}),
    "filter_changed_before_aggregate": ({ADDED}, set()),
    "filter_changed_before_aggregate_backfill": ({ADDED}, set()),
    # The filter on c.tier may not move into the null-padded side of a LEFT JOIN: it moves
    # from below the join to above it.
    "join_stream_table_type_changed": ({"passive-added", "passive-removed"}, set()),
    # the new ON clause reads c.country
    "join_stream_table_condition_changed_before_aggregate": ({ADDED}, set()),
    "join_stream_table_condition_changed_before_aggregate_backfill": ({ADDED}, set()),
    "project_column_added_backward": ({ADDED}, set()),
    "project_column_added_end": ({ADDED}, set()),
    "project_column_added_middle": ({ADDED}, set()),
    "project_column_removed": ({REMOVED}, set()),
    "project_column_removed_schema_compat_none": ({REMOVED}, set()),
    "stateful_dedup_added_before_aggregate": ({ADDED}, set()),  # order_id: the dedup key
    # the hand-written plans declare currency all along
    "join_stream_stream_column_newly_read": ({ADDED}, set()),
}


def test_there_are_enough_sql_cases():
    assert len(SQL_CASES) >= 15
    assert set(CODE_DIFFERENCES) <= {c.name for c in SQL_CASES}


def compiled_report(case, tmp_path, expect):
    paths = []
    for side in ("old", "new"):
        sql = case / f"{side}.sql"
        out = tmp_path / f"{side}.json"
        out.write_text(dumps(compile_sql(sql.read_text(), str(sql))))
        paths.append(str(out))
    return check_files(*paths, require=parse_require(expect.get("require")),
                       schema_compat=expect.get("schema_compat", "forward"))


@pytest.mark.parametrize("case", SQL_CASES, ids=lambda p: p.name)
def test_compiled_pair_has_the_hand_written_verdict(case, tmp_path):
    expect = json.loads((case / "expect.json").read_text())
    report = compiled_report(case, tmp_path, expect)
    assert report.verdict == expect["verdict"], [f.message for f in report.findings]
    codes = {f.code for f in report.findings}
    hand = set(expect["codes"])
    assert (codes - hand, hand - codes) == CODE_DIFFERENCES.get(case.name, (set(), set()))


@pytest.mark.parametrize("case", SQL_CASES[:1], ids=lambda p: p.name)
def test_sql_fixtures_go_through_the_cli(case, tmp_path):
    from click.testing import CliRunner

    from migrate.cli import main

    runner = CliRunner()
    for side in ("old", "new"):
        r = runner.invoke(main, ["plan", "compile", str(case / f"{side}.sql"), "-o",
                                 str(tmp_path / f"{side}.json")])
        assert r.exit_code == 0, r.output
        assert r.output == ""
    r = runner.invoke(main, ["check", str(tmp_path / "old.json"), str(tmp_path / "new.json"),
                             "--format", "json"])
    expect = json.loads((case / "expect.json").read_text())
    assert json.loads(r.output)["verdict"] == expect["verdict"]
