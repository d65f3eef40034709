"""Findings on a plan imported from a PySpark job point at the Python lines of its
DataFrame calls (``x-origin``, ``compat.origins``), in every report format; the origins
change no verdict and no signature, and the serde keeps them.

The plans here are fake imports: a fixture plan whose nodes carry the ``x-origin`` keys
the importer writes, loaded under a ``.py`` name (no Spark needed).
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from compat import loaders
from compat.check import check_plans
from compat.errors import JobError
from compat.fleet.signature import signatures
from compat.gitcheck import Entry
from compat.gitcheck import render as render_many
from compat.infer import analyze
from compat.origins import origin_positions, relocate, with_origins
from compat.report import render
from compat.schema_check import load_schema
from compat.serde import from_doc, to_doc
from migrate.cli import main

ROOT = Path(__file__).resolve().parents[1]
CASE = ROOT / "fixtures" / "upgrades" / "ship_load_capacity_rule_changed"
#: the line of each node's DataFrame call in the fake job (the filter is the change)
LINES = {"packages": 12, "ships": 20, "with_capacity": 27, "load": 31, "over_capacity": 35,
         "alerts": 41}


def _doc(side: str, origins: dict[str, dict] | None = None) -> dict:
    doc = json.loads((CASE / f"{side}.json").read_text())
    for n in doc["nodes"]:
        if origins is None:
            n["x-origin"] = {"file": "ship_load.py", "line": LINES[n["id"]], "column": 9}
        elif n["id"] in origins:
            n["x-origin"] = origins[n["id"]]
    return doc


def _job(side: str, file: str = "jobs/ship_load.py", **kw) -> object:
    plan = from_doc(_doc(side, **kw), file)
    analyze(plan)
    return with_origins(plan)


def _report(old_file: str = "jobs/ship_load.py", **kw):
    return check_plans(_job("old", old_file, **kw), _job("new", **kw))


def test_the_serde_keeps_an_origin_and_nothing_else_sees_it():
    doc = _doc("new")
    plan = from_doc(copy.deepcopy(doc), "jobs/ship_load.py")
    assert [n["x-origin"] for n in to_doc(plan)["nodes"]] == \
        [n["x-origin"] for n in doc["nodes"]]
    bare = from_doc(json.loads((CASE / "new.json").read_text()), "new.json")
    analyze(plan)
    analyze(bare)
    assert signatures(plan) == signatures(bare)
    assert [n.canonical() for n in plan.nodes.values()] == \
        [n.canonical() for n in bare.nodes.values()]
    report = check_plans(bare, plan)
    assert (report.verdict, report.findings) == ("identical", [])


def test_origins_change_no_verdict():
    plain = check_plans(from_doc(_doc("old", {}), "old.json"),
                        from_doc(_doc("new", {}), "new.json"))
    with_lines = _report()
    assert with_lines.verdict == plain.verdict == "in_place"
    assert [(f.code, f.effect, f.message) for f in with_lines.findings] == \
        [(f.code, f.effect, f.message) for f in plain.findings]


def test_text_names_the_python_line_of_the_changed_call():
    out = render(_report(), "text")
    assert "[filter-changed]" in out
    assert "at old over_capacity (jobs/ship_load.py:35:9); " \
           "new over_capacity (jobs/ship_load.py:35:9)" in out, out
    assert "/nodes/" not in out  # no JSON pointer into a document nobody wrote


def test_json_carries_line_and_column():
    doc = json.loads(render(_report(), "json"))
    (f,) = [f for f in doc["findings"] if f["code"] == "filter-changed"]
    assert (f["new"]["line"], f["new"]["column"]) == (35, 9)
    assert "file" not in f["new"]  # the job file itself: the report's new.file
    assert doc["new"]["file"] == "jobs/ship_load.py"


def test_github_annotation_has_file_and_line():
    out = render(_report(), "github")
    (ann,) = [ln for ln in out.splitlines() if "filter-changed" in ln]
    assert ann.startswith("::notice file=jobs/ship_load.py,line=35,col=9,"), ann


def test_sarif_region_is_the_call():
    doc = json.loads(render(_report(), "sarif"))
    (res,) = [r for r in doc["runs"][0]["results"] if r["ruleId"] == "filter-changed"]
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "jobs/ship_load.py"
    assert loc["region"] == {"startLine": 35, "startColumn": 9}
    old = res["relatedLocations"][0]["physicalLocation"]
    assert old["region"]["startLine"] == 35


def test_a_call_in_a_helper_module_names_that_module():
    helper = {"over_capacity": {"file": "common/rules.py", "line": 7, "column": 5}}
    report = check_plans(_job("old", origins=helper), _job("new", origins=helper))
    ann = [ln for ln in render(report, "github").splitlines() if "filter-changed" in ln]
    assert ann[0].startswith("::notice file=jobs/common/rules.py,line=7,col=5,"), ann
    doc = json.loads(render(report, "json"))
    jsonschema.validate(doc, load_schema("report.v1.json"))
    (f,) = [f for f in doc["findings"] if f["code"] == "filter-changed"]
    assert (f["new"]["file"], f["new"]["line"]) == ("jobs/common/rules.py", 7)
    sarif = json.loads(render(report, "sarif"))["runs"][0]["results"]
    assert sarif[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        "jobs/common/rules.py"


def test_a_node_without_origin_gives_the_file_without_a_line():
    report = check_plans(_job("old", origins={}), _job("new", origins={}))
    plan = report.new
    assert plan.positions == {}
    ann = [ln for ln in render(report, "github").splitlines() if "filter-changed" in ln]
    assert ann[0].startswith("::notice file=jobs/ship_load.py,title="), ann
    assert "(jobs/ship_load.py)" in render(report, "text")


@pytest.mark.parametrize("bad", [None, "x", {"file": "a.py"}, {"file": "", "line": 3},
                                 {"file": "a.py", "line": 0}, {"file": "a.py", "line": True},
                                 {"file": "a.py", "line": 3, "column": "1"}])
def test_a_malformed_origin_is_ignored(bad):
    plan = from_doc(_doc("new", {"over_capacity": bad}), "jobs/ship_load.py")
    assert origin_positions(plan) == {}


def test_the_old_side_at_a_ref_is_shown_as_ref_path():
    """``check --against``: the old job is imported from a temporary checkout; its findings
    name ``REF:path``, never the checkout."""
    tree = "/tmp/theseus-ref-x1/tree"
    helper = {"over_capacity": {"file": "common/rules.py", "line": 7, "column": 5},
              "alerts": {"file": "ship_load.py", "line": 41, "column": 9}}
    old = relocate(_job("old", f"{tree}/jobs/ship_load.py", origins=helper),
                   "HEAD:jobs/ship_load.py", tree, "HEAD:")
    new = _job("new", origins=helper)
    new = check_plans(old, new)
    text = render(new, "text")
    assert "old over_capacity (HEAD:jobs/common/rules.py:7:5)" in text, text
    assert "theseus-ref" not in text
    assert "old: HEAD:jobs/ship_load.py" in text
    sarif = json.loads(render(new, "sarif"))["runs"][0]["results"][0]
    assert sarif["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        "HEAD:jobs/common/rules.py"


def test_a_finding_only_on_the_old_side_points_at_the_ref():
    """A removed step is about the old plan alone: under --against its annotation names
    the old job at the ref."""
    tree = "/tmp/theseus-ref-x2/tree"
    old_doc = _doc("old")
    new_doc = _doc("new")
    # the new job drops the filter: the sink reads the aggregate directly
    new_doc["nodes"] = [n for n in new_doc["nodes"] if n["id"] != "over_capacity"]
    new_doc["nodes"][-1]["inputs"] = ["load"]
    old = from_doc(old_doc, f"{tree}/jobs/ship_load.py")
    analyze(old)
    old = relocate(with_origins(old), "HEAD:jobs/ship_load.py", tree, "HEAD:")
    new = from_doc(new_doc, "jobs/ship_load.py")
    analyze(new)
    report = check_plans(old, with_origins(new))
    entry = Entry("jobs/ship_load.py", report.verdict, report)
    out = render_many([entry], "HEAD", "github")
    removed = [ln for ln in out.splitlines() if "over_capacity" in ln and "file=" in ln]
    assert removed and all("file=HEAD:jobs/ship_load.py,line=35," in ln for ln in removed), out


# -- check --against over job files (read by a fake loader: the file holds its plan) -----------


def _fake_job(doc: dict, raises: bool = False) -> str:
    return ("def build(spark):  # df.writeStream...\n    pass\n"
            + ("# RAISE\n" if raises else "") + "# PLAN " + json.dumps(doc) + "\n")


def _fake_loader(path: str, raw: bytes | None = None):
    text = Path(path).read_text()
    if "# RAISE" in text:
        raise JobError("build(spark) raised: ValueError: boom", file=path, line=2)
    doc = json.loads(text.split("# PLAN ", 1)[1])
    plan = from_doc(doc, path)
    analyze(plan)
    return with_origins(plan)


def test_against_names_the_old_job_at_the_ref(tmp_path, monkeypatch):
    monkeypatch.setattr(loaders, "_JOB_LOADERS", [_fake_loader])
    repo = tmp_path / "repo"
    (repo / "jobs").mkdir(parents=True)
    job = repo / "jobs" / "ship_load.py"
    job.write_text(_fake_job(_doc("old")))
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "v1"]):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
                       cwd=repo, check=True, capture_output=True)
    moved = {**{k: {"file": "ship_load.py", "line": v, "column": 9}
                for k, v in LINES.items()},
             "over_capacity": {"file": "ship_load.py", "line": 38, "column": 9}}
    job.write_text(_fake_job(_doc("new", moved)))
    monkeypatch.chdir(repo)
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "jobs"])
    assert r.exit_code == 0, r.output
    assert "old over_capacity (HEAD:jobs/ship_load.py:35:9); " \
           "new over_capacity (jobs/ship_load.py:38:9)" in r.output, r.output
    assert "theseus-ref-" not in r.output
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "jobs", "--format", "github"])
    (ann,) = [ln for ln in r.output.splitlines() if "filter-changed" in ln]
    assert ann.startswith("::notice file=jobs/ship_load.py,line=38,col=9,"), ann

    # an old job that does not import is named at the ref as well
    job.write_text(_fake_job(_doc("old"), raises=True))
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam",
                    "v2"], cwd=repo, check=True, capture_output=True)
    job.write_text(_fake_job(_doc("new")))
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "jobs"])
    assert r.exit_code == 2, r.output
    assert "HEAD:jobs/ship_load.py:2: build(spark) raised" in r.output, r.output
    assert "theseus-ref-" not in r.output
