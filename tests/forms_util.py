"""One query in three forms: the differential tests of ``test_three_forms`` (SQL against
JSON) and ``integration/test_three_forms`` (and PySpark jobs, which need Spark to import).

Every SQL upgrade pair of the fixtures is written three ways:

* **sql** — compiled as ``theseus check`` compiles it (the optimizer prunes every column the
  query does not read out of the source schemas);
* **json** — compiled without ``prune_columns``: the plan a user writes by hand, declaring
  whole topics;
* **pyspark** — that JSON plan exported as a PySpark job (``plan export --pyspark``) and
  imported back (``plan import``), where the DataFrame API can say it.

The same change must get the same verdict in every form.  Findings may differ only where the
forms really say different things: ``source-column-added``/``-removed`` (the compiled plan's
source declares what the query reads, so starting to read a column adds one to it), and
``identical`` against ``in_place`` when those are a pair's only findings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from compat.check import check_files, parse_require
from compat.sql.compiler import compile_script
from tests.conftest import UPGRADES

SQL_CASES = [c for c in UPGRADES if (c / "old.sql").exists()]
#: codes about the declared source schema, which the compiler's pruning rewrites
DECLARED = {"source-column-added", "source-column-removed"}

_EXCLUDED = re.compile(r"SET\s+theseus\.optimizer\.excluded_rules\s*=\s*'([^']*)'", re.I)


def unpruned(text: str) -> str:
    """The script with ``prune_columns`` added to the rules it leaves out."""
    m = _EXCLUDED.search(text)
    if m:
        rules = ",".join(x for x in (m.group(1), "prune_columns") if x)
        return text[:m.start(1)] + rules + text[m.end(1):]
    return "SET theseus.optimizer.excluded_rules = 'prune_columns';\n" + text


def compiled(case: Path, side: str, prune: bool) -> dict:
    path = case / f"{side}.sql"
    text = path.read_text()
    doc = compile_script(text if prune else unpruned(text), str(path)).document
    doc.pop("metadata", None)
    return doc


def outcome(case: Path, paths: list[str]) -> tuple[str, frozenset[str]]:
    expect = json.loads((case / "expect.json").read_text())
    r = check_files(*paths, require=parse_require(expect.get("require")),
                    schema_compat=expect.get("schema_compat", "forward"))
    return r.verdict, frozenset(f.code for f in r.findings)


def agree(a: tuple[str, frozenset[str]], b: tuple[str, frozenset[str]]) -> bool:
    """Two forms' outcomes say the same (see the module's docstring)."""
    (va, ca), (vb, cb) = a, b
    if ca - DECLARED != cb - DECLARED:
        return False
    restart = {"identical", "in_place"}
    if va != vb and not ({va, vb} <= restart and not (ca | cb) - DECLARED):
        return False
    return True
