"""`theseus check --against REF PATH...` in a real git repository."""

from __future__ import annotations

import json
import shutil
import subprocess

from click.testing import CliRunner

from migrate.cli import main
from tests.conftest import UPGRADES


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def case(name):
    return next(c for c in UPGRADES if c.name == name)


def test_against_ref_reports_changed_new_and_removed_plans(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "plans").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    shutil.copy(case("group_by_key_changed") / "old.json", repo / "plans" / "agg.json")
    shutil.copy(case("filter_changed_stream") / "old.json", repo / "plans" / "filt.json")
    shutil.copy(case("identical_same_plan") / "old.json", repo / "plans" / "gone.json")
    (repo / "plans" / "notes.json").write_text('{"not": "a plan"}')
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    shutil.copy(case("group_by_key_changed") / "new.json", repo / "plans" / "agg.json")
    shutil.copy(case("filter_changed_stream") / "new.json", repo / "plans" / "filt.json")
    shutil.copy(case("sink_key_changed") / "new.json", repo / "plans" / "added.json")
    (repo / "plans" / "gone.json").unlink()
    monkeypatch.chdir(repo)

    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "plans", "--format", "json"])
    doc = json.loads(r.output)
    outcomes = {f["path"].split("/")[-1]: f["outcome"] for f in doc["files"]}
    assert outcomes == {"agg.json": "migrate", "filt.json": "in_place", "added.json": "new",
                        "gone.json": "removed"}
    assert r.exit_code == 1 == doc["exit_code"]

    # --allow-migration lets a migration pass, not a removed plan; the report says the same
    args = ["check", "--against", "HEAD", "plans", "--format", "json", "--allow-migration"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 == json.loads(r.output)["exit_code"]
    shutil.copy(case("identical_same_plan") / "old.json", repo / "plans" / "gone.json")
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 == json.loads(r.output)["exit_code"]
    (repo / "plans" / "gone.json").unlink()

    # the worst outcome decides: an unsupported change makes it 3
    shutil.copy(case("sink_key_changed") / "old.json", repo / "plans" / "filt.json")
    git(repo, "add", "plans/filt.json")
    git(repo, "commit", "-qm", "sink", "--allow-empty")
    shutil.copy(case("sink_key_changed") / "new.json", repo / "plans" / "filt.json")
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "plans"])
    assert r.exit_code == 3
    assert "unsupported" in r.output

    # an invalid plan is reported with its file and makes the run fail with 2
    (repo / "plans" / "agg.json").write_text('{"format": "theseus.plan/1", "nodes": 3}')
    r = CliRunner().invoke(main, ["check", "--against", "HEAD", "plans", "--format", "github"])
    assert r.exit_code == 2
    assert "::error file=plans/agg.json" in r.output


def test_against_unknown_ref_is_a_clear_error(tmp_path, monkeypatch):
    git(tmp_path, "init", "-q")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["check", "--against", "nope", "."])
    assert r.exit_code == 2 and "git ref 'nope' not found" in r.output
