"""CI output sized for people: ``check --against`` starts with a one-line summary and lists
only the plans that changed; the Markdown comment is one table with details folded; SARIF
names the project's own URL; one legend explains the marks of ``plan show`` and ``--help``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib

import jsonschema
import pytest
from click.testing import CliRunner

from compat.legend import LEGEND
from compat.schema_check import load_schema
from migrate.cli import main
from tests.conftest import ROOT, UPGRADES

CASE = {c.name: c for c in UPGRADES}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """Seven plans: two identical, one in place, one migrate, one unsupported, one new, one
    removed."""
    repo = tmp_path / "repo"
    plans = repo / "plans"
    plans.mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    for name, case in (("agg.json", "group_by_key_changed"), ("filt.sql", "filter_changed_stream"),
                       ("key.json", "sink_key_changed"), ("same1.json", "identical_same_plan"),
                       ("same2.sql", "source_topic_changed"), ("gone.json", "sink_topic_changed")):
        suffix = name.rsplit(".", 1)[1]
        shutil.copy(CASE[case] / f"old.{suffix}", plans / name)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    for name, case in (("agg.json", "group_by_key_changed"), ("filt.sql", "filter_changed_stream"),
                       ("key.json", "sink_key_changed")):
        suffix = name.rsplit(".", 1)[1]
        shutil.copy(CASE[case] / f"new.{suffix}", plans / name)
    shutil.copy(CASE["source_topic_changed"] / "new.sql", plans / "added.sql")
    (plans / "gone.json").unlink()
    monkeypatch.chdir(repo)
    return repo


SUMMARY = ("7 plans against HEAD: 2 identical, 1 in place, 1 migrate, 1 unsupported, 1 new, "
           "1 removed, 0 invalid")


def test_text_starts_with_the_summary_and_lists_only_changed_plans(repo):
    r = run("check", "--against", "HEAD", "plans")
    assert r.exit_code == 3
    lines = r.output.splitlines()
    assert lines[0] == SUMMARY
    listed = re.findall(r"^== (\S+) \((\w+)\)", r.output, re.M)
    assert sorted(listed) == sorted([
        ("plans/agg.json", "migrate"), ("plans/filt.sql", "in_place"),
        ("plans/key.json", "unsupported"), ("plans/added.sql", "new"),
        ("plans/gone.json", "removed")])
    assert "same1.json" not in r.output and "same2.sql" not in r.output
    assert "verdict: unsupported" in r.output  # each changed plan keeps its full report


def test_markdown_is_one_table_with_details_folded(repo):
    r = run("check", "--against", "HEAD", "plans", "--format", "markdown")
    md = r.output
    assert SUMMARY in md
    assert len(re.findall(r"^\|---", md, re.M)) == 1  # one table
    rows = re.findall(r"^\| `([^`]+)` \| \S+ (\w+)[^|]* \| ([^|]+) \|$", md, re.M)
    assert [(p, o) for p, o, _ in rows] == [
        ("plans/added.sql", "new"), ("plans/agg.json", "migrate"),
        ("plans/filt.sql", "in_place"), ("plans/key.json", "unsupported"),
        ("plans/gone.json", "removed")]
    findings = {p: n.strip() for p, _, n in rows}
    assert findings["plans/agg.json"] == "1" and findings["plans/added.sql"] == "—"
    details = re.findall(r"<details><summary><code>(\S+)</code>: (\w+), (\d+) findings?"
                         r"</summary>\n\n(.*?)\n\n</details>", md, re.S)
    assert {d[0] for d in details} == {"plans/agg.json", "plans/filt.sql", "plans/key.json"}
    agg = next(d for d in details if d[0] == "plans/agg.json")
    assert "`aggregate-key-changed`" in agg[3] and "*What to do:*" in agg[3]
    filt = next(d for d in details if d[0] == "plans/filt.sql")
    assert re.search(r"at \w+ \(plans/filt\.sql:\d+:\d+\)", filt[3])  # SQL position
    assert "same1.json" not in md


def test_markdown_when_nothing_changed(repo):
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "all")
    r = run("check", "--against", "HEAD", "plans", "--format", "markdown")
    assert r.exit_code == 0
    assert "6 plans against HEAD: 6 identical" in r.output and "No plan changed." in r.output
    assert "|---" not in r.output


def test_github_leads_with_the_summary_and_skips_identical_plans(repo):
    r = run("check", "--against", "HEAD", "plans", "--format", "github")
    lines = r.output.splitlines()
    assert lines[0] == f"::notice title=theseus::{SUMMARY}"
    assert "same1.json" not in r.output and "same2.sql" not in r.output
    assert "::error file=plans/key.json,line=" in r.output
    assert re.search(r"::notice file=plans/filt\.sql,line=\d+,col=\d+,title=theseus "
                     r"filter-changed", r.output)


def project_homepage():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Homepage"]


def test_sarif_names_the_project_url_from_pyproject(repo):
    url = project_homepage()
    assert url.startswith("https://github.com/") and "theseus.dev" not in url
    schema = load_schema("sarif-2.1.0.json")
    validator = jsonschema.validators.validator_for(schema)(schema)
    single = json.loads(run("check", CASE["group_by_key_changed"] / "old.json",
                            CASE["group_by_key_changed"] / "new.json", "--format",
                            "sarif").output)
    multi = json.loads(run("check", "--against", "HEAD", "plans", "--format", "sarif").output)
    for doc in (single, multi):
        assert doc["runs"][0]["tool"]["driver"]["informationUri"] == url
        assert not [e.message for e in validator.iter_errors(doc)]
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in multi["runs"][0]["results"]} == {"plans/agg.json", "plans/filt.sql",
                                                      "plans/key.json", "plans/gone.json"}


def test_project_url_comes_from_metadata_when_there_is_no_checkout(tmp_path, monkeypatch):
    import importlib.metadata

    from compat import report

    assert report._url_from_pyproject(tmp_path / "pyproject.toml") is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n'
                                             '[project.urls]\nHomepage = "https://x.org"\n')
    assert report._url_from_pyproject(tmp_path / "pyproject.toml") is None  # not ours

    class Meta:
        def get_all(self, name):
            assert name == "Project-URL"
            return ["Issues, https://example.org/t/issues", "repository, https://example.org/t"]

    monkeypatch.setattr(importlib.metadata, "metadata", lambda dist: Meta())
    assert report._url_from_metadata() == "https://example.org/t"


def test_one_legend_in_plan_show_and_check_help():
    show = run("plan", "show", ROOT / "fixtures" / "plans" / "ship_load.json").output
    assert show.endswith(LEGEND)
    help_text = run("check", "--help").output
    for line in LEGEND.splitlines():
        assert "  " + line in help_text  # click indents the help, and keeps the lines


def test_the_legend_names_every_step_class_and_changelog_mode():
    import compat.steps  # noqa: F401  (fills the registry)
    from compat.infer import INSERT, RETRACT, UPSERT
    from compat.model import ENFORCING, PASSIVE, STEPS

    def listed(klass):
        m = re.search(rf"^  {klass}\s.*?\((.*?)\)", LEGEND, re.M | re.S)
        return {s.strip() for s in re.sub(r"\s+", " ", m.group(1)).split(",")}

    user_steps = {n: c for n, c in STEPS.items() if not n.endswith("_gate")}
    assert listed(ENFORCING) == {n for n, c in user_steps.items() if c.klass == ENFORCING}
    assert listed(PASSIVE) == {n for n, c in user_steps.items() if c.klass == PASSIVE}
    for mode in (INSERT, UPSERT, RETRACT):
        assert re.search(rf"^  \[{re.escape(mode)}\] ", LEGEND, re.M)
