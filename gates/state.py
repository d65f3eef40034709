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
All writes are atomic (:func:`gates.files.atomic_write`); ack updates are merged under a file
lock because several sources of one query share the file.  An acknowledged offset never moves
back: a write that would lower one raises :class:`~compat.errors.OffsetRegression` (a bug, a
topic deleted and created again, or a query restarted from an older checkpoint) instead of
keeping the larger offset.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat.errors import GateStateError, OffsetRegression
from gates.deadline import Deadline
from gates.files import atomic_write_json

MODES = ("open", "paused", "capped")
Offsets = dict[str, dict[int, int]]


def _norm_offsets(doc: Any, file: str | None, pointer: str) -> Offsets:
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise GateStateError("malformed offsets", file=file, pointer=pointer,
                             expected="an object of topics", found=type(doc).__name__)
    out: Offsets = {}
    for topic, parts in doc.items():
        if not isinstance(parts, Mapping):
            raise GateStateError("malformed offsets", file=file, pointer=f"{pointer}/{topic}",
                                 expected="an object of partitions",
                                 found=type(parts).__name__)
        try:
            out[str(topic)] = {int(p): int(o) for p, o in parts.items()}
        except (TypeError, ValueError):
            raise GateStateError("malformed offsets", file=file, pointer=f"{pointer}/{topic}",
                                 expected="integer partitions and offsets",
                                 found=json.dumps(parts)) from None
    return out


def check_forward(before: Mapping[str, Mapping[int, int]],
                  after: Mapping[str, Mapping[int, int]], what: str, *,
                  file: str | None = None) -> None:
    """Raise :class:`OffsetRegression` when an offset of ``after`` is below the same
    partition's offset in ``before``: offsets only move forward.  ``what`` names them."""
    for topic, parts in after.items():
        old = before.get(topic, {})
        for p, o in sorted(parts.items()):
            if int(p) in old and int(o) < int(old[int(p)]):
                raise OffsetRegression(
                    f"{what} went backwards (a bug, the topic deleted and created again, or a "
                    "query restarted from an older checkpoint)", topic=topic,
                    partition=int(p), file=file, expected=f"offset {old[int(p)]} or later",
                    found=f"offset {o}")


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
    # the query whose migration's lease holds this gate: once that lease is stale the gated
    # source treats the gate as open (:func:`gates.lease.lifted` says which gates may be)
    lease: str | None = None
    # the lease epoch of the owner that wrote it (the fencing token it was written under)
    owner: int = 0
    # the cap's offsets are the migration's own control events (the cut C of control-events
    # mode, or the one a cascade's upstream propagated): a query that acknowledged C + 1 read
    # the control record at C, which gated sources skip, and no row past the cut
    marks: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise GateStateError("unknown gate mode", pointer="/mode",
                                 expected=" | ".join(MODES), found=repr(self.mode))

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
        if self.lease:
            doc["lease"] = self.lease
        if self.owner:
            doc["owner"] = self.owner
        if self.marks:
            doc["marks"] = True
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping, where: str | None = None, pointer: str = "") -> GateState:
        """``where`` names the file, ``pointer`` the place of ``doc`` in it."""
        if not isinstance(doc, Mapping):
            raise GateStateError("malformed gate state", file=where, pointer=pointer,
                                 expected="a JSON object", found=type(doc).__name__)
        numbers = {}
        for name in ("epoch", "owner"):
            try:
                numbers[name] = int(doc.get(name, 0))
            except (TypeError, ValueError):
                raise GateStateError("malformed gate state", file=where,
                                     pointer=f"{pointer}/{name}", expected="an integer",
                                     found=repr(doc.get(name))) from None
        follow, retire, lease = doc.get("follow"), doc.get("retire"), doc.get("lease")
        try:
            return cls(mode=str(doc.get("mode", "open")),
                       cap=_norm_offsets(doc.get("cap"), where, f"{pointer}/cap"),
                       epoch=numbers["epoch"], follow=str(follow) if follow else None,
                       retire=str(retire) if retire else None,
                       lease=str(lease) if lease else None, owner=numbers["owner"],
                       marks=doc.get("marks") is True)
        except GateStateError as e:
            if e.pointer == "/mode":
                e.pointer = f"{pointer}/mode"
            raise e.with_location(file=where) from None


OPEN = GateState()


def gates_dir(store: str | os.PathLike) -> Path:
    return Path(store) / "gates"


def gate_path(store: str | os.PathLike, query: str) -> Path:
    return gates_dir(store) / f"{query}.json"


def ack_path(store: str | os.PathLike, query: str) -> Path:
    return gates_dir(store) / f"{query}.ack.json"


def read_gate(store: str | os.PathLike, query: str) -> GateState:
    """The query's gate state; ``open`` when no file exists. Raises GateStateError if corrupt."""
    p = gate_path(store, query)
    try:
        text = p.read_text()
    except FileNotFoundError:
        return OPEN
    return GateState.from_dict(_parse(text, p), str(p))


def write_gate(store: str | os.PathLike, query: str, state: GateState) -> None:
    """Atomically replace the query's gate state."""
    atomic_write_json(gate_path(store, query), state.to_dict())


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
        doc = _parse(p.read_text(), p)
    except FileNotFoundError:
        return {"query": query, "topics": {}}
    if not isinstance(doc, dict):
        raise GateStateError("malformed acknowledgements", file=str(p), pointer="",
                             expected="a JSON object", found=type(doc).__name__)
    if not isinstance(doc.get("topics", {}), dict):
        raise GateStateError("malformed acknowledgements", file=str(p), pointer="/topics",
                             expected="an object of topics",
                             found=type(doc["topics"]).__name__)
    doc.setdefault("topics", {})
    return doc


def _parse(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise GateStateError("unreadable JSON", file=str(path), expected="a JSON document",
                             found=str(e)) from None


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
    state: GateState, *, reader: str | None = None,
) -> None:
    """Record (merging with other topics' entries) that ``topic`` is done below ``offsets``.

    Raises :class:`OffsetRegression` when an offset is below what the topic's entry says and
    that entry was written by the same ``reader`` (the gated source that reads the topic; a
    plan may read one topic through two sources, whose positions differ): the query is
    behind what it acknowledged before."""
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
    if reader is not None:
        entry["reader"] = reader
    path = ack_path(store, query)
    with _ack_lock(store, query):
        try:
            doc = read_ack(store, query)
        except GateStateError:
            doc = {"query": query, "topics": {}}
        before = doc["topics"].get(topic)
        if isinstance(before, Mapping) and before.get("reader") == reader:
            have = _norm_offsets({topic: before.get("offsets", {})}, str(path), "/topics")
            check_forward(have, {topic: offs}, f"query '{query}': the acknowledged offset",
                          file=str(path))
        doc["query"] = query
        doc["topics"][topic] = entry
        atomic_write_json(path, doc)


def pending_path(store: str | os.PathLike, query: str) -> Path:
    # a dot file: local to the host running the query, never synced to a shared store
    return gates_dir(store) / f".{query}.pending.json"


def _read_pending(p: Path) -> dict:
    try:
        doc = json.loads(p.read_text())
    except (FileNotFoundError, ValueError):  # a torn file cannot be: written atomically
        return {}
    return doc if isinstance(doc, dict) else {}


def write_pending(store: str | os.PathLike, query: str, topic: str,
                  offsets: Mapping[int, int], state: GateState, *,
                  reader: str | None = None) -> None:
    """The batch Spark is about to run takes ``topic`` up to its cap (``offsets``): the sink
    acknowledges it as soon as that batch commits (:func:`promote_pending`), instead of the
    source at the next trigger."""
    with _ack_lock(store, query):
        p = pending_path(store, query)
        doc = _read_pending(p)
        doc[topic] = {"offsets": offsets_to_json({topic: offsets})[topic],
                      "state": state.to_dict(), "reader": reader}
        atomic_write_json(p, doc)


def drop_pending(store: str | os.PathLike, query: str, topic: str) -> None:
    """Forget ``topic``'s pending offsets: Spark asks a source for a new batch only after the
    previous batch committed, and its sink promoted what was pending then, so what is still
    pending now belongs to a batch that was planned but never run (the query stopped in
    between).  Promoted later, it would acknowledge offsets that no batch processed.  (Two
    sources of one topic may drop each other's: that only delays the acknowledgement to the
    source's next trigger.)"""
    p = pending_path(store, query)
    if not p.exists():
        return
    with _ack_lock(store, query):
        doc = _read_pending(p)
        if topic not in doc:
            return
        del doc[topic]
        if doc:
            atomic_write_json(p, doc)
        else:
            p.unlink(missing_ok=True)


def promote_pending(store: str | os.PathLike, query: str) -> bool:
    """Called by the sink after a batch committed: acknowledge what :func:`write_pending`
    recorded for it. Spark plans a batch only after the previous one committed, so the
    pending offsets are those of the batch that just committed: an acknowledgement beyond
    them raises :class:`OffsetRegression` (:func:`write_ack`), never papered over.
    Returns whether anything was pending (the batch reached a cap)."""
    p = pending_path(store, query)
    doc = _read_pending(p)
    if not doc:
        return False
    done = read_ack(store, query)["topics"]
    for topic, e in doc.items():
        offs = {int(k): int(v) for k, v in e.get("offsets", {}).items()}
        before = done.get(topic, {})
        have = {int(k): int(v) for k, v in before.get("offsets", {}).items()}
        if have == offs and before.get("reader") == e.get("reader"):
            continue  # acknowledged already (the source asked for the next batch first)
        write_ack(store, query, topic, offs,
                  GateState.from_dict(e.get("state", {}), str(p), f"/{topic}/state"),
                  reader=e.get("reader"))
    p.unlink(missing_ok=True)
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


def saw_cap(store: str | os.PathLike, query: str, topics: Iterable[str], epoch: int) -> bool:
    """True once ``query``'s source of every topic in ``topics`` acknowledged under gate
    epoch ``epoch`` (or later), wherever it stands: it read that gate, and every batch it
    plans from then on is bounded by it (Spark plans a batch only after the one before is
    committed, and the source acknowledges before it plans)."""
    try:
        doc = read_ack(store, query)
    except GateStateError:
        return False
    for topic in topics:
        e = doc["topics"].get(topic)
        if e is None or int(e.get("epoch", -1)) < epoch:
            return False
    return True


def handed_over(store: str | os.PathLike, query: str, cap: Mapping[str, Mapping[int, int]],
                migration: str) -> bool:
    """True once ``query`` (the old one) is capped at ``cap`` (the cut) by ``migration``,
    which retires it there, and acknowledged exactly ``cap`` (everything before the cut
    done, nothing from it read), unvetoed: from then on the shadow writes the output from
    the cut on, and the old query writes nothing more.

    Exactly, and under the cap that retires it: a query that read past the cut while its
    pause was lifted (:mod:`gates.lease`: the migrator's lease went stale before the cap at
    the cut was written) wrote output from the cut on, and is never handed over at it."""
    try:
        g = read_gate(store, query)
        doc = read_ack(store, query)
    except GateStateError:
        return False
    if g.retire != migration or g.mode != "capped":
        return False
    return doc.get("veto") != migration and _exactly_at(doc, cap, g.marks)


def _exactly_at(doc: Mapping, cap: Mapping[str, Mapping[int, int]], marks: bool = False
                ) -> bool:
    """Every partition acknowledged at its cut; with ``marks`` (the cut is the migration's
    control events) also just past it: the query read the control record at the cut (a
    pause lifted by a stale lease let it read on to the end of a topic whose last record
    was that control event: a cascade's downstream, whose upstream writes nothing after
    it) and nothing else."""
    slack = 1 if marks else 0
    for topic, parts in cap.items():
        e = doc["topics"].get(topic)
        if e is None:
            return False
        offs = {int(p): int(o) for p, o in e.get("offsets", {}).items()}
        if any(not int(c) <= offs.get(int(p), -1) <= int(c) + slack for p, c in parts.items()):
            return False
    return True


def overran(store: str | os.PathLike, query: str,
            cap: Mapping[str, Mapping[int, int]], *, marks: bool = False
            ) -> dict[str, dict[int, int]]:
    """Where ``query`` acknowledged input beyond ``cap`` (the cut), by topic and partition:
    it read past the cut (its pause was lifted before the cap was written) and can never be
    handed over at it.  Empty while it did not.  With ``marks`` (the cut is the migration's
    control events) the control record at the cut itself is not input past it."""
    try:
        done = acked_offsets(store, query)
    except GateStateError:
        return {}
    out: dict[str, dict[int, int]] = {}
    slack = 1 if marks else 0
    for t, parts in cap.items():
        for p, c in parts.items():
            o = done.get(t, {}).get(int(p))
            if o is not None and o > int(c) + slack:
                out.setdefault(t, {})[int(p)] = o
    return out


def retired(store: str | os.PathLike, query: str) -> bool:
    """True once ``query`` handed its output over to a migration's new query: its gate is
    the cut of a migration (``retire``) and it acknowledged that cut unvetoed. Nothing it
    computes from then on may reach the output."""
    try:
        g = read_gate(store, query)
    except GateStateError:
        return False
    if not g.retire:
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
    same file): veto ``migration`` unless ``query`` already handed over at ``cap``
    (:func:`handed_over`: the shadow decides by the same rule). Returns False when it is
    too late (the shadow may be writing the output already)."""
    with _ack_lock(store, query):
        try:
            doc = read_ack(store, query)
            g = read_gate(store, query)
        except GateStateError:
            doc, g = {"query": query, "topics": {}}, OPEN
        if doc.get("veto") == migration:
            return True
        if g.retire == migration and g.mode == "capped" and _exactly_at(doc, cap):
            return False
        doc["veto"] = migration
        atomic_write_json(ack_path(store, query), doc)
        return True


def wait_for_ack(store: str | os.PathLike, query: str, cap: Mapping[str, Mapping[int, int]],
                 deadline: Deadline | float, *, epoch: int | None = None,
                 interval: float = 0.1) -> None:
    """Poll :func:`is_acked` until true; raises :class:`~compat.errors.DeadlineExceeded`
    when ``deadline`` (a :class:`~gates.deadline.Deadline` or seconds) runs out first."""
    deadline = Deadline.of(deadline)
    while not is_acked(store, query, cap, epoch):
        deadline.sleep(interval, f"'{query}' to acknowledge {offsets_to_json(cap)}")
