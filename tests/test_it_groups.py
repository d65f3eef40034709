"""scripts/it_groups.py: make test's two integration runs together run every file once."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import it_groups  # noqa: E402


def test_every_integration_file_is_in_exactly_one_group():
    g = it_groups.groups()
    files = sorted(str(p.relative_to(ROOT))
                   for p in (ROOT / "tests" / "integration").glob("test_*.py"))
    assert sorted(g["serial"] + g["parallel"]) == files
    assert not set(g["serial"]) & set(g["parallel"])
    assert g["serial"] and g["parallel"]


def test_every_serial_name_is_a_file_of_the_directory():
    # a renamed file would silently move to the parallel group
    names = {p.name for p in (ROOT / "tests" / "integration").glob("test_*.py")}
    assert it_groups.SERIAL <= names, sorted(it_groups.SERIAL - names)


def test_files_that_run_a_live_migration_are_serial():
    # several drivers at once and bounds in wall-clock time: never beside another file
    g = it_groups.groups()
    for f in g["parallel"]:
        text = (ROOT / f).read_text()
        assert '"migrate", "start"' not in text and "'migrate', 'start'" not in text, f


def test_a_new_file_goes_to_the_parallel_group(tmp_path):
    d = tmp_path / "tests" / "integration"
    d.mkdir(parents=True)
    (d / "test_fencing.py").write_text("")
    (d / "test_new.py").write_text("")
    (d / "conftest.py").write_text("")
    assert it_groups.groups(d) == {"serial": ["tests/integration/test_fencing.py"],
                                   "parallel": ["tests/integration/test_new.py"]}


@pytest.mark.parametrize("args,code", [(["serial"], 0), (["parallel"], 0), ([], 2),
                                       (["both"], 2)])
def test_the_command(args, code):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "it_groups.py"), *args],
                       capture_output=True, text=True)
    assert r.returncode == code, r.stderr
    if code == 0:
        assert r.stdout.split() == it_groups.groups()[args[0]]
