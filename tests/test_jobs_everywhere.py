"""Issue 27, item 1: every command that reads a plan takes a PySpark job file
(``FILE.py[:FUNCTION]``) through one loader, and a fleet folder's jobs are queries while
the helper modules beside them are skipped and counted.

The PySpark importer is faked (no Spark): a job file stands for the JSON plan it names in
a ``# plan:`` comment; the real importer is exercised under tests/integration.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from compat import loaders
from compat.loaders import defines_builder
from migrate.cli import main
from tests.conftest import UPGRADES

FLEET = Path(__file__).resolve().parent.parent / "fixtures" / "fleets" / "share"
_PLAN_OF = re.compile(r"^# plan: (.+)$", re.MULTILINE)


def job_text(plan_json: str | Path, function: str = "build") -> str:
    return (f"# plan: {plan_json}\n"
            "from sinks import to_kafka\n\n\n"
            f"def {function}(spark):\n"
            "    return to_kafka(spark.readStream.format('kafka').load())\n")


HELPER = "def to_kafka(df):\n    return df.writeStream.format('kafka')\n"


@pytest.fixture
def imported(monkeypatch):
    """The fake importer; the targets it was asked for, in order (``path``, from disk or
    not)."""
    from compat.check import load_plan

    calls: list[str] = []

    def load(path, raw=None):
        assert raw is None, "a job is imported from a file on disk, never from bytes"
        calls.append(path)
        file, _, function = path.partition(".py:")
        file = file + ".py" if function else path
        text = Path(file).read_text()
        if function and f"def {function}(" not in text:
            from compat.errors import JobError

            raise JobError(f"the job defines no function {function}", file=path)
        plan = load_plan(_PLAN_OF.search(text).group(1))
        plan.file = path
        return plan

    monkeypatch.setattr(loaders, "_JOB_LOADERS", [load])
    return calls


def case(name):
    return next(c for c in UPGRADES if c.name == name)


# -- which .py file is a job ---------------------------------------------------------------

@pytest.mark.parametrize("source, is_job", [
    ("def build(spark):\n    return None\n", True),
    ("async def build(spark):\n    return None\n", True),
    ("from jobs.factory import make\nbuild = make('orders')\n", True),
    ("build: object = None\n", True),
    # the builder of a helper's writer is still a job: what it builds is the importer's
    ("from sinks import to_kafka\ndef build(spark):\n    return to_kafka(spark)\n", True),
    ("def to_kafka(df):\n    return df.writeStream\n", False),  # a helper
    ("class Job:\n    def build(self, spark):\n        return None\n", False),  # a method
    ("def main():\n    def build(spark):\n        pass\n", False),  # not at the top level
    ("SCHEMA = 'def build(spark):'\n", False),  # text, not a definition
    ("# def build(spark):\n", False),
    ("def build(spark)\n    return None\n", True),  # does not parse: its import says why
])
def test_a_job_is_a_file_that_defines_the_builder(source, is_job):
    assert defines_builder(source.encode()) is is_job


def test_the_builder_may_have_another_name():
    src = b"def build_orders(spark):\n    return None\n"
    assert not defines_builder(src) and defines_builder(src, "build_orders")


def test_deciding_what_is_a_job_imports_nothing():
    """Which files are jobs is decided without Spark, and without running the files."""
    code = ("import sys\nfrom compat.loaders import defines_builder\n"
            "assert defines_builder(b'import pyspark\\ndef build(spark):\\n    pass\\n')\n"
            "print(sorted(m for m in ('pyspark', 'migrate', 'py4j') if m in sys.modules))")
    out = subprocess.run([sys_executable(), "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent).stdout
    assert out.strip() == "[]"


def sys_executable() -> str:
    import sys

    return sys.executable


# -- every command that reads a plan ---------------------------------------------------------

def write_job(path: Path, plan_json: Path | str, function: str = "build") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(job_text(plan_json, function))
    return str(path)


@pytest.mark.parametrize("command", [
    ["plan", "show", "{new}"],
    ["plan", "validate", "{new}"],
    ["plan", "export", "--pyspark", "{new}"],
])
def test_a_job_is_read_by_every_command_that_reads_one_plan(tmp_path, imported, command):
    c = case("identical_same_plan")
    job = write_job(tmp_path / "jobs" / "q.py", c / "new.json")
    from compat.check import load_plan

    plan = load_plan(str(c / "new.json"))
    r = CliRunner().invoke(main, [a.format(new=job) for a in command])
    assert r.exit_code == 0, r.output
    assert imported == [job]
    assert plan.query in r.output or "ok (" in r.output


@pytest.mark.parametrize("command", [
    ["check", "{old}", "{new}"],
    ["plan", "diff", "{old}", "{new}"],
])
@pytest.mark.parametrize("forms", [("py", "py"), ("json", "py"), ("py", "json")])
def test_a_job_is_either_side_of_a_comparison(tmp_path, imported, command, forms):
    c = case("group_by_key_changed")
    paths = {}
    for side, form in zip(("old", "new"), forms):
        paths[side] = write_job(tmp_path / f"{side}.py", c / f"{side}.json") \
            if form == "py" else str(c / f"{side}.json")
    r = CliRunner().invoke(main, [a.format(**paths) for a in command])
    expected = json.loads((c / "expect.json").read_text())["verdict"]
    assert r.exit_code == {"migrate": 1, "unsupported": 3}.get(expected, 0), r.output
    assert expected in r.output
    assert imported == [paths[s] for s, f in zip(("old", "new"), forms) if f == "py"]


def test_a_job_target_names_its_builder(tmp_path, imported):
    c = case("identical_same_plan")
    job = write_job(tmp_path / "q.py", c / "new.json", function="build_orders")
    r = CliRunner().invoke(main, ["plan", "validate", f"{job}:build_orders"])
    assert r.exit_code == 0 and imported == [f"{job}:build_orders"], r.output
    r = CliRunner().invoke(main, ["plan", "validate", f"{job}:build"])
    assert r.exit_code == 2 and "no function build" in r.output, r.output


def test_run_and_migrate_start_read_the_plan_through_the_same_loader():
    """``run``, ``migrate start`` and the checkpoint check call ``compat.check.load_plan``
    (the one dispatch on .json/.sql/.py) for the user's file, never a reader of their
    own: a file that names the serde's reader or opens the plan itself would bypass it."""
    import ast

    root = Path(__file__).resolve().parent.parent
    for rel, fn in (("migrate/run.py", "run"), ("migrate/record.py", "new_migration"),
                    ("migrate/ckcheck.py", "check_checkpoint"),
                    ("migrate/cli.py", "migrate_start"), ("migrate/cascade.py", None)):
        tree = ast.parse((root / rel).read_text())
        scope = tree if fn is None else next(
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn)
        called = {n.func.id for n in ast.walk(scope)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "load_plan" in called, rel
        assert not called & {"load", "from_doc", "compile_file", "import_job"}, rel


# -- fleets ----------------------------------------------------------------------------------

def job_fleet(tmp_path: Path) -> Path:
    """The ``share`` fixture fleet with one query written as a job importing a helper:
    ``big_orders.py`` (and ``sinks.py``, ``util/__init__.py``, the modules it imports)."""
    plans = tmp_path / "plans"
    shutil.copytree(FLEET, plans)
    fleet = tmp_path / "fleet"
    shutil.copytree(FLEET, fleet)
    (fleet / "big_orders.json").unlink()
    write_job(fleet / "big_orders.py", plans / "big_orders.json")
    (fleet / "sinks.py").write_text(HELPER)
    (fleet / "util").mkdir()
    (fleet / "util" / "__init__.py").write_text("")
    return fleet


def test_fleet_show_reads_jobs_and_counts_the_helpers(tmp_path, imported):
    fleet = job_fleet(tmp_path)
    r = CliRunner().invoke(main, ["fleet", "show", str(fleet)])
    assert r.exit_code == 0, r.output
    head = r.output.splitlines()[0]
    assert "4 queries" in head and "2 helper modules skipped (sinks.py, util/__init__.py)" \
        in head, head
    assert re.search(r"big_orders\s+big_orders\.py", r.output), r.output
    assert imported == [str(fleet / "big_orders.py")]
    r = CliRunner().invoke(main, ["fleet", "show", str(fleet), "--format", "json"])
    doc = json.loads(r.output)
    assert doc["helpers"] == ["sinks.py", "util/__init__.py"]
    assert "big_orders.py" in {q["file"] for q in doc["queries"]}


def test_a_fleet_without_helpers_says_nothing_of_them(tmp_path, imported):
    r = CliRunner().invoke(main, ["fleet", "show", str(FLEET)])
    assert r.exit_code == 0 and "helper" not in r.output.splitlines()[0], r.output


def test_fleet_check_compares_a_job_with_the_plan_it_replaces(tmp_path, imported):
    fleet = job_fleet(tmp_path)
    r = CliRunner().invoke(main, ["fleet", "check", str(FLEET), str(fleet)])
    assert r.exit_code == 0 and "identical" in r.output, r.output
    assert imported == [str(fleet / "big_orders.py")]


def test_fleet_optimize_keeps_the_helpers_a_copied_job_imports(tmp_path, imported):
    fleet = job_fleet(tmp_path)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["fleet", "optimize", str(fleet), "-o", str(out)])
    assert r.exit_code == 0, r.output
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    # the job's query is rewritten (it reads the shared topic now): a JSON plan in its place
    assert "big_orders.json" in files and "big_orders.py" not in files, files
    assert {"sinks.py", "util/__init__.py", "test_orders.sql"} <= set(files), files
    assert (out / "sinks.py").read_text() == HELPER


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_fleet_check_against_imports_the_ref_from_a_checkout(tmp_path, imported,
                                                              monkeypatch):
    """At a ref, a job imports its siblings as they were there: it is read from a checkout
    of the ref, and named REF:path in the report."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    c = case("group_by_key_changed")
    write_job(repo / "jobs" / "agg.py", c / "old.json")
    (repo / "jobs" / "sinks.py").write_text(HELPER)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    write_job(repo / "jobs" / "agg.py", c / "new.json")
    monkeypatch.chdir(repo)
    r = CliRunner().invoke(main, ["fleet", "check", "--against", "HEAD", "jobs"])
    assert r.exit_code == 1 and "migrate" in r.output, r.output
    # the work tree's fleet is read first (a file equal at the ref would reuse its plan)
    here, at_ref = imported
    assert at_ref.endswith("/jobs/agg.py") and "theseus-ref-" in at_ref
    assert here == "jobs/agg.py"
    # the checkout is gone
    assert not Path(at_ref).exists()


def test_a_fleet_of_helpers_alone_is_refused_naming_them(tmp_path, imported):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "sinks.py").write_text(HELPER)
    (tmp_path / "jobs" / "schemas.py").write_text("ORDER = 'order_id STRING'\n")
    r = CliRunner().invoke(main, ["fleet", "show", str(tmp_path / "jobs")])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "holds no plan" in lines[0] and "2 helper modules skipped" in lines[0], r.output
    assert imported == []


# -- the job file's digest in the store ------------------------------------------------------

def test_the_digest_is_of_the_job_file_whatever_its_builder(tmp_path):
    import hashlib

    from migrate.record import source_digest

    job = tmp_path / "job.py"
    job.write_text(job_text("x.json"))
    want = "sha256:" + hashlib.sha256(job.read_bytes()).hexdigest()
    assert source_digest(str(job)) == source_digest(f"{job}:build_orders") == want
    assert source_digest(str(tmp_path / "gone.py")) == ""


def test_status_shows_the_job_files_digest_and_when_the_file_changed(tmp_path, imported):
    import jsonschema

    from compat.check import load_plan
    from compat.schema_check import load_schema
    from compat.serde import dumps
    from migrate import view
    from migrate.record import new_migration, source_digest, user_source
    from migrate.store import DirectoryStore

    c = case("group_by_key_changed")
    job = tmp_path / "agg.py"
    write_job(job, c / "old.json")
    store = DirectoryStore(tmp_path / "state")
    # what `theseus run agg.py` records (migrate.run: the plan imported, the file's digest)
    plan = load_plan(str(job))
    q = plan.query
    store.put_plan(q, dumps(plan))
    recorded = source_digest(str(job))
    store.set_status(q, status="stopped", plan_file=str(job), plan_digest=recorded,
                     plan_query=q)

    def plan_view() -> dict:
        doc = view.snapshot(store)
        jsonschema.validate(doc, load_schema("status.v1.json"))
        return doc["queries"][0]["plan"]

    p = plan_view()
    assert (p["file"], p["source_digest"], p["source_changed"]) == (str(job), recorded, False)
    assert f"(from file {recorded[:19]})" in view.render_text(view.snapshot(store))
    # the job edited after it started: what runs is no longer what the file says
    write_job(job, c / "new.json")
    p = plan_view()
    assert p["source_digest"] == recorded and p["source_changed"] is True
    assert f"(from file {recorded[:19]}, changed since)" in \
        view.render_text(view.snapshot(store))
    # a migration to the edited job records the job's digest then, and the shadow's host
    # (which runs the store's copy) reports the job file and that digest
    m = new_migration(store, q, str(job), bootstrap="b:1")
    jsonschema.validate(json.loads(json.dumps(m.__dict__)), load_schema("migration.v1.json"))
    assert m.plan_digest == source_digest(str(job)) != recorded
    m.save(store)
    store.set_status(m.new_instance, plan_file=m.new_plan, plan_query=q,
                     plan_digest=source_digest(m.new_plan))
    assert user_source(store, m.new_instance) == (os.path.abspath(job), m.plan_digest)
    # without a recorded digest (a plan run by an older Theseus) nothing is claimed
    store.set_status(q, plan_digest="")
    p = plan_view()
    assert p["source_digest"] is None and p["source_changed"] is None


def test_run_of_a_job_records_its_file_and_digest(tmp_path, imported, monkeypatch):
    """``theseus run agg.py:build`` imports the job through the loader, and the store
    records the plan it built, the job file and the file's digest (Spark not started)."""
    import gates.broker
    import migrate.plantopics
    import migrate.run
    from compat.check import load_plan
    from compat.serde import dumps
    from migrate.record import source_digest
    from migrate.store import open_store

    class Started(Exception):
        pass

    def start_query(*a, **kw):
        raise Started

    monkeypatch.setattr(gates.broker, "check_access", lambda *a, **kw: None)
    monkeypatch.setattr(migrate.plantopics, "prepare", lambda *a, **kw: None)
    monkeypatch.setattr(migrate.run, "start_query", start_query)
    c = case("group_by_key_changed")
    job = write_job(tmp_path / "agg.py", c / "old.json")
    state = str(tmp_path / "st")
    with pytest.raises(Started):
        migrate.run.run(f"{job}:build", bootstrap="127.0.0.1:1", state=state,
                        echo=lambda s: None)
    assert imported == [f"{job}:build"]
    plan = load_plan(str(c / "old.json"))
    store = open_store(state)
    st = store.status(plan.query)
    assert st["plan_file"] == f"{job}:build"
    assert st["plan_digest"] == source_digest(job) and st["plan_digest"].startswith("sha256:")
    assert store.plan_path(plan.query).read_text() == dumps(plan)


def test_a_drift_names_the_job_file_and_whether_it_changed(tmp_path, imported):
    from compat.checkpoint_check import checkpoint_report
    from migrate.ckcheck import recorded_from
    from migrate.record import source_digest
    from migrate.store import open_store
    from tests.test_checkpoint import CK, _new_ops, _plan, _s, _with_store, read_checkpoint

    job = write_job(tmp_path / "probe.py", CK / "plan.json")
    state = str(tmp_path / "st")
    store = open_store(state)
    store.put_plan("probe", (CK / "plan.json").read_text())
    store.set_status("probe", plan_file=job, plan_digest=source_digest(job))
    made = recorded_from(state, "probe")
    assert made == f"{job} ({source_digest(job)[:19]}, unchanged)"
    (tmp_path / "probe.py").write_text(job_text(CK / "plan.json") + "# edited\n")
    made = recorded_from(state, "probe")
    assert made == f"{job} ({store.status('probe')['plan_digest'][:19]}, changed since)"
    ck = read_checkpoint(CK)
    agg, dedup = ck.operators
    rec_ops = _new_ops([_with_store(agg, key_schema=_s("string", "string")), dedup])
    rep = checkpoint_report(ck, _plan(), _new_ops(), _plan(), rec_ops, recorded_from=made)
    (f,) = [f for f in rep.findings if f.code == "checkpoint-drift"]
    assert f"made from {made}" in f.message
    # a store that records no file (an older Theseus): the drift names the plan alone
    store.set_status("probe", plan_file="", plan_digest="")
    assert recorded_from(state, "probe") == ""


def test_migrate_start_of_a_job_imports_it_once_and_records_its_digest(tmp_path, imported,
                                                                       monkeypatch):
    from compat.check import load_plan
    from compat.serde import dumps
    from migrate import runner
    from migrate.record import Migration, current, source_digest
    from migrate.store import open_store

    c = case("group_by_key_changed")
    old = load_plan(str(c / "old.json"))
    state = str(tmp_path / "st")
    store = open_store(state)
    store.put_plan(old.query, dumps(old))
    store.set_status(old.query, status="running", plan_file=str(c / "old.json"),
                     plan_query=old.query)
    monkeypatch.setattr(runner, "run", lambda m, ctx: m)  # the phases are not the point
    job = write_job(tmp_path / "agg.py", c / "new.json")
    r = CliRunner().invoke(main, ["migrate", "start", job, "--bootstrap", "b:1",
                                  "--state", state])
    assert r.exit_code == 0, r.output
    assert imported == [job]  # the command's load is the migration's: one import
    m: Migration = current(store, old.query)
    assert (m.plan_file, m.plan_digest) == (os.path.abspath(job), source_digest(job))
    assert Path(m.new_plan).read_text() == dumps(load_plan(str(c / "new.json")))
