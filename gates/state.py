"""Gate state as read by a running query, and the acknowledgements its sources write.

Files under ``<store>/gates/``:

``<query>.json`` (written by the migrator, read by the query's gated sources every trigger)::

    {"mode": "open" | "paused" | "capped",
     "cap": {"<topic>": {"<partition>": offset}},   # exclusive end, used when mode == capped
     "epoch": 7}                                     # bumped by the writer on every change

A missing file means ``open``. Under ``capped`` a source admits offsets ``< cap``; a partition
(or topic) missing from the cap admits nothing more. Under ``paused`` nothing more is admitted.

``<query>.ack.json`` (written by the gated sources)::

    {"query": q,
     "topics": {"<topic>": {"offsets": {"<partition>": offset},  # everything below is done
                            "mode": ..., "epoch": ..., "at_cap": bool, "time": unix_seconds}}}

A source writes its topic's entry whenever Spark asks it for a new batch (``latestOffset``
with ``start``): Spark asks only after the previous batch is committed, sink included, so
every offset below ``start`` has been fully processed. ``at_cap`` says ``start`` reached the
cap in every partition of the cap (``mode == capped``), or the source is paused.
All writes are atomic (temp file + ``os.replace``); ack updates are merged under a file lock
because several sources of one query share the file.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("open", "paused", "capped")
Offsets = dict[str, dict[int, int]]


class GateStateError(ValueError):
    """A gate or ack file is unreadable or malformed."""


def _norm_offsets(doc: Any, where: str) -> Offsets:
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise GateStateError(f"{where}: expected an object of topics, found {type(doc).__name__}")
    out: Offsets = {}
    for topic, parts in doc.items():
        if not isinstance(parts, Mapping):
            raise GateStateError(f"{where}/{topic}: expected an object of partitions")
        try:
            out[str(topic)] = {int(p): int(o) for p, o in parts.items()}
        except (TypeError, ValueError) as e:
            raise GateStateError(f"{where}/{topic}: partition and offset must be integers") from e
    return out


def offsets_to_json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """``{topic: {partition: offset}}`` with string partition keys, partitions sorted."""
    return {t: {str(p): int(o) for p, o in sorted(ps.items(), key=lambda kv: int(kv[0]))}
            for t, ps in offsets.items()}


@dataclass(frozen=True)
class GateState:
    mode: str = "open"
    cap: Offsets = field(default_factory=dict)
    epoch: int = 0
    # a shadow's cap at the cut: it reads on past the cap once every topic of the cap stands
    # there; its start gate holds the output until the ``follow`` query (the old one) has
    # acknowledged the cut (gates.startgate)
    follow: str | None = None
    # the old query's cap at the cut of migration ``retire``: its input ends there. Once it
    # acknowledged the cap (and the migration was not vetoed) it has handed over: its sink
    # writes nothing more (a batch driven by the watermark alone would repeat what the new
    # query writes) and its host stops it (:func:`retired`)
    retire: str | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise GateStateError(f"gate mode must be one of {MODES}, found {self.mode!r}")

    def limit(self, topic: str, partition: int) -> int | None:
        """Highest admissible end offset (exclusive) for a partition; None = unlimited.

        Returns None under ``open``; under ``capped`` the cap (or -1 when the partition is
        not in the cap: admit nothing more); under ``paused`` -1.
        """
        if self.mode == "open":
            return None
        if self.mode == "paused":
            return -1
        return self.cap.get(topic, {}).get(int(partition), -1)

    def to_dict(self) -> dict:
        doc = {"mode": self.mode, "cap": offsets_to_json(self.cap), "epoch": self.epoch}
        if self.follow:
            doc["follow"] = self.follow
        if self.retire:
            doc["retire"] = self.retire
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping, where: str = "gate") -> GateState:
        if not isinstance(doc, Mapping):
            raise GateStateError(f"{where}: expected a JSON object")
        try:
            epoch = int(doc.get("epoch", 0))
        except (TypeError, ValueError) as e:
            raise GateStateError(f"{where}/epoch: expected an integer") from e
        follow, retire = doc.get("follow"), doc.get("retire")
        return cls(mode=str(doc.get("mode", "open")),
                   cap=_norm_offsets(doc.get("cap"), f"{where}/cap"), epoch=epoch,
                   follow=str(follow) if follow else None,
                   retire=str(retire) if retire else None)


OPEN = GateState()


def gates_dir(store: str | os.PathLike) -> Path:
    return Path(store) / "gates"


def gate_path(store: str | os.PathLike, query: str) -> Path:
    return gates_dir(store) / f"{query}.json"


def ack_path(store: str | os.PathLike, query: str) -> Path:
    return gates_dir(store) / f"{query}.ack.json"


def _atomic_write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_gate(store: str | os.PathLike, query: str) -> GateState:
    """The query's gate state; ``open`` when no file exists. Raises GateStateError if corrupt."""
    p = gate_path(store, query)
    try:
        text = p.read_text()
    except FileNotFoundError:
        return OPEN
    try:
        return GateState.from_dict(json.loads(text), str(p))
    except ValueError as e:
        raise GateStateError(f"{p}: {e}") from e


def write_gate(store: str | os.PathLike, query: str, state: GateState) -> None:
    """Atomically replace the query's gate state."""
    _atomic_write_json(gate_path(store, query), state.to_dict())


def clear_gate(store: str | os.PathLike, query: str) -> None:
    """Remove the gate file (the query is open again)."""
    try:
        gate_path(store, query).unlink()
    except FileNotFoundError:
        pass


def read_ack(store: str | os.PathLike, query: str) -> dict:
    """The raw ack document (``{"query", "topics": {...}}``); empty topics when none yet."""
    p = ack_path(store, query)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        return {"query": query, "topics": {}}
    except ValueError as e:
        raise GateStateError(f"{p}: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("topics", {}), dict):
        raise GateStateError(f"{p}: malformed ack document")
    doc.setdefault("topics", {})
    return doc


def acked_offsets(store: str | os.PathLike, query: str) -> Offsets:
    """``{topic: {partition: offset}}``: every offset below is done (source + sink)."""
    doc = read_ack(store, query)
    return {t: {int(p): int(o) for p, o in e.get("offsets", {}).items()}
            for t, e in doc["topics"].items()}


@contextmanager
def _ack_lock(store: str | os.PathLike, query: str) -> Iterator[None]:
    """One lock for everything that reads and rewrites a query's ack document."""
    d = gates_dir(store)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f".{query}.ack.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def write_ack(
    store: str | os.PathLike, query: str, topic: str, offsets: Mapping[int, int],
    state: GateState,
) -> None:
    """Record (merging with other topics' entries) that ``topic`` is done below ``offsets``."""
    offs = {int(p): int(o) for p, o in offsets.items()}
    if state.mode == "paused":
        at_cap = True
    elif state.mode == "capped":
        cap = state.cap.get(topic, {})
        at_cap = all(offs.get(p, 0) >= c for p, c in cap.items())
    else:
        at_cap = False
    entry = {"offsets": offsets_to_json({topic: offs})[topic], "mode": state.mode,
             "epoch": state.epoch, "at_cap": at_cap, "time": round(time.time(), 3)}
    with _ack_lock(store, query):
        try:
            doc = read_ack(store, query)
        except GateStateError:
            doc = {"query": query, "topics": {}}
        doc["query"] = query
        doc["topics"][topic] = entry
        _atomic_write_json(ack_path(store, query), doc)


def pending_path(store: str | os.PathLike, query: str) -> Path:
    # a dot file: local to the host running the query, never synced to a shared store
    return gates_dir(store) / f".{query}.pending.json"


def write_pending(store: str | os.PathLike, query: str, topic: str,
                  offsets: Mapping[int, int], state: GateState) -> None:
    """The batch Spark is about to run takes ``topic`` up to its cap (``offsets``): the sink
    acknowledges it as soon as that batch commits (:func:`promote_pending`), instead of the
    source at the next trigger."""
    with _ack_lock(store, query):
        p = pending_path(store, query)
        try:
            doc = json.loads(p.read_text())
        except (FileNotFoundError, ValueError):
            doc = {}
        doc[topic] = {"offsets": offsets_to_json({topic: offsets})[topic],
                      "state": state.to_dict()}
        _atomic_write_json(p, doc)


def promote_pending(store: str | os.PathLike, query: str) -> bool:
    """Called by the sink after a batch committed: acknowledge what :func:`write_pending`
    recorded for it. Spark plans a batch only after the previous one committed, so the
    pending offsets are those of the batch that just committed. Never moves an ack back.
    Returns whether anything was pending (the batch reached a cap)."""
    p = pending_path(store, query)
    try:
        doc = json.loads(p.read_text())
    except (FileNotFoundError, ValueError):
        return False
    done = acked_offsets(store, query)
    for topic, e in doc.items():
        offs = {int(k): int(v) for k, v in e.get("offsets", {}).items()}
        have = done.get(topic, {})
        if all(have.get(k, -1) >= v for k, v in offs.items()):
            continue
        write_ack(store, query, topic, {k: max(v, have.get(k, v)) for k, v in offs.items()},
                  GateState.from_dict(e.get("state", {}), f"{p}/{topic}/state"))
    try:
        p.unlink()
    except FileNotFoundError:
        pass
    return True


def is_acked(store: str | os.PathLike, query: str, cap: Mapping[str, Mapping[int, int]],
             epoch: int | None = None) -> bool:
    """True when every partition of ``cap`` is acknowledged at (or beyond) its cap offset.

    With ``epoch``, only acks written under that gate epoch (or later) count.
    """
    try:
        doc = read_ack(store, query)
    except GateStateError:
        return False
    return _acked_in(doc, cap, epoch)


def _acked_in(doc: Mapping, cap: Mapping[str, Mapping[int, int]],
              epoch: int | None = None) -> bool:
    for topic, parts in cap.items():
        e = doc["topics"].get(topic)
        if e is None or (epoch is not None and int(e.get("epoch", -1)) < epoch):
            return False
        offs = {int(p): int(o) for p, o in e.get("offsets", {}).items()}
        if any(offs.get(int(p), -1) < int(c) for p, c in parts.items()):
            return False
    return True


def handed_over(store: str | os.PathLike, query: str, cap: Mapping[str, Mapping[int, int]],
                migration: str) -> bool:
    """True once ``query`` (the old one) acknowledged ``cap`` (the cut) and ``migration``
    was not vetoed before: from then on the shadow writes the output from the cut on."""
    try:
        doc = read_ack(store, query)
    except GateStateError:
        return False
    return doc.get("veto") != migration and _acked_in(doc, cap)


def retired(store: str | os.PathLike, query: str) -> bool:
    """True once ``query`` handed its output over to a migration's new query: its gate is
    the cut of a migration (``retire``) and it acknowledged that cut unvetoed. Nothing it
    computes from then on may reach the output."""
    try:
        g = read_gate(store, query)
    except GateStateError:
        return False
    if not g.retire or g.mode != "capped":
        return False
    return handed_over(store, query, g.cap, g.retire)


def vetoed(store: str | os.PathLike, query: str, migration: str) -> bool:
    try:
        return read_ack(store, query).get("veto") == migration
    except GateStateError:
        return False


def veto(store: str | os.PathLike, query: str, cap: Mapping[str, Mapping[int, int]],
         migration: str) -> bool:
    """Abort's side of the hand-over, atomic with ``query``'s acknowledgements (same lock,
    same file): veto ``migration`` unless ``query`` already acknowledged ``cap``. Returns
    False when it is too late (the shadow may be writing the output already)."""
    with _ack_lock(store, query):
        try:
            doc = read_ack(store, query)
        except GateStateError:
            doc = {"query": query, "topics": {}}
        if doc.get("veto") == migration:
            return True
        if _acked_in(doc, cap):
            return False
        doc["veto"] = migration
        _atomic_write_json(ack_path(store, query), doc)
        return True


def wait_for_ack(store: str | os.PathLike, query: str, cap: Mapping[str, Mapping[int, int]],
                 *, epoch: int | None = None, timeout: float = 60.0,
                 interval: float = 0.1) -> bool:
    """Poll :func:`is_acked` until true or ``timeout`` seconds pass; return the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if is_acked(store, query, cap, epoch):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
