"""Issue 27: the edges where the offline gate crashed, passed silently or said too little."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from compat import loaders
from migrate.cli import main
from tests.conftest import UPGRADES


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def case(name):
    return next(c for c in UPGRADES if c.name == name)


def init_repo(repo):
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")


# -- a. annotations on a job file ---------------------------------------------------------

_PLAN_OF = re.compile(r"^# plan: (.+)$", re.MULTILINE)


def job_text(plan_json: str) -> str:
    """A job file the fake loader reads: the JSON plan it stands for, named in a comment,
    and what makes a .py a job under --against (a build function, a streaming writer)."""
    return (f"# plan: {plan_json}\n"
            "def build(spark):\n"
            "    df = spark.readStream.format('kafka').load()  # topics] come from config\n"
            "    df = df.filter(df.value.rlike(r\"^\\d+$\"))\n"
            "    return df.writeStream\n")


@pytest.fixture
def fake_job_loader(monkeypatch):
    """The PySpark importer without Spark: a job file stands for the JSON plan it names."""
    from compat.check import load_plan

    def load(path, raw=None):
        text = raw.decode() if raw is not None else open(path.rsplit(":", 1)[0]
                                                         if not path.endswith(".py")
                                                         else path).read()
        plan = load_plan(_PLAN_OF.search(text).group(1))
        plan.file = path
        return plan

    monkeypatch.setattr(loaders, "_JOB_LOADERS", [load])


@pytest.mark.parametrize("fmt", ["github", "sarif", "text", "json", "markdown"])
def test_against_with_a_changed_job_file_renders_its_annotations(tmp_path, monkeypatch,
                                                                  fake_job_loader, fmt):
    repo = tmp_path / "repo"
    init_repo(repo)
    (repo / "jobs").mkdir()
    c = case("group_by_key_changed")
    (repo / "jobs" / "agg_job.py").write_text(job_text(str(c / "old.json")))
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    (repo / "jobs" / "agg_job.py").write_text(job_text(str(c / "new.json")))
    monkeypatch.chdir(repo)
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "jobs", "--format", fmt])
    assert "internal error" not in r.output, r.output
    assert r.exit_code == 1, r.output
    if fmt == "github":
        errors = [ln for ln in r.output.splitlines() if ln.startswith("::error")]
        assert errors and all("file=jobs/agg_job.py" in ln for ln in errors), r.output
        # a job's findings point at its nodes, not at lines of the .py read as JSON
        assert not any(",line=" in ln for ln in errors), r.output
    if fmt == "sarif":
        results = json.loads(r.output)["runs"][0]["results"]
        assert results
        for res in results:
            loc = res["locations"][0]["physicalLocation"]
            assert loc["artifactLocation"]["uri"] == "jobs/agg_job.py"
            assert "region" not in loc


def test_pointer_lines_of_a_file_that_is_not_json_is_empty(tmp_path):
    from compat.report import line_of, pointer_lines

    p = tmp_path / "job.py"
    p.write_text(job_text("x.json"))
    assert pointer_lines(str(p)) == {}
    assert line_of(str(p), "/nodes/3/inputs") == 1


# -- b. no silent pass on a path that holds no plan ---------------------------------------

def one_plan_repo(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    init_repo(repo)
    (repo / "plans").mkdir()
    shutil.copy(case("identical_same_plan") / "old.json", repo / "plans" / "q.json")
    (repo / "docs").mkdir()
    (repo / "docs" / "notes.json").write_text('{"not": "a plan"}')
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    monkeypatch.chdir(repo)
    return repo


def refused(args, *names):
    r = CliRunner().invoke(main, args)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert lines[0].startswith("theseus: error: ") and all(n in lines[0] for n in names), \
        r.output
    return lines[0]


def test_against_a_path_in_neither_tree_is_refused(tmp_path, monkeypatch):
    one_plan_repo(tmp_path, monkeypatch)
    line = refused(["check", "--against", "HEAD", "plans_typo"], "plans_typo", "HEAD")
    assert "no such file or folder" in line
    # with a real path beside it, still refused: the typo would hide a plan from the gate
    refused(["check", "--against", "HEAD", "plans", "plans_typo"], "plans_typo")


def test_against_a_folder_that_holds_no_plan_is_refused(tmp_path, monkeypatch):
    repo = one_plan_repo(tmp_path, monkeypatch)
    line = refused(["check", "--against", "HEAD", "docs"], "docs", "HEAD")
    assert "no plan" in line
    (repo / "empty").mkdir()
    refused(["check", "--against", "HEAD", "empty"], "empty")
    # a folder whose plans are unchanged, or all removed, is checked, not refused
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "plans"])
    assert r.exit_code == 0 and "1 plan against HEAD: 1 identical" in r.output, r.output
    (repo / "plans" / "q.json").unlink()
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "plans"])
    assert r.exit_code == 1 and "1 removed" in r.output, r.output


def test_fleet_of_an_empty_folder_is_refused(tmp_path, monkeypatch):
    repo = one_plan_repo(tmp_path, monkeypatch)
    (repo / "empty").mkdir()
    (repo / "jobs").mkdir()
    # a module the jobs import, not a job: no build function
    (repo / "jobs" / "sinks.py").write_text("def to_kafka(df):\n    return df.writeStream\n")
    refused(["fleet", "show", "empty"], "empty", "holds no plan")
    line = refused(["fleet", "show", "jobs"], "jobs", "holds no plan")
    assert "1 helper module skipped" in line
    (repo / "empty2").mkdir()
    refused(["fleet", "check", "empty2", "empty"], "empty", "holds no plan nor in empty2")
    refused(["fleet", "check", "--against", "HEAD", "empty"], "empty",
            "holds no plan or at HEAD")
    # one side may be empty: every query of the new fleet is new, or every one removed
    r = CliRunner().invoke(main, ["fleet", "check", "empty", "plans"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["fleet", "check", "plans", "empty"])
    assert r.exit_code == 1 and "query-removed" in r.output, r.output
    (repo / "plans" / "q.json").unlink()
    r = CliRunner().invoke(main, ["fleet", "check", "--against", "HEAD", "plans"])
    assert r.exit_code == 1 and "query-removed" in r.output, r.output


# -- c. a removal fails the gate with an error in every format ----------------------------

@pytest.mark.parametrize("allow", [False, True])
def test_a_removal_only_change_is_an_error_in_every_format(tmp_path, monkeypatch, allow):
    repo = one_plan_repo(tmp_path, monkeypatch)
    (repo / "plans" / "q.json").unlink()
    base = ["check", "--against", "HEAD", "plans"] + (["--allow-migration"] if allow else [])

    def run(fmt):
        r = CliRunner().invoke(main, base + ["--format", fmt])
        assert r.exit_code == 1, r.output
        return r.output

    text = run("text")
    assert "✗ plans/q.json: the plan was removed" in text and "theseus stop" in text
    doc = json.loads(run("json"))
    assert doc["exit_code"] == 1
    assert doc["files"] == [{"path": "plans/q.json", "outcome": "removed",
                             "error": doc["files"][0]["error"]}]
    assert "the plan was removed" in doc["files"][0]["error"]
    gh = run("github").splitlines()
    errors = [ln for ln in gh if ln.startswith("::error ")]
    assert len(errors) == 1 and errors[0].startswith("::error file=plans/q.json::"), gh
    sarif = json.loads(run("sarif"))["runs"][0]
    [res] = sarif["results"]
    assert res["level"] == "error" and res["ruleId"] == "plan-removed"
    assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "plans/q.json"
    assert [r["id"] for r in sarif["tool"]["driver"]["rules"]] == ["plan-removed"]
    assert res["ruleIndex"] == 0
    assert "the plan was removed" in run("markdown")


def test_an_invalid_plan_is_a_sarif_result_too(tmp_path, monkeypatch):
    repo = one_plan_repo(tmp_path, monkeypatch)
    (repo / "plans" / "q.json").write_text('{"format": "theseus.plan/1", "nodes": 3}')
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "plans", "--format", "sarif"])
    assert r.exit_code == 2
    [res] = json.loads(r.output)["runs"][0]["results"]
    assert res["ruleId"] == "plan-invalid" and res["level"] == "error"


# -- d. a SQL syntax error: where, and what was expected, in Spark's terms ----------------

SQL = case("filter_changed_stream") / "old.sql"


def broken_sql(tmp_path, old: str, new: str, name="q.sql"):
    text = SQL.read_text()
    assert old in text
    p = tmp_path / name
    p.write_text(text.replace(old, new))
    return p


@pytest.mark.parametrize("where,line,col,said", [
    ("WHERE AND amount > 100", 8, 7, "at or near 'AND': expected an expression before AND"),
    ("WHERE amount > 100 AND", 8, 20, "at or near 'AND': expected an expression after AND"),
    ("WHERE amount >", 8, 14, "at or near '>': expected an expression after >"),
    ("WHERE amount > 100 OR", 8, 20, "at or near 'OR': expected an expression after OR"),
])
def test_a_syntax_error_never_names_the_parsers_internals(tmp_path, where, line, col, said):
    from compat.check import load_plan
    from compat.errors import SqlError

    p = broken_sql(tmp_path, "WHERE amount > 100", where)
    with pytest.raises(SqlError) as e:
        load_plan(str(p))
    text = e.value.render()
    assert (e.value.line, e.value.col) == (line, col), text
    assert said in text, text
    assert "sqlglot" not in text and "<class" not in text and "required keyword" not in text


def test_against_an_invalid_sql_annotation_carries_line_and_column(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    init_repo(repo)
    (repo / "plans").mkdir()
    shutil.copy(SQL, repo / "plans" / "q.sql")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    broken_sql(repo / "plans", "WHERE amount > 100", "WHERE AND amount > 100")
    monkeypatch.chdir(repo)
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "plans", "--format", "github"])
    assert r.exit_code == 2
    [err] = [ln for ln in r.output.splitlines() if ln.startswith("::error")]
    assert err.startswith("::error file=plans/q.sql,line=8,col=7::"), err
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "plans", "--format", "sarif"])
    [res] = json.loads(r.output)["runs"][0]["results"]
    assert res["locations"][0]["physicalLocation"]["region"] == {"startLine": 8,
                                                                 "startColumn": 7}


# -- f. topic names as Kafka validates them -----------------------------------------------

BAD_TOPICS = [("bestellungen.📦", "'📦' at character 14 is not allowed"),
              ("my topic/with slash", "' ' at character 3 is not allowed"),
              ("..", "'..' is not a topic name"), (".", "'.' is not a topic name"),
              ("t" * 250, "it is 250 characters long, at most 249")]


@pytest.mark.parametrize("topic,why", BAD_TOPICS)
@pytest.mark.parametrize("side", ["source", "sink"])
def test_a_json_plan_with_a_topic_kafka_refuses_is_invalid(write_plan, topic, why, side):
    from compat.check import load_plan
    from compat.errors import PlanError

    doc = json.loads((case("filter_changed_stream") / "old.json").read_text())
    i = next(i for i, n in enumerate(doc["nodes"]) if n["step"] == side)
    doc["nodes"][i]["topic"] = topic
    path = write_plan(doc)
    with pytest.raises(PlanError) as e:
        load_plan(path)
    text = e.value.render()
    assert text.startswith(f"{path}, node '{doc['nodes'][i]['id']}', at /nodes/{i}/topic: "
                           f"topic name Kafka refuses: {why}"), text
    assert "expected a Kafka topic name: 1 to 249 characters from [a-zA-Z0-9._-]" in text
    assert f"found {topic!r}" in text


@pytest.mark.parametrize("topic,why", BAD_TOPICS[:3])
def test_a_sql_table_with_a_topic_kafka_refuses_is_invalid(tmp_path, topic, why):
    from compat.check import load_plan
    from compat.errors import SqlError

    p = broken_sql(tmp_path, "topic 'big_orders'", f"topic '{topic}'")
    with pytest.raises(SqlError) as e:
        load_plan(str(p))
    text = e.value.render()
    assert (e.value.line, e.value.col) == (5, 14), text
    assert f"at sink 'out': topic name Kafka refuses: {why}" in text, text


@pytest.mark.parametrize("topic", ["orders", "a.b-c_D9", "t" * 249, "..a", "_x"])
def test_topic_names_kafka_takes_are_taken(topic):
    from compat.infer import topic_problem

    assert topic_problem(topic) is None


# -- h. help ------------------------------------------------------------------------------

def test_check_help_names_job_files():
    out = CliRunner().invoke(main, ["check", "--help"]).output
    assert ".py" in out and "PySpark job" in out


def test_every_option_of_plan_diff_has_help():
    import click

    diff = main.commands["plan"].commands["diff"]
    missing = [p.opts for p in diff.params if isinstance(p, click.Option) and not p.help]
    assert missing == []
    out = CliRunner().invoke(main, ["plan", "diff", "--help"]).output
    assert "--require LIST" in out and "backfill,ordered" in out and "--schema-compat" in out


# -- e. what Spark's parser and analyzer say about lists and session windows --------------

@pytest.mark.parametrize("select,line,col,said", [
    ("SELECT order_id,, amount", 6, 17, "at or near ',': expected an expression between "
     "two commas"),
    ("SELECT order_id, amount,", 7, 1, "at or near 'FROM': expected an expression after ','"),
    ("SELECT , order_id", 6, 8, "at or near ',': expected an expression before ','"),
    ("SELECT concat(order_id,)", 6, 24, "at or near ')': expected an expression after ','"),
])
def test_an_empty_item_in_a_list_is_refused(tmp_path, select, line, col, said):
    from compat.check import load_plan
    from compat.errors import SqlError

    p = broken_sql(tmp_path, "SELECT *", select)
    with pytest.raises(SqlError) as e:
        load_plan(str(p))
    assert (e.value.line, e.value.col) == (line, col), e.value.render()
    assert said in e.value.render()


SESSIONS = """CREATE TABLE clicks (url STRING, page STRING, ts TIMESTAMP)
  USING kafka OPTIONS (partitions 3, event_time 'ts', watermark '1 minute');
CREATE TABLE out USING kafka OPTIONS (topic 'sessions') AS
SELECT page, {select}, count(*) AS n
FROM clicks
GROUP BY {group}(ts, '20 minutes'), page;
"""


def compiled_columns(tmp_path, select, group="session_window"):
    from compat.check import load_plan

    p = tmp_path / "s.sql"
    p.write_text(SESSIONS.format(select=select, group=group))
    plan = load_plan(str(p))
    return plan.info[plan.sink_id].columns


def test_a_session_window_is_named_session_window_as_spark_names_it(tmp_path):
    cols = compiled_columns(tmp_path, "session_window.start AS started, session_window.end")
    assert cols[:3] == (("page", "string"), ("started", "timestamp"), ("end", "timestamp"))
    cols = compiled_columns(tmp_path, "session_window")
    assert cols[1] == ("session_window", "struct<start:timestamp,end:timestamp>")
    # `window` keeps naming it (scripts written for Theseus use it for every kind)
    assert compiled_columns(tmp_path, "window")[1][0] == "window"


def test_a_tumbling_window_is_not_named_session_window(tmp_path):
    from compat.errors import SqlError

    with pytest.raises(SqlError, match="unknown column 'session_window.start'"):
        compiled_columns(tmp_path, "session_window.start AS s", group="window")


# -- g. the output topic under --schema-compat none ---------------------------------------

TOPIC = case("sink_topic_changed")


def topic_check(*flags, fmt="json"):
    r = CliRunner().invoke(main, ["check", str(TOPIC / "old.json"), str(TOPIC / "new.json"),
                                  "--format", fmt, *flags])
    return r


def test_the_output_topic_may_change_when_no_consumer_is_protected():
    r = topic_check("--schema-compat", "none")
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["verdict"] == "in_place", r.output
    [f] = [f for f in doc["findings"] if f["code"] == "sink-topic-changed"]
    assert f["effect"] == "in_place" and f["severity"] == "warning"
    assert "'customer_totals_v2'" in f["message"] and "'customer_totals_v2'" in f["hint"]
    assert "--schema-compat none" in f["hint"]


@pytest.mark.parametrize("flags", [(), ("--schema-compat", "forward"),
                                   ("--schema-compat", "none", "--require", "cascading")])
def test_the_output_topic_change_stays_unsupported_otherwise(flags):
    r = topic_check(*flags)
    doc = json.loads(r.output)
    assert r.exit_code == 3 and doc["verdict"] == "unsupported", r.output
    [f] = [f for f in doc["findings"] if f["code"] == "sink-topic-changed"]
    # the advice names the flag that relaxes it, unless a requirement forbids it
    assert ("--schema-compat none" in f["hint"]) == ("cascading" not in flags)
