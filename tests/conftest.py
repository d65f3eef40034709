from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
UPGRADES = sorted(p for p in (FIXTURES / "upgrades").iterdir() if p.is_dir()) \
    if (FIXTURES / "upgrades").is_dir() else []
PLAN_FILES = sorted((FIXTURES / "plans").glob("*.json")) + \
    [p / n for p in UPGRADES for n in ("old.json", "new.json")]


# The job import cache of the tests' processes (and the theseus commands they start) is
# their own: a run neither reads nor fills the user's ~/.cache/theseus.
os.environ.setdefault("THESEUS_CACHE_DIR", tempfile.mkdtemp(prefix="theseus-test-cache-"))


def load_doc(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture
def write_plan(tmp_path):
    """Write a plan document to a file and return its path as a string."""
    counter = [0]

    def write(doc, name: str | None = None) -> str:
        counter[0] += 1
        p = tmp_path / (name or f"plan{counter[0]}.json")
        p.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
        return str(p)

    return write


def ship_load() -> dict:
    return load_doc(FIXTURES / "plans" / "ship_load.json")


# tests/cluster/ start their own brokers (SASL, three nodes) and a Spark standalone cluster:
# `make test-cluster` runs them (THESEUS_CLUSTER_TESTS=1), `make test` leaves them out.
collect_ignore = [] if os.environ.get("THESEUS_CLUSTER_TESTS") else ["cluster"]


# --------------------------------------------------------------------------- CI=true

def ci() -> bool:
    """True when the run is CI's (``.ci/run`` exports ``CI=true``; so do most CI services)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


# CI runs on two loaded cores: a timing deadline there fails for the load, not the code, and
# a random example that fails once must fail again on the rerun (print_blob gives the
# reproducer). Recent Hypothesis loads a like profile of its own when $CI is set; ours does
# not depend on the version pinned.
settings.register_profile("theseus-ci", derandomize=True, deadline=None, print_blob=True,
                          database=None, suppress_health_check=[HealthCheck.too_slow])
if ci():
    settings.load_profile("theseus-ci")

_SERVICE_DIRS = ("integration", "cluster")
_DESELECTED = pytest.StashKey[list]()


def _under(node, dirs: tuple[str, ...]) -> bool:
    try:
        rel = node.path.relative_to(node.config.rootpath)
    except ValueError:
        return False
    return len(rel.parts) > 1 and rel.parts[0] == "tests" and rel.parts[1] in dirs


def needs_services(item) -> bool:
    """An integration or cluster test: one that CI must run, never skip."""
    return _under(item, _SERVICE_DIRS) or any(item.get_closest_marker(m)
                                              for m in _SERVICE_DIRS)


def _skip_reason(report) -> str:
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return str(report.longrepr)


def _skip_to_failure(report, nodeid: str) -> None:
    # A missing java or Maven connector skips whole files; CI must not go green on that.
    report.outcome = "failed"
    report.longrepr = (f"CI=true: {nodeid} was skipped and CI counts a skipped integration "
                       f"test as failed; skip reason: {_skip_reason(report)}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and ci() and needs_services(item):
        _skip_to_failure(report, item.nodeid)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    # a module-level skip (importorskip, allow_module_level) drops every test of a file
    if report.skipped and ci() and _under(collector, _SERVICE_DIRS):
        _skip_to_failure(report, collector.nodeid)
    return report


def pytest_deselected(items):
    # Only tests/integration: the cluster_ci run deselects the rest of tests/cluster on purpose.
    if items and ci():
        config = items[0].config
        config.stash.setdefault(_DESELECTED, []).extend(
            it.nodeid for it in items
            if _under(it, ("integration",)) or it.get_closest_marker("integration"))


def pytest_collection_finish(session):
    gone = session.config.stash.get(_DESELECTED, [])
    if gone:
        shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
        raise pytest.UsageError(
            f"CI=true: {len(gone)} integration test(s) deselected (by -k, -m or --deselect), "
            f"and CI runs them all: {shown}. Run without the selection, or unset CI.")
