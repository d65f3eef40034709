"""`check --against`: a file whose bytes are equal in both trees is identical without being
read as a plan; a job also needs the local modules it imports unchanged.  The job importer
is a fake that records what it was asked to import."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import compat.gitcheck as gitcheck
import compat.loaders as loaders
from compat.check import load_plan
from migrate.cli import main
from tests.conftest import FIXTURES, UPGRADES

PLAN = FIXTURES / "pyspark" / "dedup_watermark" / "plan.json"


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def job_text(helper: str, extra: str = "") -> str:
    return (f"from {helper} import EVENT\n\n\ndef build(spark):\n"
            f"    return spark.readStream.load(EVENT).writeStream  # {extra}\n")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """Two jobs (each with a helper of its own, one shared), a JSON plan and a SQL script,
    committed; the fake importer's calls."""
    r = tmp_path / "repo"
    jobs = r / "jobs"
    (jobs / "pkg").mkdir(parents=True)
    (jobs / "a.py").write_text(job_text("helper_a"))
    (jobs / "b.py").write_text(job_text("pkg.schemas"))
    (jobs / "helper_a.py").write_text("from shared import X\nEVENT = 'a'\n")
    (jobs / "shared.py").write_text("X = 1\n")
    (jobs / "pkg" / "__init__.py").write_text("")
    (jobs / "pkg" / "schemas.py").write_text("EVENT = 'b'\n")
    (jobs / "unrelated.py").write_text("Y = 2\n")
    case = next(c for c in UPGRADES if c.name == "filter_changed_stream")
    shutil.copy(case / "old.json", jobs / "plan.json")
    git(r, "init", "-q")
    git(r, "config", "user.email", "ci@example.com")
    git(r, "config", "user.name", "ci")
    git(r, "add", ".")
    git(r, "commit", "-qm", "base")
    monkeypatch.chdir(r)
    calls: list[str] = []

    def fake_import(path: str, raw: bytes | None = None):
        calls.append(Path(path).name)
        return load_plan(str(PLAN))

    monkeypatch.setattr(loaders, "_JOB_LOADERS", [fake_import])
    return jobs, calls


def run() -> tuple[int, dict[str, str]]:
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "jobs", "--format", "json"])
    doc = json.loads(r.output)
    return r.exit_code, {f["path"].split("/")[-1]: f["outcome"] for f in doc["files"]}


def test_nothing_changed_imports_nothing_and_reads_no_plan(repo, monkeypatch):
    jobs, calls = repo
    plans: list[str] = []
    real = gitcheck.load_plan
    monkeypatch.setattr(gitcheck, "load_plan",
                        lambda p, *a, **k: plans.append(p) or real(p, *a, **k))
    # a touched file with the same bytes, and a change nothing imports
    (jobs / "a.py").write_text((jobs / "a.py").read_text())
    (jobs / "unrelated.py").write_text("Y = 3\n")
    assert run() == (0, {"a.py": "identical", "b.py": "identical", "plan.json": "identical"})
    assert calls == [] and plans == []


def test_a_changed_job_alone_is_imported(repo):
    jobs, calls = repo
    (jobs / "a.py").write_text(job_text("helper_a", "edited"))
    code, out = run()
    assert out["a.py"] == "identical"  # the fake gives one plan: the two sides compare equal
    assert sorted(calls) == ["a.py", "a.py"]


@pytest.mark.parametrize(("edit", "imported"), [
    ("helper_a.py", "a.py"),          # the helper the job imports
    ("shared.py", "a.py"),            # what that helper imports in turn
    ("pkg/schemas.py", "b.py"),       # a module of a package (from pkg.schemas import ...)
])
def test_an_edited_local_module_imports_its_jobs_again(repo, edit, imported):
    jobs, calls = repo
    (jobs / edit).write_text((jobs / edit).read_text() + "Z = 0\n")
    run()
    assert sorted(calls) == [imported, imported]


def test_a_new_or_deleted_module_the_job_names_counts(repo):
    jobs, calls = repo
    (jobs / "helper_a.py").unlink()
    run()
    assert sorted(calls) == ["a.py", "a.py"]
    calls.clear()
    # an untracked module where the job's package import would find it
    (jobs / "helper_a.py").write_text("EVENT = 'a'\n")
    git(jobs.parent, "rm", "-q", "--cached", "jobs/helper_a.py")
    run()
    assert sorted(calls) == ["a.py", "a.py"]


def test_json_with_equal_bytes_is_not_parsed_even_when_invalid(repo):
    """The verdict needs no parsing: a file that is unchanged is not this change's doing."""
    jobs, calls = repo
    (jobs / "plan.json").write_text("{broken")
    git(jobs.parent, "commit", "-qam", "broken")
    assert run()[1]["plan.json"] == "identical"
    (jobs / "plan.json").write_text("{broken ")
    assert run()[1]["plan.json"] == "invalid"


def test_job_deps_walk_names_packages_and_submodules():
    import ast

    tree = ast.parse("import a.b\nfrom c import d\nfrom . import e\n"
                     "def f():\n    import g\n")
    assert gitcheck._imported_names(tree) == {"a", "a.b", "c", "c.d", "e", "g"}


def test_fleet_against_reads_each_unchanged_plan_once(tmp_path, monkeypatch):
    import compat.fleet.graph as graph

    case = FIXTURES / "fleets" / "migration_cascades"
    repo = tmp_path / "repo"
    shutil.copytree(case / "old", repo / "fleet")
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    monkeypatch.chdir(repo)
    read: list[str] = []
    real = graph._load_query
    monkeypatch.setattr(graph, "_load_query",
                        lambda file, rel, raw: read.append(file) or real(file, rel, raw))
    n = len(list((repo / "fleet").glob("*.json")))

    def check() -> dict:
        r = CliRunner().invoke(main, ["fleet", "check", "--against", "HEAD", "fleet",
                                      "--format", "json"])
        return json.loads(r.output)

    doc = check()
    assert doc["verdict"] == "identical" and doc["old"] == "HEAD:fleet"
    assert read == []  # nothing changed: no plan is read at all
    shutil.copy(case / "new" / "enrich.json", repo / "fleet" / "enrich.json")
    doc = check()
    assert doc["waves"] == [["enrich"], ["region_totals"], ["region_rank"]]
    assert len(read) == n + 1 and sorted(read)[0] == "HEAD:fleet/enrich.json"


def fleet_check() -> tuple[int, dict]:
    r = CliRunner().invoke(main, ["fleet", "check", "--against", "HEAD", "jobs",
                                  "--format", "json"])
    return r.exit_code, json.loads(r.output)


def test_fleet_against_with_nothing_changed_imports_no_job(repo):
    jobs, calls = repo
    # a touched file with the same bytes changes nothing
    (jobs / "a.py").write_text((jobs / "a.py").read_text())
    code, doc = fleet_check()
    assert code == 0 and doc["verdict"] == "identical" and calls == []
    assert doc["old"] == "HEAD:jobs"
    assert [(q["query"], q["status"], q["file"]) for q in doc["queries"]] == [
        (n, "unchanged", f"jobs/{n}") for n in ("a.py", "b.py", "plan.json")]
    text = CliRunner().invoke(main, ["fleet", "check", "--against", "HEAD", "jobs"]).output
    assert "every file is as it was at HEAD: no plan was read" in text


@pytest.mark.parametrize("edit", [
    "helper_a.py",  # a module a job imports: its job is imported again
    "unrelated.py",  # a helper of the folder no job imports: a file of the fleet changed
    "new.json",  # a file the ref does not have
    "plan.json:delete",  # a file the work tree does not have
])
def test_fleet_against_reads_the_plans_when_any_file_differs(repo, edit):
    jobs, calls = repo
    name, _, how = edit.partition(":")
    if how == "delete":
        (jobs / name).unlink()
    elif name == "new.json":
        shutil.copy(jobs / "plan.json", jobs / name)
    else:
        (jobs / name).write_text((jobs / name).read_text() + "Z = 0\n")
    r = CliRunner().invoke(main, ["fleet", "check", "--against", "HEAD", "jobs"])
    # the full check ran: jobs were imported (the fake gives both jobs one query name,
    # which the full check refuses; the fast path never looked)
    assert calls, r.output
    assert "no plan was read" not in r.output
