from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

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
