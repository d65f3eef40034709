"""SQL is a plan everywhere: ``check``, ``plan show``/``validate``/``diff`` and
``check --against`` read ``.sql`` files as they read JSON, and findings point at the SQL
line and column that wrote the step (text, JSON, GitHub annotations and SARIF)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import jsonschema
import pytest
from click.testing import CliRunner

from compat.check import check_files, parse_require
from compat.schema_check import load_schema
from migrate.cli import main
from tests.conftest import ROOT, UPGRADES

SQL_CASES = [c for c in UPGRADES if (c / "old.sql").exists()]
CASE = {c.name: c for c in UPGRADES}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def sql_pair(name):
    return str(CASE[name] / "old.sql"), str(CASE[name] / "new.sql")


def line_text(path, line):
    return open(path, encoding="utf-8").read().split("\n")[line - 1]


def key(f):
    return f.code, f.effect, f.message, f.old_node, f.new_node, f.old_pointer, f.new_pointer


@pytest.mark.parametrize("case", SQL_CASES, ids=lambda p: p.name)
def test_a_sql_pair_is_checked_as_its_compiled_plans(case, tmp_path):
    """Checking the .sql files gives what compiling them to JSON and checking that gives."""
    from compat.sql import compile_sql, dumps

    expect = json.loads((case / "expect.json").read_text())
    flags = {"require": parse_require(expect.get("require")),
             "schema_compat": expect.get("schema_compat", "forward")}
    compiled = []
    for side in ("old", "new"):
        sql = case / f"{side}.sql"
        out = tmp_path / f"{side}.json"
        out.write_text(dumps(compile_sql(sql.read_text(), str(sql))))
        compiled.append(str(out))
    via_json = check_files(*compiled, **flags)
    direct = check_files(str(case / "old.sql"), str(case / "new.sql"), **flags)
    assert direct.verdict == via_json.verdict
    assert sorted(map(key, direct.findings)) == sorted(map(key, via_json.findings))
    assert direct.alignment == via_json.alignment
    assert direct.new.file == str(case / "new.sql")


def test_check_of_two_sql_files_reports_the_verdict_and_sql_positions():
    old, new = sql_pair("group_by_key_changed")
    r = run("check", old, new)
    assert r.exit_code == 1, r.output
    assert r.output.startswith("verdict: migrate")
    assert "malformed JSON" not in r.output
    # the finding points at the GROUP BY of both scripts, not at /nodes/2/group_by
    m = re.search(r"at old aggregate_1 \((.+?):(\d+):(\d+)\); new aggregate_1 "
                  r"\((.+?):(\d+):(\d+)\)", r.output)
    assert m, r.output
    assert m.group(1) == old and m.group(4) == new
    line, col = int(m.group(5)), int(m.group(6))
    assert line_text(new, line)[col - 1:].startswith("lower(customer_id)")
    assert "GROUP BY" in line_text(new, line)
    assert "/nodes/" not in r.output


def test_json_report_of_a_sql_pair_carries_lines_and_columns():
    old, new = sql_pair("sink_key_changed")
    r = run("check", old, new, "--format", "json")
    doc = json.loads(r.output)
    jsonschema.validate(doc, load_schema("report.v1.json"))
    f = next(f for f in doc["findings"] if f["code"] == "sink-key-changed")
    text = line_text(new, f["new"]["line"])[f["new"]["column"] - 1:]
    assert text.startswith("key 'customer_id'")  # the OPTIONS entry that sets key_columns
    # a JSON plan's report keeps its pointers only
    r = run("check", str(CASE["sink_key_changed"] / "old.json"),
            str(CASE["sink_key_changed"] / "new.json"), "--format", "json")
    assert all("line" not in f["new"] for f in json.loads(r.output)["findings"])


@pytest.mark.parametrize("name, starts", [
    ("group_by_key_changed", "lower(customer_id)"),       # an aggregate: its GROUP BY
    ("source_topic_changed", "topic 'orders_v2'"),       # a source option
    ("scaling_state_partitions_stateful", "spark.sql.shuffle.partitions = 16"),  # SET
    ("config_other_key_changed", "spark.sql.shuffle.partitions = 8"),  # /config: 1st SET
    ("sink_key_changed", "key 'customer_id'"),           # a sink option
    ("source_column_widened_under_aggregate", "quantity BIGINT"),  # a declared column
])
def test_github_annotations_point_at_the_sql(name, starts):
    old, new = sql_pair(name)
    r = run("check", old, new, "--format", "github")
    ann = [a for a in r.output.splitlines() if re.match(r"::(error|warning|notice) file=", a)]
    assert ann, r.output
    found = []
    for a in ann:
        m = re.match(r"::\w+ file=(.+?),line=(\d+),col=(\d+),title=", a)
        assert m, a
        assert m.group(1) == new
        found.append(line_text(new, int(m.group(2)))[int(m.group(3)) - 1:])
    assert any(t.startswith(starts) for t in found), found


def test_sarif_of_a_sql_pair_has_sql_regions_and_follows_the_schema():
    schema = load_schema("sarif-2.1.0.json")
    validator = jsonschema.validators.validator_for(schema)(schema)
    old, new = sql_pair("source_column_widened_under_aggregate")
    doc = json.loads(run("check", old, new, "--format", "sarif").output)
    assert not [e.message for e in validator.iter_errors(doc)]
    results = doc["runs"][0]["results"]
    assert results
    for res in results:
        loc = res["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"] == new
        region = loc["region"]
        assert {"startLine", "startColumn", "endLine", "endColumn"} <= set(region)
        assert (region["endLine"], region["endColumn"]) > (region["startLine"],
                                                           region["startColumn"])
        rel = res["relatedLocations"][0]["physicalLocation"]
        assert rel["artifactLocation"]["uri"] == old and "startColumn" in rel["region"]
    widened = next(r for r in results if r["ruleId"] == "source-column-type-changed")
    region = widened["locations"][0]["physicalLocation"]["region"]
    assert line_text(new, region["startLine"])[region["startColumn"] - 1:
                                               region["endColumn"] - 1] == "quantity"


def test_a_sql_compile_error_is_exit_2_with_line_and_column(tmp_path):
    old = sql_pair("group_by_key_changed")[0]
    bad = tmp_path / "bad.sql"
    bad.write_text(open(old).read().replace("sum(amount)", "sum(amont)"))
    r = run("check", old, str(bad))
    assert r.exit_code == 2
    assert re.search(re.escape(str(bad)) + r":\d+:\d+: .*amont", r.output), r.output
    assert "Traceback" not in r.output


def test_plan_show_validate_and_diff_read_sql():
    old, new = sql_pair("ship_load_package_count_added")
    r = run("plan", "show", new)
    assert r.exit_code == 0, r.output
    assert "alerts: sink" in r.output and "aggregate_1: aggregate v1 [enforcing, stateful]" \
        in r.output
    r = run("plan", "validate", old, new)
    assert r.exit_code == 0, r.output
    assert r.output.count(": ok (") == 2 and "sink 'alerts'" in r.output
    r = run("plan", "diff", old, new)
    assert r.exit_code == 1, r.output
    assert "aggregate-added" in r.output and f"{new}:" in r.output


def test_plan_validate_of_bad_sql_is_exit_2(tmp_path):
    bad = tmp_path / "q.sql"
    bad.write_text("SELECT 1;")
    r = run("plan", "validate", str(bad))
    assert r.exit_code == 2 and f"{bad}:1:8: SELECT statements are not supported" in r.output


def test_checking_json_plans_imports_neither_sqlglot_nor_deepdiff():
    old, new = (str(CASE["group_by_key_changed"] / n) for n in ("old.json", "new.json"))
    code = (f"import sys; sys.argv=['theseus','check',{old!r},{new!r},'--format','sarif'];\n"
            "from migrate.cli import main\n"
            "try:\n    main()\n"
            "except SystemExit: pass\n"
            "print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & "
            "{'sqlglot', 'deepdiff', 'networkx'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert "LOADED []" in out, out


# -- check --against with SQL plans -------------------------------------------------------------


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def sql_repo(tmp_path, monkeypatch):
    """A repository whose plans are SQL: one changed (migrate), one identical, one removed,
    one added, and a .sql that is not a Theseus query (no Kafka table)."""
    repo = tmp_path / "repo"
    (repo / "plans").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    shutil.copy(CASE["group_by_key_changed"] / "old.sql", repo / "plans" / "agg.sql")
    shutil.copy(CASE["filter_changed_stream"] / "old.sql", repo / "plans" / "same.sql")
    shutil.copy(CASE["identical_same_plan"] / "old.sql", repo / "plans" / "gone.sql")
    (repo / "plans" / "batch.sql").write_text("SELECT count(*) FROM warehouse.orders;\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    shutil.copy(CASE["group_by_key_changed"] / "new.sql", repo / "plans" / "agg.sql")
    shutil.copy(CASE["sink_key_changed"] / "old.sql", repo / "plans" / "added.sql")
    (repo / "plans" / "gone.sql").unlink()
    monkeypatch.chdir(repo)
    return repo


def test_against_compiles_both_revisions_of_sql_plans(sql_repo):
    r = run("check", "--against", "HEAD", "plans", "--format", "json")
    doc = json.loads(r.output)
    outcomes = {f["path"].split("/")[-1]: f["outcome"] for f in doc["files"]}
    assert outcomes == {"agg.sql": "migrate", "same.sql": "identical", "added.sql": "new",
                        "gone.sql": "removed"}  # batch.sql is not a plan
    assert r.exit_code == 1 == doc["exit_code"]
    agg = next(f for f in doc["files"] if f["path"].endswith("agg.sql"))
    assert agg["report"]["old"]["file"] == "HEAD:plans/agg.sql"
    finding = agg["report"]["findings"][0]
    assert finding["code"] == "aggregate-key-changed"
    # positions on both sides: the old one comes from git's copy of the script
    assert finding["old"]["line"] == finding["new"]["line"] == 9


def test_against_github_annotations_point_at_sql_lines(sql_repo):
    r = run("check", "--against", "HEAD", "plans", "--format", "github")
    m = re.search(r"::error file=plans/agg\.sql,line=(\d+),col=(\d+),title=theseus "
                  r"aggregate-key-changed", r.output)
    assert m, r.output
    text = line_text(sql_repo / "plans" / "agg.sql", int(m.group(1)))
    assert text[int(m.group(2)) - 1:].startswith("lower(customer_id)")


def test_against_reports_an_old_sql_revision_that_does_not_compile(sql_repo):
    (sql_repo / "plans" / "agg.sql").write_text("CREATE TABLE t USING kafka AS SELECT x FROM;\n")
    git(sql_repo, "add", "plans/agg.sql")
    git(sql_repo, "commit", "-qm", "broken")
    shutil.copy(CASE["group_by_key_changed"] / "new.sql", sql_repo / "plans" / "agg.sql")
    r = run("check", "--against", "HEAD", "plans", "--format", "json")
    doc = json.loads(r.output)
    agg = next(f for f in doc["files"] if f["path"].endswith("agg.sql"))
    assert agg["outcome"] == "invalid" and agg["error"].startswith("HEAD:plans/agg.sql:1:")
    assert r.exit_code == 2
