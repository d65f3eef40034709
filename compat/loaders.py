"""Readers of plan files that ``compat`` cannot read itself, registered by the package
that can.

A PySpark job file (``FILE.py[:FUNCTION]``) is read by running it under Spark, which
``compat`` never imports.  ``migrate`` registers its reader here when it is imported (the
``theseus`` command is ``migrate.cli``), and :func:`compat.check.load_plan` calls it: compat
names no module of migrate, and ``theseus check`` on JSON and SQL never imports PySpark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from compat.errors import JobError

if TYPE_CHECKING:  # compat.model is not needed to register or look up a loader
    from compat.model import Plan

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


__all__ = ["JobLoader", "job_loader", "register_job_loader"]
