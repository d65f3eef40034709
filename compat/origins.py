"""Positions of a plan imported from a PySpark job: where each step's DataFrame call was
written, from the ``x-origin`` key the importer gives every node
(``migrate.adopt.origins``): ``{"file": "job.py", "line": 24, "column": 8}``, the file
relative to the job file's folder.

The positions are ``Plan.positions``, as a SQL script's are, so reports place a job's
findings as they place a script's (``compat.report``).  The checker never reads them: an
``x-`` key changes no verdict and no signature.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping
from typing import Any

from compat.model import Plan, Position

#: the node key the importer writes an origin under
KEY = "x-origin"


def origin(extras: Mapping[str, Any]) -> tuple[str, int, int] | None:
    """A node's origin (from its ``x-`` keys) as (file, line, column), None when it has
    none or it is not one: an ``x-`` key is free-form, a hand-edited one is ignored, never
    an error."""
    o = extras.get(KEY)
    if not isinstance(o, dict):
        return None
    file, line, col = o.get("file"), o.get("line"), o.get("column", 1)
    if not (isinstance(file, str) and file and _count(line) and _count(col)):
        return None
    return file, line, col


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def origin_positions(plan: Plan) -> dict[str, Position]:
    """The position of every node of ``plan`` (a job's) that carries an origin, by its
    pointer; a file other than the job's own is named relative to where the plan's file
    is (a helper module beside the job)."""
    own = posixpath.basename(plan.file)
    folder = posixpath.dirname(plan.file)
    out: dict[str, Position] = {}
    for nid, node in plan.nodes.items():
        o = origin(node.extras)
        ptr = plan.pointers.get(nid)
        if o is None or ptr is None:
            continue
        file, line, col = o
        other = None if file == own else posixpath.normpath(posixpath.join(folder, file))
        out[ptr] = Position(line, col, line, col, other)
    return out


def with_origins(plan: Plan) -> Plan:
    """``plan`` (imported from a job) with the positions its origins give."""
    plan.positions = origin_positions(plan)
    return plan


def relocate(plan: Plan, file: str, root: str, prefix: str) -> Plan:
    """``plan``, read from a checkout at ``root``, shown as ``file`` (``HEAD:jobs/a.py``):
    its positions in other files of that checkout become ``prefix`` + their path in it, so
    that no report names the temporary checkout."""
    root = root.rstrip("/") + "/"
    positions = {}
    for ptr, pos in plan.positions.items():
        if pos.file and pos.file.startswith(root):
            pos = pos._replace(file=prefix + pos.file[len(root):])
        positions[ptr] = pos
    return dataclasses.replace(plan, file=file, positions=positions)


__all__ = ["KEY", "origin", "origin_positions", "relocate", "with_origins"]
