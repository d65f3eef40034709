"""CI cannot go green by skipping (tests/conftest.py's hooks under ``CI=true``).

Each test writes a tiny test directory laid out as this repository is (``tests/integration``,
``tests/cluster``, a unit test beside them) and runs pytest on it in a subprocess with the
repository's ``tests/conftest.py`` loaded as a plugin, with and without ``CI=true``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

INTEGRATION = '''
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker():
    pytest.skip("no java on PATH to start a local broker")


def test_runs():
    pass


def test_skips_itself():
    pytest.skip("connector jars are not available")


@pytest.mark.skipif(True, reason="switched off by a marker")
def test_marked_off():
    pass


def test_needs_the_broker(broker):
    pass


@pytest.mark.xfail(reason="a known bug", strict=True)
def test_expected_to_fail():
    raise AssertionError
'''

CLUSTER = '''
import pytest

pytestmark = pytest.mark.cluster


@pytest.mark.cluster_ci
def test_in_the_ci_subset():
    pytest.skip("no second broker")


def test_by_hand_only():
    pass
'''

UNIT = '''
import pytest


def test_unit_skip():
    pytest.skip("an optional tool is missing")
'''


def _tree(root: Path, files: dict[str, str]) -> Path:
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nmarkers = ["integration: x", "cluster: x", '
        '"cluster_ci: x"]\n')
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _pytest(root: Path, *args: str, ci: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "tests.conftest",
                           "-p", "no:cacheprovider", "-p", "no:randomly", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _outcomes(out: str) -> dict[str, str]:
    """The -rA summary as {test name: PASSED | FAILED | ERROR | SKIPPED | XFAIL}."""
    found = {}
    for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL) (?:\[\d+\] )?(\S+)", out,
                         re.MULTILINE):
        name = m.group(2).rstrip(":").split("::")[-1]
        if m.group(1) == "SKIPPED":  # "SKIPPED [1] path:line: reason" names no test
            name = m.group(2).rstrip(":")
        found[name] = m.group(1)
    return found


@pytest.fixture
def suite(tmp_path) -> Path:
    return _tree(tmp_path, {"tests/integration/test_int.py": INTEGRATION,
                            "tests/cluster/test_clu.py": CLUSTER,
                            "tests/test_unit.py": UNIT})


def test_without_ci_a_skip_is_still_a_skip(suite):
    r = _pytest(suite, "tests", ci=False)
    assert r.returncode == 0, r.stdout
    assert "2 passed, 5 skipped, 1 xfailed" in r.stdout, r.stdout
    assert "CI=true" not in r.stdout


def test_under_ci_every_skip_of_an_integration_test_fails_naming_test_and_reason(suite):
    r = _pytest(suite, "tests", ci=True)
    assert r.returncode == 1, r.stdout
    got = _outcomes(r.stdout)
    assert got["test_runs"] == "PASSED"
    assert got["test_skips_itself"] == "FAILED"  # skipped while running
    assert got["test_marked_off"] == "ERROR"  # skipped in its setup
    assert got["test_needs_the_broker"] == "ERROR"  # a fixture skipped it
    assert got["test_in_the_ci_subset"] == "FAILED"  # tests/cluster counts too
    assert got["test_by_hand_only"] == "PASSED"
    assert got["test_expected_to_fail"] == "XFAIL"  # it ran: not a skip
    assert got["tests/test_unit.py:6"] == "SKIPPED"  # a unit test may skip
    for name, reason in [("test_skips_itself", "connector jars are not available"),
                         ("test_marked_off", "switched off by a marker"),
                         ("test_needs_the_broker", "no java on PATH to start a local broker"),
                         ("test_in_the_ci_subset", "no second broker")]:
        assert re.search(rf"CI=true: tests/\w+/test_\w+\.py::{name} was skipped .*"
                         rf"skip reason: {reason}", r.stdout), (name, r.stdout)


def test_under_ci_a_module_level_skip_of_an_integration_file_fails(tmp_path):
    root = _tree(tmp_path, {"tests/integration/test_mod.py":
                            'import pytest\n\npytest.importorskip("no_such_module_xyz")\n\n\n'
                            'def test_never():\n    pass\n',
                            "tests/test_unit.py": "def test_u():\n    pass\n"})
    assert _pytest(root, "tests", ci=False).returncode == 0
    r = _pytest(root, "tests", ci=True)
    assert r.returncode != 0, r.stdout
    assert "CI=true: tests/integration/test_mod.py was skipped" in r.stdout
    assert "No module named 'no_such_module_xyz'" in r.stdout


def test_under_ci_deselecting_an_integration_test_fails_the_session(suite):
    for selection in (["-k", "runs"], ["-m", "not integration"],
                      ["--deselect", "tests/integration/test_int.py::test_marked_off"]):
        r = _pytest(suite, *selection, "tests/integration", ci=True)
        assert r.returncode == pytest.ExitCode.USAGE_ERROR, (selection, r.stdout + r.stderr)
        assert "integration test(s) deselected" in r.stderr
        assert "tests/integration/test_int.py::test_marked_off" in r.stderr
        assert "passed" not in r.stdout  # refused before anything ran
    ok = _pytest(suite, "-k", "runs", "tests/integration", ci=False)
    assert ok.returncode == 0 and "1 passed, 4 deselected" in ok.stdout, ok.stdout


def test_under_ci_the_cluster_ci_run_may_deselect_the_rest_of_tests_cluster(suite):
    r = _pytest(suite, "-m", "cluster_ci", "tests/cluster", ci=True)
    assert "deselected" in r.stdout, r.stdout
    assert "integration test(s) deselected" not in r.stderr
    # what it selects still may not skip
    assert _outcomes(r.stdout) == {"test_in_the_ci_subset": "FAILED"}


HYPOTHESIS = '''
import json
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

DRAWN = []


def test_profile():
    d = settings.default
    Path("profile.json").write_text(json.dumps([d.derandomize, d.deadline, d.print_blob]))


@given(st.none())  # one example: nothing to shrink when it fails
def test_slow_example(n):
    time.sleep(0.3)  # over Hypothesis' default deadline of 200 ms


@settings(max_examples=10)
@given(st.binary(min_size=32, max_size=32))
def test_draws(b):
    DRAWN.append(b.hex())
    Path("drawn.json").write_text(json.dumps(DRAWN))
'''


def test_under_ci_hypothesis_is_derandomized_without_a_deadline(tmp_path):
    root = _tree(tmp_path, {"tests/test_h.py": HYPOTHESIS})

    def drawn(ci: bool) -> tuple[int, list]:
        r = _pytest(root, "tests", ci=ci)
        return r.returncode, (root / "drawn.json").read_text()

    code, first = drawn(True)
    assert code == 0  # the 300 ms example passes: no deadline
    assert json.loads((root / "profile.json").read_text()) == [True, None, True]
    assert drawn(True) == (0, first)  # the same examples again
    code, other = drawn(False)
    assert code == 1  # the default profile's deadline fails the slow example
    assert other != first


def test_the_ci_profile_is_registered_as_ci_needs_it():
    from hypothesis import HealthCheck, settings

    p = settings.get_profile("theseus-ci")
    assert (p.derandomize, p.deadline, p.print_blob, p.database) == (True, None, True, None)
    assert HealthCheck.too_slow in p.suppress_health_check


def _settings_calls() -> list[tuple[Path, ast.Call]]:
    calls = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "settings":
                calls.append((path, node))
    return calls


def test_no_hypothesis_settings_override_the_ci_profile():
    calls = _settings_calls()
    assert len(calls) >= 5  # test_fuzz, test_properties, test_fleet_* …: the scan finds them
    bad = []
    for path, call in calls:
        for kw in call.keywords:
            value = kw.value
            if kw.arg == "deadline" and not (isinstance(value, ast.Constant)
                                             and value.value is None):
                bad.append(f"{path.relative_to(ROOT)}:{call.lineno} deadline={ast.unparse(value)}")
            if kw.arg == "derandomize" and isinstance(value, ast.Constant) and not value.value:
                bad.append(f"{path.relative_to(ROOT)}:{call.lineno} derandomize=False")
    assert not bad, "a deadline or randomness the CI profile cannot override: " + ", ".join(bad)


def test_every_test_under_tests_integration_carries_the_integration_marker():
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                        "-p", "no:cacheprovider", "-p", "no:randomly",
                        "-m", "not integration", "tests/integration"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    unmarked = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert not unmarked, "tests under tests/integration without pytest.mark.integration " \
        "(add `pytestmark = pytest.mark.integration` to the file): " + ", ".join(unmarked)
    assert r.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, r.stdout + r.stderr
    assert re.search(r"\d{2,} deselected", r.stdout), r.stdout  # it did collect them
