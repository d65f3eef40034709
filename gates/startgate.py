"""The start gate as the sink sees it: a file the migrator writes, read at every batch.

``<store>/gates/<instance>.start.json``: ``{"open": false, "migration": id}``.  A missing
file means open (a query started by ``theseus run`` writes its output).  A shadow query is
started with the file saying closed: its output is discarded (or written to a side topic)
until the migrator opens the gate at the cutover.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def start_gate_path(store: str | os.PathLike[str], instance: str) -> Path:
    return Path(store) / "gates" / f"{instance}.start.json"


def write_start_gate(store: str | os.PathLike[str], instance: str, is_open: bool,
                     migration: str | None = None,
                     from_offsets: dict[str, dict[int, int]] | None = None,
                     follow: str | None = None,
                     follow_offsets: dict[str, dict[int, int]] | None = None) -> None:
    """``from_offsets``: closed, but open for every batch that starts at or beyond them (the
    cut C; the gated source acknowledges a batch's start offsets before the batch runs) once
    the ``follow`` query (the old one) acknowledged ``follow_offsets`` (its part of C)."""
    path = start_gate_path(store, instance)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        doc: dict[str, Any] = {"open": is_open, "migration": migration}
        if from_offsets:
            doc["from"] = {t: {str(p): int(o) for p, o in ps.items()}
                           for t, ps in from_offsets.items()}
        if follow:
            doc["follow"] = follow
            doc["follow_from"] = {t: {str(p): int(o) for p, o in ps.items()}
                                  for t, ps in (follow_offsets or {}).items()}
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_start_gate(store: str | os.PathLike[str], instance: str) -> dict[str, Any]:
    try:
        return json.loads(start_gate_path(store, instance).read_text())
    except FileNotFoundError:
        return {"open": True}


class StartGate:
    """Passed to the sink: ``is_open(batch_id)`` reads the gate file for every batch."""

    def __init__(self, store: str | os.PathLike[str], instance: str) -> None:
        self.store = str(store)
        self.instance = instance

    def is_open(self, batch_id: int) -> bool:
        doc = read_start_gate(self.store, self.instance)
        if doc.get("open", True):
            return True
        frm = doc.get("from")
        if not frm:
            return False
        from gates.state import is_acked

        # the batch about to be written starts where this instance's sources acknowledged
        if not is_acked(self.store, self.instance, frm):
            return False
        follow = doc.get("follow")
        return not follow or is_acked(self.store, follow, doc.get("follow_from") or {})

    def __call__(self, batch_id: int) -> bool:
        return self.is_open(batch_id)
