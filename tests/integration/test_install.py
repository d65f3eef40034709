"""Theseus installed as its users install it, not as ``make`` does (an editable install).

* the wheel and the sdist, built with ``python -m build`` from a copy of the tracked files:
  every package and every data file of ``compat``, ``gates`` and ``migrate`` is in both;
* each installed into a fresh venv (no ``--system-site-packages``), run from a folder outside
  the repository with no ``PYTHONPATH``: ``--version``, ``check`` of JSON and SQL plans (the
  same report as the checkout's), ``check --against`` in a scratch git repository, ``fleet
  show``, ``plan validate``, SARIF's ``informationUri`` from the installed metadata; ``run``
  and ``plan import`` say in one line that they need the runtime extra;
* the wheel's venv then gets the ``runtime`` extra from the package index (PySpark comes
  from pip's cache when it has been installed before) and runs ``plan import`` of a fixture
  job on Spark;
* ``pipx install`` of the same wheel;
* the Action's way (``pip install <a copy of the repository>``, not editable) and its two
  ``check --against`` commands, and pre-commit's (``pre-commit try-repo`` on the copy, in a
  scratch repository: a staged in-place change passes, an unsupported one is refused).

``build``, ``pipx`` and ``pre-commit`` come from the package index into a tools venv of
the test's own. One venv per install kind, reused by every command run in it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]

FIX = ROOT / "fixtures"
PAIR = FIX / "upgrades" / "ship_load_capacity_rule_changed"  # in_place
BAD_PAIR = FIX / "upgrades" / "aggregate_function_removed"  # unsupported
JOB = FIX / "pyspark" / "filter_project"
RUNTIME_LINE = "pip install 'theseus[runtime]'"
PACKAGES = ("compat", "gates", "migrate")
COMMIT = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q",
          "--no-verify", "-m", "plans"]


def _env(**extra: str) -> dict[str, str]:
    """The environment of an installed theseus: nothing that points at the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(extra)
    return env


def sh(args: list[str], cwd: Path, timeout: float = 600, **env: str):
    return subprocess.run([str(a) for a in args], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def ok(r: subprocess.CompletedProcess, *codes: int) -> subprocess.CompletedProcess:
    assert r.returncode in (codes or (0,)), \
        f"{r.args} exit {r.returncode}\nstdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}"
    return r


def venv(path: Path) -> Path:
    """A fresh venv (from the base interpreter: nothing of the test's venv is visible)."""
    base = getattr(sys, "_base_executable", sys.executable)
    ok(sh([base, "-m", "venv", path], cwd=path.parent))
    return path / "bin"


def tracked_copy(dest: Path) -> Path:
    """The repository's tracked (and new, not ignored) files, copied: what a clone has,
    without the checkout's .venv, caches and build leftovers."""
    files = ok(sh(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT)).stdout
    for rel in filter(None, files.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def package_files() -> set[str]:
    """Every file of the three packages that git knows: code and data alike."""
    out = ok(sh(["git", "ls-files", "-co", "--exclude-standard", *PACKAGES], cwd=ROOT)).stdout
    return {f for f in out.splitlines() if "__pycache__" not in f and (ROOT / f).is_file()}


class Timer:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.laps: list[str] = []

    def lap(self, what: str) -> None:
        now = time.monotonic()
        self.laps.append(f"{what} {now - self.t0:.1f} s")
        self.t0 = now

    def report(self) -> None:
        print("\ntimes: " + ", ".join(self.laps))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("install")


@pytest.fixture(scope="module")
def tools(work) -> Path:
    """A venv with build, pipx and pre-commit from the package index."""
    t = time.monotonic()
    bin_ = venv(work / "tools")
    r = sh([bin_ / "python", "-m", "pip", "install", "-q", "build>=1", "pipx>=1.4",
            "pre-commit>=3"], cwd=work)
    if r.returncode != 0:
        pytest.skip(f"cannot install build, pipx and pre-commit: {r.stderr.strip()[-300:]}")
    print(f"\ntools venv {time.monotonic() - t:.1f} s")
    return bin_


@pytest.fixture(scope="module")
def repo_copy(work) -> Path:
    """A copy of the repository as a git repository of one commit (pre-commit's try-repo
    clones it; the Action's path is such a checkout)."""
    dest = tracked_copy(work / "theseus-src")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], COMMIT):
        ok(sh(cmd, cwd=dest))
    return dest


@pytest.fixture(scope="module")
def dist(work, tools, repo_copy) -> dict[str, Path]:
    """The sdist, and the wheel built from it (``python -m build``'s default)."""
    t = time.monotonic()
    out = work / "dist"
    ok(sh([tools / "python", "-m", "build", "-q", "--outdir", out, repo_copy], cwd=work))
    (sdist,) = out.glob("theseus-*.tar.gz")
    (wheel,) = out.glob("theseus-*.whl")
    print(f"\nbuild (sdist, then the wheel from it) {time.monotonic() - t:.1f} s")
    return {"sdist": sdist, "wheel": wheel}


def test_the_wheel_and_the_sdist_hold_every_package_and_data_file(dist):
    want = package_files()
    assert any(f.endswith(".json") for f in want) and "compat/schemas/plan.v1.json" in want
    in_wheel = set(zipfile.ZipFile(dist["wheel"]).namelist())
    with tarfile.open(dist["sdist"]) as tar:
        prefix = tar.getnames()[0].split("/")[0] + "/"
        in_sdist = {n.removeprefix(prefix) for n in tar.getnames()}
    assert sorted(want - in_wheel) == [], "files missing from the wheel"
    assert sorted(want - in_sdist) == [], "files missing from the sdist"
    assert "pyproject.toml" in in_sdist and "LICENSE" in in_sdist
    meta = zipfile.ZipFile(dist["wheel"]).read(
        next(n for n in in_wheel if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
    assert "Project-URL: Homepage, https://" in meta
    assert "Provides-Extra: runtime" in meta


def scratch_repo(path: Path, plans: dict[str, Path] | None = None) -> Path:
    """A git repository whose ``plans/NAME.json`` are committed as the old plan of each
    pair (default: ``ship`` for PAIR) and changed to its new plan in the work tree."""
    plans = plans or {"ship": PAIR}
    (path / "plans").mkdir(parents=True)
    for name, pair in plans.items():
        shutil.copy(pair / "old.json", path / "plans" / f"{name}.json")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], COMMIT):
        ok(sh(cmd, cwd=path))
    for name, pair in plans.items():
        shutil.copy(pair / "new.json", path / "plans" / f"{name}.json")
    return path


def expected_report(old: Path, new: Path) -> dict:
    """The checkout's own report for the pair (in this process): the installed one must
    say the same."""
    from click.testing import CliRunner

    from migrate.cli import main

    r = CliRunner().invoke(main, ["check", str(old), str(new), "--format", "json"])
    return json.loads(r.output)


def gate_commands(bin_: Path, cwd: Path) -> None:
    """The offline gate, installed: no Java, no Spark (not installed), outside the repo."""
    theseus = bin_ / "theseus"
    where = ok(sh([bin_ / "python", "-c", "import compat; print(compat.__file__)"], cwd=cwd))
    assert where.stdout.strip().startswith(str(bin_.parent)), where.stdout
    ok(sh([bin_ / "python", "-c", "import pyspark"], cwd=cwd), 1)  # the gate alone

    v = ok(sh([theseus, "--version"], cwd=cwd)).stdout.splitlines()
    assert v[0].startswith("theseus ") and "theseus.plan/1" in v[1], v

    for old, new in ((PAIR / "old.json", PAIR / "new.json"), (PAIR / "old.sql", PAIR / "new.sql")):
        want = expected_report(old, new)
        r = ok(sh([theseus, "check", old, new, "--format", "json"], cwd=cwd), want["exit_code"])
        got = json.loads(r.stdout)
        assert (got["verdict"], got["exit_code"]) == (want["verdict"], want["exit_code"])
        assert [f["code"] for f in got["findings"]] == [f["code"] for f in want["findings"]]
    r = ok(sh([theseus, "check", BAD_PAIR / "old.json", BAD_PAIR / "new.json"], cwd=cwd), 3)
    assert r.stdout.startswith("verdict: unsupported")

    sarif = json.loads(ok(sh([theseus, "check", PAIR / "old.json", PAIR / "new.json",
                              "--format", "sarif"], cwd=cwd)).stdout)
    assert sarif["runs"][0]["tool"]["driver"]["informationUri"] == \
        "https://github.com/theseus-streaming/theseus"

    repo = scratch_repo(cwd / "scratch")
    r = ok(sh([theseus, "check", "--against", "HEAD", "plans"], cwd=repo))
    assert "in_place" in r.stdout, r.stdout

    r = ok(sh([theseus, "fleet", "show", FIX / "fleets" / "ship", "--format", "json"], cwd=cwd))
    assert {q["query"] for q in json.loads(r.stdout)["queries"]} >= {"ship_load", "alert_counts"}
    ok(sh([theseus, "plan", "validate", *sorted((FIX / "plans").glob("*.json")),
           PAIR / "old.json", PAIR / "new.json"], cwd=cwd))

    for args in (["run", FIX / "plans" / "ship_load.json", "--bootstrap", "127.0.0.1:1"],
                 ["plan", "import", JOB / "job.py", "--partitions", "3"]):
        r = ok(sh([theseus, *args], cwd=cwd), 2)
        assert r.stderr.count("\n") == 1 and RUNTIME_LINE in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_the_sdist_installed_gives_the_offline_gate(dist, work):
    t = Timer()
    bin_ = venv(work / "sdist-venv")
    ok(sh([bin_ / "python", "-m", "pip", "install", "-q", dist["sdist"]], cwd=work))
    t.lap("sdist venv and install")
    cwd = work / "sdist-cwd"
    cwd.mkdir()
    gate_commands(bin_, cwd)
    t.lap("gate commands")
    t.report()


def test_the_wheel_installed_gives_the_gate_and_with_the_extra_plan_import(dist, work):
    t = Timer()
    bin_ = venv(work / "wheel-venv")
    ok(sh([bin_ / "python", "-m", "pip", "install", "-q", dist["wheel"]], cwd=work))
    t.lap("wheel venv and install")
    cwd = work / "wheel-cwd"
    cwd.mkdir()
    gate_commands(bin_, cwd)
    t.lap("gate commands")

    # the runtime extra, from the same index, into the same venv
    ok(sh([bin_ / "python", "-m", "pip", "install", "-q", f"{dist['wheel']}[runtime]"],
          cwd=work), 0)
    t.lap("runtime extra")
    if shutil.which("java") is None:
        t.report()
        pytest.skip("no java on PATH: plan import needs Spark")
    from compat.errors import TheseusError
    from migrate.adopt.jars import cache_dir, connector_jars

    try:
        connector_jars()  # fetched into the checkout's cache once, reused by the venv
    except TheseusError as e:
        pytest.skip(f"Spark's Kafka connector jars are not available: {e}")
    t.lap("connector jars")
    expected = json.loads((JOB / "plan.json").read_text())
    parts = {n["partitions"] for n in expected["nodes"] if n["step"] == "source"}.pop()
    (sink,) = [n for n in expected["nodes"] if n["step"] == "sink"]
    out = cwd / "imported.json"
    r = ok(sh([bin_ / "theseus", "plan", "import", JOB / "job.py", "--partitions", str(parts),
               "--delivery", sink["delivery"], "-o", out], cwd=cwd, timeout=600,
              PYSPARK_PYTHON=str(bin_ / "python"), SPARK_LOCAL_IP="127.0.0.1",
              KAFKA_BOOTSTRAP="127.0.0.1:1", THESEUS_SPARK_KAFKA_JARS=str(cache_dir())))
    got = json.loads(out.read_text())
    got.pop("metadata", None)
    expected.pop("metadata", None)
    # the installed importer says where each step was made, in the job file itself
    assert {n.pop("x-origin")["file"] for n in got["nodes"]} == {"job.py"}, got
    assert got == expected, r.stderr[-2000:]
    t.lap("plan import on Spark")
    t.report()


def test_pipx_installs_the_wheel(dist, tools, work):
    t = Timer()
    home = work / "pipx"
    env = {"PIPX_HOME": str(home / "home"), "PIPX_BIN_DIR": str(home / "bin"),
           "PIPX_MAN_DIR": str(home / "man")}
    ok(sh([tools / "pipx", "install", dist["wheel"]], cwd=work, **env))
    t.lap("pipx install")
    theseus = home / "bin" / "theseus"
    assert "theseus.plan/1" in ok(sh([theseus, "--version"], cwd=work)).stdout
    r = ok(sh([theseus, "check", PAIR / "old.json", PAIR / "new.json"], cwd=work))
    assert r.stdout.startswith("verdict: in_place")
    r = ok(sh([theseus, "fleet", "show", FIX / "fleets" / "ship"], cwd=work))
    t.lap("pipx commands")
    t.report()


def test_the_actions_install_and_its_commands(repo_copy, tools, work):
    """action.yml (valid YAML: GitHub refuses an action it cannot parse): ``pip install
    <the action's path>`` (not editable), then its two ``theseus check --against``
    commands (GitHub annotations, then Markdown)."""
    t = Timer()
    steps = ok(sh([tools / "python", "-c", "import json, sys, yaml; print(json.dumps(yaml."
                   "safe_load(open(sys.argv[1]))['runs']['steps']))", ROOT / "action.yml"],
                  cwd=work))
    install = [s["run"] for s in json.loads(steps.stdout) if s.get("name") == "Install theseus"]
    assert install and 'pip install --quiet "${{ github.action_path }}$extra"' in install[0]
    bin_ = venv(work / "action-venv")
    ok(sh([bin_ / "python", "-m", "pip", "install", "--quiet", repo_copy], cwd=work))
    t.lap("action venv and pip install <repo>")
    repo = scratch_repo(work / "action-scratch", {"ship": PAIR, "agg": BAD_PAIR})
    r = ok(sh([bin_ / "theseus", "check", "--against", "HEAD", "--format", "github", "plans"],
              cwd=repo), 3)
    assert "::error" in r.stdout and "agg.json" in r.stdout, r.stdout
    r = ok(sh([bin_ / "theseus", "check", "--against", "HEAD", "--format", "markdown",
               "plans"], cwd=repo), 3)
    assert "unsupported" in r.stdout
    t.lap("action commands")
    t.report()


def test_the_pre_commit_hook_by_try_repo(repo_copy, tools, work):
    """pre-commit installs the repository in an environment of its own (``language:
    python``) and runs the hook on the staged plans."""
    t = Timer()
    repo = scratch_repo(work / "hook-scratch")
    env = {"PRE_COMMIT_HOME": str(work / "pre-commit-home"),
           "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}
    ok(sh(["git", "add", "-A"], cwd=repo))
    r = ok(sh([tools / "pre-commit", "try-repo", repo_copy, "theseus-check"], cwd=repo, **env))
    assert "Passed" in r.stdout, r.stdout
    t.lap("pre-commit try-repo (installs the hook's env): in_place passes")
    repo = scratch_repo(work / "hook-scratch-bad", {"agg": BAD_PAIR})
    ok(sh(["git", "add", "-A"], cwd=repo))
    r = ok(sh([tools / "pre-commit", "try-repo", repo_copy, "theseus-check"], cwd=repo, **env), 1)
    assert "Failed" in r.stdout and "unsupported" in r.stdout, r.stdout
    t.lap("unsupported refused")
    t.report()
