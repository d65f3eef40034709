"""Issue 26: compat reaches the reader of PySpark job files through a registration that
migrate fills (``compat.loaders``), not by naming a module of migrate."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from tests.conftest import ROOT


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True).stdout


def test_compat_alone_refuses_a_job_file_with_one_clear_error():
    out = _run("import sys\n"
               "from compat.check import load_plan\n"
               "from compat.errors import JobError\n"
               "try:\n    load_plan('jobs/etl.py:build')\n"
               "except JobError as e:\n    print('ERROR', e.render())\n"
               "print('MIGRATE', any(m.split('.')[0] == 'migrate' for m in sys.modules))")
    assert "ERROR" in out and "jobs/etl.py:build" in out and "migrate package" in out, out
    assert "MIGRATE False" in out


def test_importing_migrate_registers_the_job_reader_without_loading_it():
    """The registration is all ``import migrate`` does: the importer (and PySpark) load
    only when a job file is read."""
    out = _run("import sys, migrate\n"
               "from compat.loaders import job_loader\n"
               "print('LOADER', job_loader('x.py').__module__)\n"
               "print('LOADED', sorted(m for m in sys.modules if m.startswith('migrate.') or "
               "m.split('.')[0] in ('pyspark', 'py4j')))")
    assert "LOADER migrate" in out and "LOADED []" in out, out


def test_compat_names_no_module_of_migrate():
    """No import, and no import string (``"migrate.adopt:load_job_plan"``)."""
    for path in sorted((ROOT / "compat").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if re.fullmatch(r"migrate((\.\w+)+(:\w+)?|:\w+)",
                                                     node.value.strip()) else []
            else:
                continue
            assert not any(n.split(".")[0].split(":")[0] == "migrate" for n in names), \
                f"{path.relative_to(ROOT)}:{node.lineno}: {names}"
