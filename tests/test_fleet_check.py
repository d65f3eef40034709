"""``theseus fleet check``: golden fleet changes (``fixtures/fleets/<case>/{old,new}/`` with
``expect.json``), the report in every format, ``--against``, and properties: a fleet
checked against itself is identical, and renaming node ids anywhere changes nothing."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat.fleet.check import check_dirs, check_fleets
from compat.fleet.graph import load_fleet, load_fleet_files
from compat.schema_check import load_schema
from migrate.cli import main
from tests.conftest import FIXTURES, ROOT

CASES = sorted(p for p in (FIXTURES / "fleets").iterdir() if (p / "expect.json").exists())
EXIT = {"identical": 0, "in_place": 0, "migrate": 1, "unsupported": 3}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _args(case: Path) -> list[str]:
    expect = json.loads((case / "expect.json").read_text())
    args = ["fleet", "check", str(case / "old"), str(case / "new")]
    if expect.get("require"):
        args += ["--require", ",".join(expect["require"])]
    return args


def test_there_are_enough_cases():
    names = {c.name for c in CASES}
    assert len(CASES) >= 8
    assert {"column_added_upstream", "column_removed_one_reader", "sink_key_changed",
            "mode_widened_insert_only_consumer", "producer_removed", "migration_cascades",
            "shared_subplan", "query_cycle"} <= names


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_fleet_case(case):
    expect = json.loads((case / "expect.json").read_text())
    r = run(*_args(case), "--format", "json")
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    doc = json.loads(r.output)
    jsonschema.validate(doc, load_schema("fleet-report.v1.json"))
    got = {q["query"]: {"status": q["status"], "verdict": q["verdict"],
                        "codes": sorted({f["code"] for f in q["findings"]}),
                        "caused_by": q["caused_by"]} for q in doc["queries"]}
    assert got == expect["queries"]
    assert [q["query"] for q in doc["queries"]] == expect["order"]
    assert [q["order"] for q in doc["queries"]] == list(range(len(doc["queries"])))
    assert doc["waves"] == expect["waves"] and doc["cycles"] == expect["cycles"]
    assert doc["verdict"] == expect["verdict"]
    assert r.exit_code == doc["exit_code"] == expect["exit_code"] == EXIT[doc["verdict"]]
    for q in doc["queries"]:
        # a query's verdict is the worst of its findings; every finding points somewhere
        assert q["verdict"] == max((f["effect"] for f in q["findings"]), default="none",
                                   key=["none", "in_place", "migrate",
                                        "unsupported"].index).replace("none", "identical")
        for f in q["findings"]:
            assert f["new"]["pointer"] is not None or f["old"]["pointer"] is not None, f
            if f["code"].startswith("upstream-"):
                assert f["new"]["node"] and f["new"]["pointer"].startswith("/nodes/")


@pytest.mark.parametrize("fmt", ["text", "markdown", "sarif", "github"])
@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_fleet_case_renders(case, fmt):
    r = run(*_args(case), "--format", fmt)
    assert r.exit_code in (0, 1, 3), r.output
    expect = json.loads((case / "expect.json").read_text())
    if fmt == "sarif":
        schema = load_schema("sarif-2.1.0.json")
        doc = json.loads(r.output)
        assert not [e.message for e in
                    jsonschema.validators.validator_for(schema)(schema).iter_errors(doc)]
        assert doc["runs"][0]["properties"]["verdict"] == expect["verdict"]
    elif fmt == "text":
        assert r.output.startswith(f"fleet verdict: {expect['verdict']}")
    for name, q in expect["queries"].items():
        for code in q["codes"]:
            assert code in r.output, (name, code)


def test_text_names_waves_cycles_and_causes():
    out = run(*_args(FIXTURES / "fleets" / "migration_cascades")).output
    assert "migration waves (upstream first): 1. enrich; 2. region_totals; 3. region_rank" \
        in out
    assert "== region_rank (unchanged, region_rank.json): migrate, caused by enrich, " \
        "region_totals, migration wave 3" in out
    out = run(*_args(FIXTURES / "fleets" / "query_cycle")).output
    assert "cycle: enrich -> retry -> enrich" in out


def test_backfill_migrates_stateless_readers_too():
    case = FIXTURES / "fleets" / "migration_cascades"
    rep = check_dirs([str(case / "old"), str(case / "new")], require=["backfill"])
    by = rep.by_name()
    assert by["big_orders"].verdict == by["payments_enriched"].verdict == "migrate"
    assert rep.waves == [["enrich"], ["big_orders", "payments_enriched", "region_totals"],
                         ["region_rank"]]


def test_allow_migration_passes_the_gate():
    case = FIXTURES / "fleets" / "migration_cascades"
    r = run(*_args(case), "--allow-migration", "--format", "json")
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["verdict"] == "migrate" and doc["exit_code"] == 0
    sev = {f["severity"] for q in doc["queries"] for f in q["findings"]
           if f["effect"] == "migrate"}
    assert sev == {"warning"}


def test_output_read_by_the_fleet_is_judged_by_its_readers_only():
    # enrich stops writing region: its own check would say output-column-removed
    # (unsupported under forward), but its readers are in the fleet and judge it.
    case = FIXTURES / "fleets" / "column_removed_one_reader"
    rep = check_dirs([str(case / "old"), str(case / "new")], require=["cascading"])
    enrich = rep.by_name()["enrich"]
    assert enrich.verdict == "in_place"
    assert not [f for f in enrich.findings if f.code.startswith("output-")]


def test_external_output_keeps_schema_compat(tmp_path):
    # region_totals' output is read by nobody in the fleet: --schema-compat applies.
    case = FIXTURES / "fleets" / "column_added_upstream"
    for side in ("old", "new"):
        shutil.copytree(case / "old", tmp_path / side)
    doc = json.loads((tmp_path / "new" / "region_totals.json").read_text())
    doc["nodes"][1]["aggregates"].append({"name": "n", "function": "count", "args": ["1"]})
    (tmp_path / "new" / "region_totals.json").write_text(json.dumps(doc))
    rep = check_dirs([str(tmp_path / "old"), str(tmp_path / "new")],
                     schema_compat="backward")
    codes = {f.code for f in rep.by_name()["region_totals"].findings}
    assert "output-column-added" in codes


def test_invalid_fleet_exits_2(tmp_path):
    case = FIXTURES / "fleets" / "column_added_upstream"
    shutil.copytree(case / "old", tmp_path / "old")
    shutil.copytree(case / "old", tmp_path / "new")
    doc = json.loads((tmp_path / "new" / "big_orders.json").read_text())
    doc["nodes"][-1]["topic"] = "region_totals"
    (tmp_path / "new" / "big_orders.json").write_text(json.dumps(doc))
    r = run("fleet", "check", tmp_path / "old", tmp_path / "new")
    assert r.exit_code == 2 and "two queries write the topic 'region_totals'" in r.output
    r = run("fleet", "check", tmp_path / "old")
    assert r.exit_code == 2 and "two folders" in r.output


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_against_a_git_ref(tmp_path, monkeypatch):
    case = FIXTURES / "fleets" / "migration_cascades"
    repo = tmp_path / "repo"
    shutil.copytree(case / "old", repo / "fleet")
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    shutil.copy(case / "new" / "enrich.json", repo / "fleet" / "enrich.json")
    monkeypatch.chdir(repo)
    r = run("fleet", "check", "--against", "HEAD", "fleet", "--format", "json")
    doc = json.loads(r.output)
    assert r.exit_code == 1 and doc["old"] == "HEAD:fleet"
    assert doc["waves"] == [["enrich"], ["region_totals"], ["region_rank"]]


def test_fleet_check_stays_off_the_check_path():
    code = ("import sys, migrate.cli, compat.check, compat.report, compat.fleet.check, "
            "compat.fleet.report; assert 'networkx' not in sys.modules, 'networkx'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# -- properties --------------------------------------------------------------------------


def _docs(folder: Path) -> dict[str, dict]:
    return {p.relative_to(folder).as_posix(): json.loads(p.read_text())
            for p in sorted(folder.rglob("*.json"))}


def _rename(docs: dict[str, dict], rnd: random.Random) -> dict[str, bytes]:
    """Every node id of every plan renamed (inputs follow); JSON written in another
    layout.  The fixtures' joins have no condition and no right column renamed after
    its input's id, so ids mean nothing but the graph there."""
    out = {}
    for path, doc in docs.items():
        doc = json.loads(json.dumps(doc))
        ids = [n["id"] for n in doc["nodes"]]
        fresh = rnd.sample(range(10_000), len(ids))
        new = {i: (f"n{f}" if rnd.random() < 0.8 else i) for i, f in zip(ids, fresh)}
        for n in doc["nodes"]:
            assert not n.get("condition") and not n.get("time_bound")
            n["id"] = new[n["id"]]
            if "inputs" in n:
                n["inputs"] = [new[i] for i in n["inputs"]]
        rnd.shuffle(doc["nodes"])
        out[path] = json.dumps(doc, indent=rnd.choice([None, 1, 4])).encode()
    return out


def _summary(rep) -> dict:
    return {"verdict": rep.verdict, "waves": rep.waves, "cycles": rep.cycles,
            "queries": {q.query: (q.status, q.verdict, sorted(f.code for f in q.findings),
                                  q.caused_by) for q in rep.queries}}


def _json_cases():
    return [c for c in CASES if not list(c.rglob("*.sql"))]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), side=st.sampled_from(["old", "new"]),
       seed=st.integers(0, 2**32 - 1))
def test_a_fleet_of_unchanged_queries_is_identical(case, side, seed):
    folder = case / side
    fleet = load_fleet(str(folder))
    rep = check_fleets(fleet, load_fleet(str(folder)))
    assert rep.verdict == "identical" and rep.exit_code == 0
    assert all(q.status == "unchanged" and not q.findings for q in rep.queries)
    renamed = load_fleet_files("renamed", _rename(_docs(folder), random.Random(seed)))
    rep = check_fleets(fleet, renamed)
    assert rep.verdict == "identical"
    assert all(q.status == "unchanged" for q in rep.queries)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(_json_cases()), seed=st.integers(0, 2**32 - 1))
def test_renaming_node_ids_anywhere_changes_nothing(case, seed):
    expect = json.loads((case / "expect.json").read_text())
    require = expect.get("require")
    base = check_fleets(load_fleet(str(case / "old")), load_fleet(str(case / "new")),
                        require=require)
    rnd = random.Random(seed)
    old = load_fleet_files("old", _rename(_docs(case / "old"), rnd))
    new = load_fleet_files("new", _rename(_docs(case / "new"), rnd))
    assert _summary(check_fleets(old, new, require=require)) == _summary(base)
