"""Readers of plan files that ``compat`` cannot read itself, registered by the package
that can.

A PySpark job file (``FILE.py[:FUNCTION]``) is read by running it under Spark, which
``compat`` never imports.  ``migrate`` registers its reader here when it is imported (the
``theseus`` command is ``migrate.cli``), and :func:`compat.check.load_plan` calls it: compat
names no module of migrate, and ``theseus check`` on JSON and SQL never imports PySpark.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING

from compat.errors import JobError

if TYPE_CHECKING:  # compat.model is not needed to register or look up a loader
    from compat.model import Plan

#: the builder function a job file defines when its target names none (``FILE.py``)
BUILDER = "build"

#: reads ``path`` (``raw``: its bytes when they do not come from disk) into a validated plan
JobLoader = Callable[[str, "bytes | None"], "Plan"]

_JOB_LOADERS: list[JobLoader] = []


def register_job_loader(loader: JobLoader) -> None:
    """Make ``loader`` the reader of PySpark job files (the last one registered wins)."""
    _JOB_LOADERS.append(loader)


def job_loader(path: str) -> JobLoader:
    """The registered reader of job files; :class:`JobError` naming ``path`` when none
    is (only ``compat`` was imported, not ``migrate``)."""
    if not _JOB_LOADERS:
        raise JobError("a PySpark job file is read by running it under Spark, which needs "
                       "theseus's migrate package", file=path,
                       expected="a job loader registered by migrate", found="none",
                       hint="run it through the theseus command, or import migrate first")
    return _JOB_LOADERS[-1]


def defines_builder(raw: bytes, function: str = BUILDER) -> bool:
    """Whether the Python source ``raw`` is a job: its module defines ``function`` at the
    top level (``def build(spark)``, or ``build = ...``).  Other ``.py`` files beside the
    jobs are the helpers they import, which a fleet or ``check --against`` skips.

    Read from the syntax tree, never by importing: importing runs the file's code and
    needs Spark, and deciding which files to import must cost neither.  What the function
    builds (a streaming writer, perhaps through a helper) is the importer's to check, so a
    job whose ``build`` calls a helper's ``.writeStream`` is still a job.  A file that does
    not parse is taken for a job: importing it reports the syntax error, where skipping it
    would drop a query without a word."""
    try:
        tree = ast.parse(raw)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the source
        return True
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == function:
            return True
        targets = stmt.targets if isinstance(stmt, ast.Assign) else \
            [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == function for t in targets):
            return True
    return False


__all__ = ["BUILDER", "JobLoader", "defines_builder", "job_loader", "register_job_loader"]
