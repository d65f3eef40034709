"""The CLI in-process (click's CliRunner): formats, flags and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
from click.testing import CliRunner

from compat.schema_check import load_schema
from migrate.cli import main
from tests.conftest import ROOT, UPGRADES

CASE = {c.name: c for c in UPGRADES}


def run(*args):
    return CliRunner().invoke(main, list(args))


def pair(name):
    return str(CASE[name] / "old.json"), str(CASE[name] / "new.json")


def test_text_report_starts_with_verdict_and_says_what_to_do():
    r = run("check", *pair("group_by_key_changed"))
    assert r.exit_code == 1
    lines = r.output.splitlines()
    assert lines[0].startswith("verdict: migrate")
    assert "[aggregate-key-changed]" in r.output
    assert "what to do:" in r.output


def test_allow_migration_turns_migrate_into_success():
    assert run("check", *pair("group_by_key_changed")).exit_code == 1
    assert run("check", *pair("group_by_key_changed"), "--allow-migration").exit_code == 0
    # but never an unsupported change
    assert run("check", *pair("sink_key_changed"), "--allow-migration").exit_code == 3


def test_require_backfill_turns_history_changes_into_migrations():
    assert run("check", *pair("filter_changed_before_aggregate")).exit_code == 0
    r = run("check", *pair("filter_changed_before_aggregate"), "--require", "backfill",
            "--format", "json")
    assert r.exit_code == 1
    assert json.loads(r.output)["requirements"][0]["name"] == "backfill"


@pytest.mark.parametrize("case", [c.name for c in UPGRADES[:25]])
def test_json_report_follows_its_schema(case):
    r = run("check", *pair(case), "--format", "json")
    jsonschema.validate(json.loads(r.output), load_schema("report.v1.json"))


def test_markdown_has_verdict_findings_and_alignment():
    r = run("check", *pair("aggregate_function_changed"), "--format", "markdown")
    assert "Theseus: `migrate`" in r.output
    assert "| `aggregate-function-changed` |" in r.output
    assert "Matched enforcing steps" in r.output


def test_github_annotations_point_at_real_lines():
    old, new = pair("sink_key_changed")
    r = run("check", old, new, "--format", "github")
    ann = [line for line in r.output.splitlines() if line.startswith("::error")]
    assert ann, r.output
    line_no = int(ann[0].split("line=")[1].split(",")[0])
    text = open(new).read().splitlines()[line_no - 1]
    assert "key_columns" in text


def test_sarif_is_2_1_0_with_locations():
    old, new = pair("group_by_key_changed")
    doc = json.loads(run("check", old, new, "--format", "sarif").output)
    assert doc["version"] == "2.1.0"
    res = doc["runs"][0]["results"]
    assert res and all(r["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1
                       for r in res)
    line_no = res[0]["locations"][0]["physicalLocation"]["region"]["startLine"]
    assert "group_by" in open(new).read().splitlines()[line_no - 1]


def test_output_file(tmp_path):
    out = tmp_path / "r.json"
    r = run("check", *pair("identical_same_plan"), "--format", "json", "-o", str(out))
    assert r.exit_code == 0 and json.loads(out.read_text())["verdict"] == "identical"


def test_plan_show_tree():
    r = run("plan", "show", str(ROOT / "fixtures" / "plans" / "ship_load.json"))
    assert r.exit_code == 0
    first = r.output.splitlines()[1]
    assert "alerts: sink" in first and "[I,UB,UA,D]" in first
    assert "load: aggregate v1 [enforcing, stateful] [I,UA]" in r.output


def test_help_documents_exit_codes():
    r = run("check", "--help")
    for word in ("identical", "in_place", "migrate", "unsupported", "--require",
                 "--schema-compat", "--allow-migration", "--format"):
        assert word in r.output


def _check_in_a_fresh_process(old, new) -> str:
    """``theseus check OLD NEW`` in a new interpreter (main() rather than the entry point,
    whose exit after a check skips the prints): its output, then ``EXIT <code>`` and
    ``LOADED <heavy modules loaded> <sqlglot loaded>``."""
    code = (f"import sys; sys.argv=['theseus','check',{str(old)!r},{str(new)!r}];\n"
            "from migrate.cli import main\n"
            "try:\n    main()\n"
            "except SystemExit as e: print('EXIT', e.code)\n"
            "bad=[m for m in sys.modules if m.split('.')[0] in "
            "('pyspark','confluent_kafka','py4j','pandas','pyarrow')]\n"
            "print('LOADED', bad, 'sqlglot' in sys.modules)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True).stdout


def test_check_imports_no_spark_and_no_kafka_client():
    out = _check_in_a_fresh_process(*pair("ship_load_capacity_rule_changed"))
    assert "LOADED []" in out, out


def test_check_of_sql_plans_imports_no_spark_and_no_kafka_client(tmp_path):
    """``theseus check a.sql b.sql`` compiles the scripts (sqlglot) and checks them without
    PySpark or a Kafka client, like a JSON pair: a SQL plan is no reason to start a JVM."""
    old = ROOT / "fixtures" / "history" / "aggregate_update" / "v1" / "query.sql"
    new = tmp_path / "new.sql"
    # a grouping key changed: a real check with findings, not only a parse
    new.write_text(old.read_text().replace("lower(customer)", "upper(customer)"))
    out = _check_in_a_fresh_process(old, new)
    assert "verdict: migrate" in out and "EXIT 1" in out, out
    assert "LOADED [] True" in out, out


def test_sarif_validates_against_the_sarif_2_1_0_schema():
    schema = load_schema("sarif-2.1.0.json")
    validator_cls = jsonschema.validators.validator_for(schema)
    for name in ("group_by_key_changed", "sink_key_changed", "identical_same_plan",
                 "klip6_having_filter_moved"):
        doc = json.loads(run("check", *pair(name), "--format", "sarif").output)
        errors = list(validator_cls(schema).iter_errors(doc))
        assert not errors, [e.message for e in errors[:3]]


def test_version_names_the_plan_format_and_step_versions():
    r = run("--version")
    assert r.exit_code == 0
    first, second = r.output.splitlines()
    assert first.startswith("theseus ")
    assert second.startswith("plan format: reads and writes theseus.plan/1 (step versions: ")
    assert "source 1-4" in second and "aggregate 1-2" in second and "join 1-3" in second
    assert "every other step 1" in second


@pytest.mark.parametrize("argv, module, command", [
    (["run", "plan.json", "--bootstrap", "h:1"], "confluent_kafka", "run"),
    (["plan", "import", "job.py", "--partitions", "2"], "pyspark", "plan import"),
    (["migrate", "start", "--bootstrap", "h:1", "p.json"], "pyspark.sql", "migrate start"),
    (["check", "old.py", "new.py"], "pyspark", "check"),
])
def test_a_missing_runtime_extra_is_one_line_naming_it(monkeypatch, capsys, argv, module,
                                                         command):
    """Installed without the runtime extra, a command that needs Spark or the Kafka client
    says so in one line naming the extra, exit 2: never a traceback nor 'internal error'."""
    from migrate import cli

    def missing(*a, **k):
        raise ModuleNotFoundError(f"No module named '{module}'", name=module)

    group = cli.main
    for word in command.split():
        group = group.commands[word] if hasattr(group, "commands") else group
    monkeypatch.setattr(group, "callback", missing)
    monkeypatch.setattr(sys, "argv", ["theseus", *argv])
    with pytest.raises(SystemExit) as e:
        cli.main.main(argv, prog_name="theseus", standalone_mode=True)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err == (f"theseus: error: `theseus {command}` needs the runtime extra (Spark and "
                   f"the Kafka client; no module named '{module}' here): "
                   "pip install 'theseus[runtime]'\n")


def test_a_missing_module_outside_the_runtime_extra_is_an_internal_error():
    from migrate.cli import missing_runtime

    e = ModuleNotFoundError("No module named 'compat.fleet'", name="compat.fleet")
    assert missing_runtime(e, ["fleet", "show", "d"]) is None
