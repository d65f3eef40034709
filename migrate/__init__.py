"""Plan to Spark builder, the query host, migrations and the command line.

Importing any of it registers the reader of PySpark job files with ``compat``
(:mod:`compat.loaders`), so that ``theseus check`` takes a job file like a JSON plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compat.loaders import register_job_loader

if TYPE_CHECKING:
    from compat.model import Plan


def _load_job_plan(path: str, raw: bytes | None = None) -> Plan:
    # migrate.adopt (the job importer) is loaded only when a job file is read: every other
    # command, `theseus check` of JSON and SQL first, starts without it
    from migrate.adopt import load_job_plan

    return load_job_plan(path, raw)


register_job_loader(_load_job_plan)
