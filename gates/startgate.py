"""The start gate as the sink sees it: a file the migrator writes, read at every batch.

``<store>/gates/<instance>.start.json``: ``{"open": false, "migration": id}``.  A missing
file means open (a query started by ``theseus run`` writes its output).  A shadow query is
started with the file saying closed: its output is discarded (or written to a side topic)
until the migrator opens the gate at the cutover.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from compat.errors import GateError, GateStateError
from gates.files import atomic_write_json
from gates.state import handed_over, is_acked, offsets_to_json, vetoed


def start_gate_path(store: str | os.PathLike[str], instance: str) -> Path:
    return Path(store) / "gates" / f"{instance}.start.json"


def write_start_gate(store: str | os.PathLike[str], instance: str, is_open: bool,
                     migration: str | None = None,
                     from_offsets: dict[str, dict[int, int]] | None = None,
                     follow: str | None = None,
                     follow_offsets: dict[str, dict[int, int]] | None = None,
                     reconcile: dict[str, Any] | None = None,
                     hold: bool = False) -> None:
    """``from_offsets``: closed, but open for every batch that starts at or beyond them (the
    cut C; the gated source acknowledges a batch's start offsets before the batch runs) once
    the ``follow`` query (the old one) acknowledged ``follow_offsets`` (its part of C).
    ``reconcile``: the first batch written to the output carries the reconciliation's
    corrections (:mod:`gates.reconcile`): ``{"topic": side topic, "from": {partition:
    offset}, "migration": id}``; kept when the gate opens.
    ``hold``: a batch from the cut waits even after the followed query handed over, until
    the migrator opens the gate: the upstream of a cascade, whose first output from the cut
    must land after the control events its hand-over writes into the output topic."""
    doc: dict[str, Any] = {"open": is_open, "migration": migration}
    if hold:
        doc["hold"] = True
    if reconcile:
        doc["reconcile"] = reconcile
    if from_offsets:
        doc["from"] = offsets_to_json(from_offsets)
    if follow:
        doc["follow"] = follow
        doc["follow_from"] = offsets_to_json(follow_offsets or {})
    atomic_write_json(start_gate_path(store, instance), doc, indent=None)


def read_start_gate(store: str | os.PathLike[str], instance: str) -> dict[str, Any]:
    path = start_gate_path(store, instance)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {"open": True}
    except ValueError as e:
        raise GateStateError("unreadable start gate", file=str(path),
                             expected="a JSON object", found=str(e)) from None
    if not isinstance(doc, dict):
        raise GateStateError("malformed start gate", file=str(path), pointer="",
                             expected="a JSON object", found=type(doc).__name__)
    return doc


class Abandoned(GateError):
    """The host stops while a batch waits at the start gate: the batch is not written (nor
    committed), and runs again when the query restarts."""


class StartGate:
    """Passed to the sink: ``is_open(batch_id)`` reads the gate file for every batch.
    ``abandon``: set by the host when it stops; a batch waiting at the gate then raises
    :class:`Abandoned` instead of holding the host's stop (and ``abandoned`` says so)."""

    def __init__(self, store: str | os.PathLike[str], instance: str) -> None:
        self.store = str(store)
        self.instance = instance
        self.abandon = threading.Event()
        self.abandoned: int | None = None  # the batch abandoned at the gate

    def is_open(self, batch_id: int, wait: bool = True) -> bool:
        """Whether the batch about to be written goes to the output. Under a gate that opens
        *from* the cut, a batch that starts at the cut waits here (``wait``) until the
        followed (old) query hands over: its last batch before the cut is committed. The
        shadow computes that batch while the old query finishes, so the output switches as
        soon as the old query's last output is committed."""
        said = time.monotonic()
        while True:
            doc = read_start_gate(self.store, self.instance)
            if doc.get("open", True):
                return True
            frm = doc.get("from")
            if not frm:
                return False
            # the batch starts where this instance's sources acknowledged (before it ran)
            if not is_acked(self.store, self.instance, frm):
                return False
            follow, mig = doc.get("follow"), doc.get("migration") or ""
            if not doc.get("hold") and (not follow or handed_over(
                    self.store, follow, doc.get("follow_from") or {}, mig)):
                return True
            if not wait or vetoed(self.store, follow, mig):
                return False
            if self.abandon.is_set():
                self.abandoned = batch_id
                raise Abandoned(f"batch {batch_id} of '{self.instance}' waited at the start "
                                f"gate for '{follow}' to finish the input before the cut; "
                                "the host stops, and the batch runs again when the query "
                                "restarts")
            if time.monotonic() - said > 30:
                said = time.monotonic()
                print(f"theseus start gate {self.instance}: batch {batch_id} waits for "
                      f"'{follow}' to finish the input before the cut", file=sys.stderr)
            time.sleep(0.02)  # two small files a look; the wait is the output's stall

    def at_cut(self) -> bool:
        """The batch about to be written starts at the cut and the gate is not open yet:
        :meth:`is_open` will hold it until the followed query hands over."""
        doc = read_start_gate(self.store, self.instance)
        frm = doc.get("from")
        return not doc.get("open", True) and bool(frm) and is_acked(self.store,
                                                                     self.instance, frm)

    def __call__(self, batch_id: int) -> bool:
        return self.is_open(batch_id)
