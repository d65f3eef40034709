"""Spark SQL to ``theseus.plan/1``: ``theseus plan compile query.sql``.

Public API::

    compile_sql(text, file="<sql>") -> dict   # the validated plan document
    dumps(doc) -> str                          # the canonical JSON text (ends with a newline)
    COMPILER_VERSION                           # recorded in the plan's metadata

Errors are ``compat.errors.SqlError`` (exit code 2), pointing at the SQL line and column.
"""

from __future__ import annotations

import json
from typing import Any

from compat.errors import SqlError
from compat.sql.compiler import COMPILER_VERSION, compile_script, compile_sql


def dumps(doc: dict[str, Any]) -> str:
    """The plan document as written to files: two-space indented JSON, key order kept."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def compile_file(path: str) -> dict[str, Any]:
    """Read and compile a SQL file (``-`` reads standard input)."""
    from compat.sql.load import read_sql

    return compile_sql(read_sql(path), "<stdin>" if path == "-" else path)


__all__ = ["COMPILER_VERSION", "SqlError", "compile_file", "compile_script", "compile_sql",
           "dumps"]
