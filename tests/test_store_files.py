"""Issue 11: one atomic write for every file other processes read (store records, gate
state, acknowledgements, start gates, the Kafka store's mirror), and no import cycle between
migrate.store and migrate.kafkastore."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from compat.errors import StoreError
from gates.files import atomic_write, atomic_write_json
from tests.conftest import ROOT

WRITERS = sorted(str(p.relative_to(ROOT)) for d in ("gates", "migrate")
                 for p in (ROOT / d).glob("*.py"))


def test_a_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "deep" / "status.json"
    atomic_write(p, "old")
    atomic_write(p, "new")
    assert p.read_text() == "new"
    assert [f.name for f in p.parent.iterdir()] == ["status.json"]


def test_a_failed_write_keeps_the_old_content(tmp_path):
    p = tmp_path / "gate.json"
    atomic_write_json(p, {"mode": "open"})
    with pytest.raises(TypeError):
        atomic_write_json(p, {"mode": object()})  # not JSON: nothing is touched
    assert json.loads(p.read_text()) == {"mode": "open"}
    assert [f.name for f in tmp_path.iterdir()] == ["gate.json"]


def test_an_unwritable_place_is_a_store_error_naming_the_file(tmp_path):
    blocker = tmp_path / "queries"
    blocker.write_text("a file where a directory should be")
    target = blocker / "q" / "status.json"
    with pytest.raises(StoreError) as e:
        atomic_write(target, "{}")
    assert e.value.file == str(target) and e.value.exit_code == 4


def test_temporaries_are_dot_files_the_kafka_mirror_never_publishes(tmp_path, monkeypatch):
    import os

    seen = []
    real = os.replace

    def spy(src, dst):
        seen.append(os.path.basename(src))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    atomic_write(tmp_path / "plan.json", "{}")
    assert seen and seen[0].startswith(".plan.json.") and seen[0].endswith(".tmp")


@pytest.mark.parametrize("path", WRITERS)
def test_only_gates_files_writes_files_atomically(path):
    """The other modules call gates.files.atomic_write instead of a copy of their own."""
    if path == "gates/files.py":
        return
    tree = ast.parse((ROOT / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("mkstemp", "replace") and \
                isinstance(node.value, ast.Name) and node.value.id in ("tempfile", "os"):
            pytest.fail(f"{path}:{node.lineno}: {node.value.id}.{node.attr} outside "
                        "gates/files.py")


def imported(path: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_store_and_kafkastore_do_not_import_each_other():
    assert "migrate.store" not in imported("migrate/kafkastore.py")  # anywhere, nested too
    assert "migrate.kafkastore" in imported("migrate/store.py")
    code = "import sys, migrate.kafkastore; print('migrate.store' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr
