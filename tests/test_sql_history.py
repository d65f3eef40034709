"""Plan history: today's compilation of every case equals its latest frozen plan, and
`theseus plan freeze` records a new version exactly when compilation changes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from compat.sql.history import HistoryError, cases, compile_case, freeze, status, versions
from migrate.cli import main

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "fixtures" / "history"


@pytest.mark.parametrize("case", cases(HISTORY), ids=lambda p: p.name)
def test_sql_today_compiles_to_the_latest_frozen_plan(case):
    latest = versions(case)[-1]
    assert compile_case(case) == (latest / "plan.json").read_text(encoding="utf-8"), (
        f"{case.name}: compiling {latest.name}/query.sql today gives a different plan: "
        "run `theseus plan freeze` to record a new version")
    spec = json.loads((latest / "spec.json").read_text())
    assert spec["version"] == int(latest.name[1:])


def test_history_covers_the_step_types():
    steps = {n["step"] for c in cases(HISTORY) for v in versions(c)
             for n in json.loads((v / "plan.json").read_text())["nodes"]}
    assert {"source", "filter", "project", "aggregate", "join", "deduplicate", "top_n",
            "union", "explode", "recursive", "sink"} <= steps


@pytest.fixture
def case(tmp_path):
    dst = tmp_path / "history" / "ship_load"
    shutil.copytree(HISTORY / "ship_load" / "v1", dst / "v1")
    return dst


def test_freeze_records_a_version_only_when_compilation_changes(case):
    assert status(case).status == "unchanged"
    assert freeze(case).status == "unchanged" and [v.name for v in versions(case)] == ["v1"]
    sql = (case / "v1" / "query.sql").read_text()
    (case / "query.sql").write_text(sql.replace("* 0.9", "* 0.8"))  # a draft
    assert status(case).status == "would change"
    assert freeze(case, check=True).status == "would change"
    assert [v.name for v in versions(case)] == ["v1"]  # --check writes nothing
    out = freeze(case)
    assert (out.status, out.version) == ("new version", "v2")
    assert not (case / "query.sql").exists()  # the draft became v2
    v2 = case / "v2"
    assert "* 0.8" in json.loads((v2 / "plan.json").read_text())["nodes"][4]["predicate"]
    assert (v2 / "input.json").read_bytes() == (case / "v1" / "input.json").read_bytes()
    assert (case / "v1" / "plan.json").read_text() != (v2 / "plan.json").read_text()
    assert status(case).status == "unchanged"


def test_a_plan_compiled_differently_today_needs_freezing(case):
    plan = case / "v1" / "plan.json"
    doc = json.loads(plan.read_text())
    doc["metadata"]["compiler"] = "theseus-sql/0"  # as if an older compiler wrote it
    plan.write_text(json.dumps(doc, indent=2) + "\n")
    r = CliRunner().invoke(main, ["plan", "freeze", "--check", "--history",
                                  str(case.parent)])
    assert r.exit_code == 1
    assert "ship_load: would change (v1): compiling its SQL today gives a different plan" \
        in r.output
    r = CliRunner().invoke(main, ["plan", "freeze", "--history", str(case.parent)])
    assert r.exit_code == 0, r.output
    assert "ship_load: new version (v2)" in r.output
    r = CliRunner().invoke(main, ["plan", "freeze", "--check", "--history",
                                  str(case.parent)])
    assert r.exit_code == 0 and "unchanged (v2)" in r.output


def test_an_incomplete_case_is_one_clear_error(tmp_path):
    c = tmp_path / "history" / "empty"
    c.mkdir(parents=True)
    (c / "query.sql").write_text("SELECT 1")
    with pytest.raises(HistoryError, match="incomplete"):
        freeze(c)
    r = CliRunner().invoke(main, ["plan", "freeze", "--history", str(c.parent)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "no input.json, expected.json" in r.output
