"""The downstream shadow of a cascade: where it reads before and after the propagated cut.

In a cascade (``theseus migrate start UP.json DOWN.json``) the downstream's new query must
compute the new downstream plan over the *new* upstream plan's output over all input.  Before
the upstream's cut that output exists only in the upstream shadow's side topic
``<topic>.shadow``; from the cut on it is in the real topic ``<topic>``, after the control
events the upstream's hand-over writes there (the propagated cut).  The migrator tells the
downstream shadow's gated source where to switch with one file, read at every trigger:

``<store>/gates/<instance>.switch.json``::

    {"topic": "<topic>",            # the real topic (the plan's source topic)
     "side": "<topic>.shadow",      # read first
     "side_from": {"0": 0},         # the upstream shadow's first offsets there
     "side_end": {"0": 812},        # known at the upstream's hand-over: where its pre-cut
     "at": {"0": 40, "1": 38}}      #   output ends, and the propagated cut in <topic>

A missing ``side_end``/``at`` means: not known yet, read on in the side topic.  The source's
offsets name both topics, ``{"<topic>.shadow": {...}, "<topic>": {...}}``; the real topic
appears in them with one batch that reads the side topic's tail and nothing of the real
topic (its range there is empty, from ``at`` to ``at``), so that every batch of real input
starts at or beyond the propagated cut and the start gate (:mod:`gates.startgate`) can open
from it.  The plain reader reads such offsets too (it takes its topic's entry): after the
switch the file may go.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from compat.errors import GateStateError
from gates.files import atomic_write_json, read_json
from gates.state import offsets_to_json


def switch_path(store: str | os.PathLike[str], instance: str) -> Path:
    return Path(store) / "gates" / f"{instance}.switch.json"


def write_switch(store: str | os.PathLike[str], instance: str, *, topic: str, side: str,
                 side_from: dict[int, int],
                 side_end: dict[int, int] | None = None,
                 at: dict[int, int] | None = None) -> None:
    """Written by the migrator before the downstream shadow starts (``side_end`` and ``at``
    unknown), then again at the upstream's hand-over with both."""
    if topic == side:
        raise GateStateError("the side topic is the topic itself", expected="<topic>.shadow",
                             found=side)
    doc: dict[str, Any] = {"topic": topic, "side": side,
                           "side_from": offsets_to_json({side: side_from})[side]}
    if side_end is not None and at is not None:
        doc["side_end"] = offsets_to_json({side: side_end})[side]
        doc["at"] = offsets_to_json({topic: at})[topic]
    Path(store, "gates").mkdir(parents=True, exist_ok=True)
    atomic_write_json(switch_path(store, instance), doc, indent=None)


def read_switch(store: str | os.PathLike[str], instance: str,
                topic: str | None = None) -> dict[str, Any] | None:
    """The switch of ``instance`` (for its source of ``topic`` when given), None when there
    is none: a plain query, or a source of another topic."""
    path = switch_path(store, instance)
    doc = read_json(path, "switch file")
    if doc is None:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("topic"), str) or \
            not isinstance(doc.get("side"), str):
        raise GateStateError("malformed switch file", file=str(path), pointer="",
                             expected='{"topic": ..., "side": ..., "side_from": {...}}',
                             found=json.dumps(doc)[:200])
    if topic is not None and doc["topic"] != topic:
        return None
    out: dict[str, Any] = {"topic": doc["topic"], "side": doc["side"]}
    for name in ("side_from", "side_end", "at"):
        v = doc.get(name)
        if v is None:
            continue
        try:
            out[name] = {int(p): int(o) for p, o in v.items()}
        except (AttributeError, TypeError, ValueError):
            raise GateStateError("malformed switch file", file=str(path), pointer=f"/{name}",
                                 expected="integer partitions and offsets",
                                 found=json.dumps(v)[:200]) from None
    return out
