"""No traceback, ever, and never exit 1 for a crash: every failure a user can cause is one
line and exit 2; anything else is an "internal error" (exit 2) whose traceback goes to a
file the line names.  Each case here was found by hand or by ``tests/test_fuzz.py``."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from click.testing import CliRunner

from migrate.cli import main
from tests.conftest import FIXTURES, UPGRADES

SHIP = str(FIXTURES / "plans" / "ship_load.json")
CASE = {c.name: c for c in UPGRADES}


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert "Traceback" not in result.output
    return result


# -- the guard ------------------------------------------------------------------------------


def test_a_crash_is_exit_2_with_internal_error_and_the_traceback_in_a_file(monkeypatch):
    import compat.check

    def boom(*a, **kw):
        raise KeyError("a bug")

    monkeypatch.setattr(compat.check, "check_files", boom)
    r = run("check", SHIP, SHIP)
    assert r.exit_code == 2
    line = r.output.strip()
    assert line.count("\n") == 0
    assert line.startswith("theseus: internal error: KeyError")
    path = re.search(r"details in (\S+?)\)", line).group(1)
    details = Path(path).read_text()
    Path(path).unlink()
    assert "Traceback" in details and "boom" in details and "check" in details


def test_a_crash_in_the_installed_command_is_exit_2_not_1(tmp_path):
    # The console entry point, as CI runs it: a crash must not read as "migrate" (exit 1).
    script = ("import sys, compat.check\n"
              "def boom(*a, **k): raise ZeroDivisionError('x')\n"
              "compat.check.check_files = boom\n"
              "from migrate.cli import entry\n"
              f"sys.argv = ['theseus', 'check', {SHIP!r}, {SHIP!r}]\n"
              "entry()\n")
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([__import__("sys").executable, "-c", script], capture_output=True,
                       text=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin"})
    assert p.returncode == 2, p.stderr
    assert "internal error: ZeroDivisionError" in p.stderr and "Traceback" not in p.stderr
    Path(re.search(r"details in (\S+?)\)", p.stderr).group(1)).unlink()


def test_usage_errors_and_help_keep_their_exit_codes():
    assert run("check", "--format", "yaml", SHIP, SHIP).exit_code == 2
    assert run("--help").exit_code == 0
    assert run("check", "--help").exit_code == 0


# -- output files ---------------------------------------------------------------------------


def test_output_into_a_folder_that_does_not_exist(tmp_path):
    missing = tmp_path / "no" / "such" / "report.json"
    r = run("check", SHIP, SHIP, "-o", str(missing))
    assert r.exit_code == 2
    assert str(missing) in r.output and "no such folder" in r.output
    old = str(CASE["source_topic_changed"] / "old.sql")
    r = run("plan", "compile", old, "-o", str(missing))
    assert r.exit_code == 2 and "cannot write the output file" in r.output
    r = run("plan", "diff", SHIP, SHIP, "--html", str(missing))
    assert r.exit_code == 2 and "cannot write the output file" in r.output


# -- check --against --------------------------------------------------------------------------


def test_against_with_a_path_outside_the_repository(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                    "--allow-empty", "-m", "base"], cwd=repo, check=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(repo)
    r = run("check", "--against", "HEAD", str(outside))
    assert r.exit_code == 2
    assert "outside the git repository" in r.output and str(outside) in r.output
