"""The same SQL gives byte-identical plans: in one process, and across processes with
different hash seeds (no dict-order or hash randomness reaches the output)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from compat.sql import compile_sql, dumps
from tests.conftest import ROOT, UPGRADES

FILES = sorted(str(p) for c in UPGRADES for p in (c / "old.sql", c / "new.sql") if p.exists())

_CHILD = """
import json, sys
from compat.sql import compile_sql, dumps
out = {}
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        out[path] = dumps(compile_sql(f.read(), path))
sys.stdout.write(json.dumps(out))
"""


def compile_all() -> dict[str, str]:
    out = {}
    for path in FILES:
        with open(path, encoding="utf-8") as f:
            out[path] = dumps(compile_sql(f.read(), path))
    return out


def test_compiling_twice_gives_the_same_bytes():
    assert len(FILES) >= 30
    assert compile_all() == compile_all()


def test_other_processes_and_hash_seeds_give_the_same_bytes():
    here = compile_all()
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", _CHILD, *FILES], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300, check=True)
        assert json.loads(run.stdout) == here, f"PYTHONHASHSEED={seed}"


def test_dumps_is_indented_json_ending_with_a_newline():
    text = dumps(compile_sql("CREATE TABLE t (a STRING, ts TIMESTAMP) USING kafka "
                             "OPTIONS (event_time 'ts', watermark '5 seconds');\n"
                             "CREATE TABLE out USING kafka AS SELECT a FROM t;", "q.sql"))
    assert text.endswith("}\n") and text.startswith('{\n  "format": "theseus.plan/1",\n')
    assert json.loads(text)["nodes"][0]["id"] == "t"
