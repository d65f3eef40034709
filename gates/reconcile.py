"""Reconciliation at the cut: the compacted output equals the new plan over all input at C.

A live migration switches the output at the cut C: the old query's rows for input before C,
the new query's from C on.  For a keyed output, a key that gets no input after C would keep
the old plan's value forever (Materialize's three gaps of ``ALTER SINK ... SET FROM``:
stale, missing and orphan keys).  A reconciling shadow closes them at the hand-over:

1. Before the cut, the shadow's output goes to its side topic ``<output>.shadow`` (exactly
   once, in the same transactions as its batch ids), read from the offsets the migrator
   recorded before the shadow started (``from``), so a side topic left by an earlier
   migration counts for nothing.  Per key, its last record is the new plan over all input
   before C (a tombstone: the new plan retracted the key).
2. When the shadow writes its first batch to the output (the batch starting at C, once
   the old query committed everything before C and retired), the sink reads the output
   topic: per key, the old plan's last value.
3. :func:`diff` gives the corrections: the new row for a key whose value differs
   (*corrected*) or that the old plan never wrote (*added*), a tombstone for a key the new
   plan does not produce (*deleted*), nothing for a key already right (*matched*).
4. The sink records the counts with the batch id (``pending``), *then* writes the
   corrections before the batch's own rows in the batch's transaction (the batch's rows
   come later, so they win where both touch a key), commits, and records ``committed``.
   A host killed in between replays the batch: its transaction was aborted (the restarted
   producer fences it), the output and the side topic are unchanged, so the corrections
   are computed again, identical, and written once.  A replayed batch that did commit is
   skipped by the sink, and the pending record is confirmed against the committed batch
   id (:meth:`Reconciler.confirm`).

The record: ``<store>/gates/<instance>.reconcile.json`` =
``{"migration", "batch_id", "state": "pending"|"committed", "counts": {...}}``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from compat.errors import SinkError
from gates.broker import client_conf, partitions
from gates.control import is_control
from gates.deadline import Deadline
from gates.files import atomic_write_json
from gates.startgate import read_start_gate
from gates.state import is_acked, read_gate

COUNTS = ("corrected", "added", "deleted", "matched")
Latest = dict[bytes, "bytes | None"]


def record_path(store: str | os.PathLike[str], instance: str) -> Path:
    return Path(store) / "gates" / f"{instance}.reconcile.json"


def read_record(store: str | os.PathLike[str], instance: str) -> dict[str, Any]:
    """The reconciliation record of ``instance`` ({} when none was written yet)."""
    try:
        doc = json.loads(record_path(store, instance).read_text())
    except FileNotFoundError:
        return {}
    except ValueError:
        return {}  # torn writes cannot happen (atomic rename); unreadable means not there
    return doc if isinstance(doc, dict) else {}


def write_record(store: str | os.PathLike[str], instance: str, doc: Mapping[str, Any]) -> None:
    atomic_write_json(record_path(store, instance), dict(doc), indent=None)


def _same(old: bytes, new: bytes) -> bool:
    """Equal JSON values: the same bytes, or the same object once parsed (member order and
    spacing are not a difference a reader sees)."""
    if old == new:
        return True
    try:
        return json.loads(old) == json.loads(new)
    except (ValueError, UnicodeDecodeError):
        return False


def _memo_same(memo: dict[bytes, tuple[bytes, bytes, bool]], k: bytes, o: bytes,
               n: bytes) -> bool:
    hit = memo.get(k)
    if hit is not None and hit[0] is o and hit[1] is n:
        return hit[2]
    same = _same(o, n)
    memo[k] = (o, n, same)
    return same


def diff(old: Mapping[bytes, bytes | None], new: Mapping[bytes, bytes | None],
         memo: dict[bytes, tuple[bytes, bytes, bool]] | None = None
         ) -> tuple[list[tuple[bytes, bytes | None]], dict[str, int]]:
    """The corrections that turn the compacted ``old`` view into ``new`` (key -> value, a
    ``None`` value is a tombstone: the key is absent), in key order, and their counts.
    ``memo`` keeps each key's comparison of two values, so a diff computed again after a few
    keys changed compares only those."""
    counts = dict.fromkeys(COUNTS, 0)
    memo = {} if memo is None else memo
    out: list[tuple[bytes, bytes | None]] = []
    for k in sorted(set(old) | set(new)):
        o, n = old.get(k), new.get(k)
        if n is None:
            if o is not None:
                out.append((k, None))
                counts["deleted"] += 1
        elif o is None:
            out.append((k, n))
            counts["added"] += 1
        elif _memo_same(memo, k, o, n):
            counts["matched"] += 1
        else:
            out.append((k, n))
            counts["corrected"] += 1
    return out, counts


class KeyDiff:
    """:func:`diff` kept up to date key by key: after a first full comparison, ``update``
    compares only the keys a refresh of either view read (``TopicView.changed``), so the
    hand-over after a read-ahead costs the tails, not every key again (measured: 0.28 s for
    100,000 keys in full)."""

    def __init__(self) -> None:
        self.kind: dict[bytes, str] = {}  # key -> one of COUNTS
        self.counts = dict.fromkeys(COUNTS, 0)
        self.memo: dict[bytes, tuple[bytes, bytes, bool]] = {}

    def update(self, old: Mapping[bytes, bytes | None], new: Mapping[bytes, bytes | None],
               keys: Iterable[bytes] | None = None) -> None:
        """Compare ``keys`` again (every key of both views when ``None``)."""
        kind, counts = self.kind, self.counts
        for k in (set(old) | set(new)) if keys is None else keys:
            o, n = old.get(k), new.get(k)
            if n is None:
                now = "deleted" if o is not None else None
            elif o is None:
                now = "added"
            else:
                now = "matched" if _memo_same(self.memo, k, o, n) else "corrected"
            was = kind.get(k)
            if was == now:
                continue
            if was is not None:
                counts[was] -= 1
            if now is None:
                del kind[k]
            else:
                kind[k] = now
                counts[now] += 1

    def result(self, new: Mapping[bytes, bytes | None]
               ) -> tuple[list[tuple[bytes, bytes | None]], dict[str, int]]:
        """The corrections in key order and their counts, as :func:`diff` returns them."""
        kind = self.kind
        out = [(k, None if kind[k] == "deleted" else new[k])
               for k in sorted(k for k, w in kind.items() if w != "matched")]
        return out, dict(self.counts)


class TopicView:
    """Per key, the value of its last committed record in ``topic`` (``None`` for a
    tombstone), from ``start`` (default: the beginning); :meth:`refresh` reads on from where
    the last one ended, so a view read before the hand-over needs only the tail after it.
    Control records and records without a key are not rows of the output: left out.

    Reads ``read_committed`` up to the high watermark taken first: a commit returns before
    the broker wrote its markers, so a reader stopping at the last stable offset could miss
    the last committed rows; it waits (within ``timeout``) until the markers are there."""

    def __init__(self, bootstrap: str, topic: str, start: Mapping[int, int] | None = None,
                 timeout: float = 120.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.pos: dict[int, int] = {int(p): int(o) for p, o in (start or {}).items()}
        self.timeout = timeout
        self.latest: Latest = {}
        self.changed: set[bytes] = set()  # keys read by the last refresh

    def refresh(self) -> Latest:
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

        topic, timeout = self.topic, self.timeout
        c = Consumer(client_conf(self.bootstrap, **{
            "group.id": "theseus-reconcile", "enable.auto.commit": False,
            "isolation.level": "read_committed", "enable.partition.eof": True,
            "auto.offset.reset": "earliest", "fetch.max.bytes": 64 * 1024 * 1024,
            # the end is known: a fetch at the end must answer at once, not wait up to the
            # default 500 ms for data (measured: most of the reconciliation's stall)
            "fetch.wait.max.ms": 10}))
        deadline = Deadline(timeout)
        self.changed = set()
        latest, changed = self.latest, self.changed
        try:
            parts = partitions(c, topic, timeout)
            ends: dict[int, int] = {}
            for p in parts:
                try:
                    _, ends[p] = c.get_watermark_offsets(TopicPartition(topic, p),
                                                         timeout=timeout)
                except KafkaException as e:
                    raise SinkError(f"cannot read the end of the topic: {e}", topic=topic,
                                    partition=p) from e
            begin = {p: self.pos.get(p, 0) for p in parts}
            todo = {p for p in parts if ends[p] > begin[p]}
            if todo:
                c.assign([TopicPartition(topic, p, begin[p]) for p in sorted(todo)])
            while todo:
                if deadline.expired():
                    raise SinkError(f"cannot read the topic to its end within {timeout:g} s "
                                    "(a transaction left open?)", topic=topic,
                                    expected=f"offsets {ends}",
                                    found=f"partitions {sorted(todo)} not read to the end")
                # a short wait: a batch asking for more than is left waits its whole timeout
                # (measured: 0.5 s per view at the hand-over, half the stall it added)
                for m in c.consume(10000, timeout=0.05):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if m.offset() >= ends[m.partition()]:
                                todo.discard(m.partition())
                            continue
                        raise SinkError(f"cannot read the topic: {err.str()}", topic=topic,
                                        partition=m.partition())
                    if m.offset() >= ends[m.partition()] - 1:
                        todo.discard(m.partition())
                    if m.offset() >= ends[m.partition()]:
                        continue
                    k = m.key()
                    if k is None or is_control(m.headers()):
                        continue
                    latest[k] = m.value()
                    changed.add(k)
            self.pos = {p: max(begin[p], ends[p]) for p in parts}
            return latest
        finally:
            c.close()


class Comparison:
    """The two views the reconciliation compares and their :class:`KeyDiff`, kept up to
    date: the side topic (the new plan's last value per key, from ``side_from``) against the
    output (the old plan's).  The shadow's sink corrects from it at the hand-over
    (:class:`Reconciler`); the migrator counts from it before the cut (the delete guard of
    step 3 and a dry run, :mod:`migrate.phases.guard`), so both count alike.  The first
    :meth:`refresh` reads both topics and compares every key; later ones read the tails and
    compare the keys they read."""

    def __init__(self, bootstrap: str, side_topic: str, side_from: Mapping[int, int] | None,
                 output_topic: str, timeout: float = 120.0) -> None:
        self.new = TopicView(bootstrap, side_topic, side_from, timeout)
        self.old = TopicView(bootstrap, output_topic, None, timeout)
        self.diff: KeyDiff | None = None

    def refresh(self) -> KeyDiff:
        new, old = self.new, self.old
        new.refresh()
        old.refresh()
        keys = None
        if self.diff is None:
            self.diff = KeyDiff()
        else:  # the keys these refreshes read; a view that cannot say: every key
            ch_new, ch_old = getattr(new, "changed", None), getattr(old, "changed", None)
            if ch_new is not None and ch_old is not None:
                keys = ch_new | ch_old
        self.diff.update(old.latest, new.latest, keys)
        return self.diff

    def output_keys(self) -> int:
        """The output's live keys (a tombstoned key is not one): what a deletion removes a
        share of."""
        return sum(1 for v in self.old.latest.values() if v is not None)


def latest_per_key(bootstrap: str, topic: str, start: Mapping[int, int] | None = None,
                   timeout: float = 120.0) -> Latest:
    """Per key, the value of its last committed record in ``topic`` (see :class:`TopicView`)."""
    return TopicView(bootstrap, topic, start, timeout).refresh()


class Reconciler:
    """What a reconciling shadow's sink asks at its first batch written to the output.

    ``requested()`` reads the start gate (the migrator writes ``reconcile`` there: the
    side topic and the offsets it starts at); ``due(batch_id, committed)`` says whether
    this batch must carry the corrections."""

    def __init__(self, store: str | os.PathLike[str], instance: str, bootstrap: str,
                 output_topic: str, timeout: float = 120.0) -> None:
        self.store = str(store)
        self.instance = instance
        self.bootstrap = bootstrap
        self.output_topic = output_topic
        self.timeout = timeout
        self._done = False
        #: the migration whose views these are, and their comparison, kept up to date
        self._views: tuple[Any, Comparison] | None = None
        self.prefetch_seconds = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def requested(self) -> dict[str, Any] | None:
        spec = read_start_gate(self.store, self.instance).get("reconcile")
        return spec if isinstance(spec, dict) and spec.get("topic") else None

    def confirm(self, committed: int | None) -> bool:
        """True once the corrections are committed: the record says so, or it is pending
        for a batch the sink has committed since (a host killed after the commit, before
        it wrote ``committed``); then the record is completed here."""
        if self._done:
            return True
        rec = read_record(self.store, self.instance)
        if rec.get("state") == "committed":
            self._done = True
        elif rec.get("state") == "pending" and committed is not None and \
                int(rec.get("batch_id", 1 << 62)) <= committed:
            write_record(self.store, self.instance, {**rec, "state": "committed"})
            self._done = True
        return self._done

    def due(self, committed: int | None) -> dict[str, Any] | None:
        """The reconcile spec when the batch about to be written must carry corrections."""
        if self._done:
            return None
        spec = self.requested()
        if spec is None:
            return None
        if self.confirm(committed):
            return None
        rec = read_record(self.store, self.instance)
        if rec.get("state") == "committed" and rec.get("migration") == spec.get("migration"):
            self._done = True
            return None
        return spec

    def at_cut(self) -> bool:
        """The batch about to run starts at the cut (or the gate is open already)."""
        doc = self._start_gate()
        if doc.get("open", True):
            return True
        frm = doc.get("from")
        return bool(frm) and is_acked(self.store, self.instance, frm)

    def prefetch(self, spec: Mapping[str, Any]) -> None:
        """Read both topics as they are now and compare every key, so that the hand-over
        reads only what the old query wrote since (its last batch before the cut) and
        compares only those keys: the side topic is complete once the shadow runs its batch
        from the cut, and the output holds all but the tail."""
        t0 = time.monotonic()
        with self._lock:
            self._refresh(spec)
        self.prefetch_seconds = round(time.monotonic() - t0, 3)

    def paused(self) -> bool:
        """The migration has paused this shadow (step 3) or cut (step 4): the hand-over is
        near, and reading both topics ahead of it pays."""
        doc = self._start_gate()
        if doc.get("from") or doc.get("open", True):
            return True
        try:
            return read_gate(self.store, self.instance).mode == "capped"
        except Exception:  # unreadable gate state: the sink reports it where it matters
            return False

    def _start_gate(self) -> dict[str, Any]:
        return read_start_gate(self.store, self.instance)

    def watch(self, every: float = 1.0) -> None:
        """Read ahead in a background thread: from the pause on, refresh both views and
        compare every key every ``every`` seconds, until the hand-over takes over. The
        first read of a large output takes seconds; done here, it is off the hand-over's
        path (the batches of the shadow do not wait for it)."""
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    spec = self.requested()
                    if spec is None or self.confirm(None):
                        return
                    if self.paused():
                        self.prefetch(spec)
                except Exception:  # read-ahead only: the hand-over reads for itself
                    pass
                self._stop.wait(every)

        threading.Thread(target=loop, name="theseus-reconcile-read-ahead",
                         daemon=True).start()

    def _refresh(self, spec: Mapping[str, Any]) -> Comparison:
        if self._views is None or self._views[0] != spec.get("migration"):
            start = {int(p): int(o) for p, o in (spec.get("from") or {}).items()}
            self._views = (spec.get("migration"),
                           Comparison(self.bootstrap, str(spec["topic"]), start,
                                      self.output_topic, self.timeout))
        views = self._views[1]
        views.refresh()
        return views

    def corrections(self, spec: Mapping[str, Any]
                    ) -> tuple[list[tuple[bytes, bytes | None]], dict[str, int]]:
        t0 = time.monotonic()
        self._stop.set()  # no read-ahead from here on
        with self._lock:
            fresh = self._views is None or self._views[0] != spec.get("migration")
            views = self._refresh(spec)  # after a prefetch: the tails only
            assert views.diff is not None  # set by refresh
            out, counts = views.diff.result(views.new.latest)
        counts["seconds"] = round(time.monotonic() - t0, 3)  # type: ignore[assignment]
        counts["prefetched"] = not fresh  # type: ignore[assignment]
        return out, counts

    def pending(self, spec: Mapping[str, Any], batch_id: int, counts: Mapping[str, Any]
                ) -> None:
        write_record(self.store, self.instance, {
            "migration": spec.get("migration"), "batch_id": batch_id, "state": "pending",
            "counts": dict(counts), "at": time.time()})

    def committed(self) -> None:
        rec = read_record(self.store, self.instance)
        write_record(self.store, self.instance, {**rec, "state": "committed",
                                                 "committed_at": time.time()})
        self._done = True


def fault(name: str) -> None:
    """Tests: ``THESEUS_SINK_FAULT=<name>:<file>`` kills this process with SIGKILL at the
    point ``name``, once (the file is removed first; absent, nothing happens)."""
    spec = os.environ.get("THESEUS_SINK_FAULT", "")
    if not spec.startswith(name + ":"):
        return
    path = spec[len(name) + 1:]
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def as_pairs(rows: Iterable[tuple[bytes, bytes | None]]) -> tuple[list, list]:
    keys, values = [], []
    for k, v in rows:
        keys.append(k)
        values.append(v)
    return keys, values
