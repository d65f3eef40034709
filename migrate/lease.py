"""A migration's owner: the process holding the lease of its query (of every query of a
cascade) in the store.  The lease's file and how others read it are
:mod:`gates.lease`'s; this module is the owner's side.

* **Taking it** (:meth:`Lease.take`; ``migrate start``, ``resume`` and ``abort``) is a
  compare-and-set on the epoch under the lease's file lock (``leases/.<query>.lock``): read,
  refuse while the lease holds (:class:`compat.errors.Refused`, exit 6, naming the holder:
  host, pid, command, last heartbeat, when it expires), else write it back with the epoch
  bumped and this process as the holder (a temporary file renamed over it).  ``abort``
  *preempts* a live holder instead of refusing: stopping the migration is what it is for; the
  holder finds out at its next write or wait and stops without writing anything more.  On the
  Kafka store the take also fences the previous holder at the broker: the lease is published
  through a transactional producer whose ``transactional.id`` names the store and the query,
  and a new owner's ``init_transactions`` bumps the producer epoch, so the old holder's next
  renewal fails (Kafka's zombie fencing; :mod:`migrate.kafkastore`).
* **Holding it**: the owner renews it every :data:`RENEW_EVERY` of the TTL (the runner
  between steps, :meth:`~migrate.context.Context.wait` in every wait), and every file it
  writes goes through :meth:`Lease.guard` (:func:`gates.files.guarded`): under the lock, the
  lease must still be this process's, else :class:`LeaseLost` ("migration m… was taken over
  by pid … on …; this process stops", exit 6) and nothing is written.  Kafka writes and
  process starts take the same guard.  Once :data:`BUDGET` of the TTL passed without a
  renewal (a long blocking call), the guard renews before it lets a write through: a reader
  may see the lease stale a third of the TTL later, so host clocks may disagree by that much.
* **A lapse**: when a renewal comes later than the budget, readers may have seen the lease
  stale and lifted the pause (:mod:`gates.lease`).  While the pause is in force
  (:attr:`Lease.critical`, from step 3's caps to the cap that retires the old query at C)
  the renewal raises :class:`Lapsed`, and the runner pauses again from the new high
  watermarks (:mod:`migrate.phases.catch_up`) instead of writing a cut the queries may have
  read past.
* **Releasing it** when the process ends (done, refused, failed, interrupted): readers lift
  what it held at once, and the next owner takes it without waiting for the TTL.

The default TTL is 15 s (``--lease-ttl``, ``$THESEUS_LEASE_TTL``): a dead or hung migrator
stalls the output for at most that plus one trigger, and a migrator polls at most every
second in its waits, so 15 s leaves room for a slow Kafka call (its budget, 10 s, is what a
single call may block without a lapse).  Kubernetes' leader election uses the same numbers
(lease 15 s, renew deadline 10 s, retry period 2 s).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from compat.errors import MigrationError, Refused, TheseusError
from gates.deadline import Deadline
from gates.files import atomic_write, guarded
from gates.lease import (
    describe,
    lease_path,
    lock_path,
    proc_start,
    process_alive,
    read_lease,
    this_host,
    why_stale,
)
from migrate.store import DirectoryStore

DEFAULT_TTL = 15.0
#: the part of the TTL after which the owner renews (the retry period)
RENEW_EVERY = 2 / 15
#: the part of the TTL the owner may go without a renewal before it must renew to write
#: (the renew deadline); readers wait the whole TTL
BUDGET = 10 / 15


class LeaseLost(Refused):
    """This process no longer owns the migration: another process took its lease over (a
    ``resume`` after it went stale, an ``abort``).  Nothing more is written."""


class Lapsed(MigrationError):
    """The owner's lease went without a renewal for longer than its budget while the pause
    was in force: readers may have lifted it.  The runner pauses again."""


def default_ttl() -> float:
    """``$THESEUS_LEASE_TTL`` seconds, else :data:`DEFAULT_TTL`."""
    raw = os.environ.get("THESEUS_LEASE_TTL")
    if not raw:
        return DEFAULT_TTL
    try:
        ttl = float(raw)
    except ValueError:
        raise MigrationError("malformed THESEUS_LEASE_TTL", expected="seconds, e.g. 15",
                             found=repr(raw)) from None
    if ttl <= 0:
        raise MigrationError("malformed THESEUS_LEASE_TTL", expected="seconds above 0",
                             found=repr(raw))
    return ttl


def command_line() -> str:
    """What this process runs, as a holder names it (``theseus migrate start v3.sql``)."""
    args = list(sys.argv[1:]) if sys.argv and sys.argv[0].endswith(("cli.py", "theseus",
                                                                       "__main__.py")) else []
    return " ".join(["theseus", *args]) if args else " ".join(sys.argv)[:200]


def holder_of(store: DirectoryStore, query: str) -> dict[str, Any] | None:
    """The lease of ``query`` while it holds (a live owner runs its migration), else None."""
    doc = read_lease(store.root, query)
    return doc if doc is not None and why_stale(doc) is None else None


def held(store: DirectoryStore, doc: dict[str, Any], query: str, what: str) -> Refused:
    """The refusal of ``what`` while ``doc`` (a live lease) runs ``query``'s migration: it
    names the holder, and its advice names no command that would run beside it."""
    return Refused(f"{what} refused: migration {doc.get('migration') or '?'} of '{query}' is "
                   f"run by {describe(doc)}", file=str(lease_path(store.root, query)),
                   hint=f"wait for it to end (theseus migrate status {query} --watch), or "
                        f"stop it with theseus migrate abort {query}")


class Lease:
    """The leases of the queries one migrator process drives (one query, or every query of a
    cascade), taken together, renewed together, released together."""

    def __init__(self, store: DirectoryStore, queries: list[str], migration: str,
                 command: str | None = None, ttl: float | None = None) -> None:
        self.store = store
        self.queries = sorted(set(queries))
        self.migration = migration
        self.ttl = float(ttl if ttl is not None else default_ttl())
        pid = os.getpid()
        self.holder = {"host": this_host(), "pid": pid, "proc_start": proc_start(pid),
                       "started": round(time.time(), 3),
                       "command": command if command is not None else command_line()}
        self.epochs: dict[str, int] = {}
        self.seqs: dict[str, int] = {}
        #: the live holders this process preempted (``abort``), by query
        self.preempted: dict[str, dict[str, Any]] = {}
        self.renewed = 0.0  # time.monotonic() of the last renewal
        #: the pause is in force: a lapse must not be acted on (:class:`Lapsed`)
        self.critical = False
        self.lost: str | None = None
        self._fds: dict[str, int] = {}
        self._depth = 0  # guard() nesting
        self._holding = 0  # _hold() nesting: the locks are taken and given back once

    # -- taking ---------------------------------------------------------------------------
    @classmethod
    def take(cls, store: DirectoryStore, queries: list[str], migration: str, *,
             what: str, command: str | None = None, ttl: float | None = None,
             preempt: bool = False) -> Lease:
        """Take the leases of ``queries`` for ``migration``; refused (naming the holder)
        while a live process holds one, unless ``preempt``.  ``what`` says what is refused
        ("theseus migrate resume")."""
        lease = cls(store, queries, migration, command, ttl)
        try:
            for q in lease.queries:
                lease._take_one(q, preempt, what)
        except BaseException:
            lease.release()
            raise
        lease.renewed = time.monotonic()
        return lease

    def _take_one(self, query: str, preempt: bool, what: str) -> None:
        # Kafka store: the store read to its end first, so that a live holder is refused
        # before it is fenced (a refused resume must not stop the migrator it names)
        self.store.lease_sync(self.ttl)
        if not preempt:
            self._refuse_if_held(query, what)
        # then the previous holders' producer fenced, and the store read to its end again:
        # a take committed meanwhile is seen below (and refused, as above)
        self.store.lease_fence(query, self.ttl)
        with self._hold():
            doc = self._refuse_if_held(query, what) if not preempt else \
                read_lease(self.store.root, query)
            if doc is not None and why_stale(doc) is None:
                self.preempted[query] = doc
            epoch = (doc["epoch"] if doc else 0) + 1
            self._write(query, epoch, (doc["seq"] if doc else 0) + 1)

    def _refuse_if_held(self, query: str, what: str) -> dict[str, Any] | None:
        """The lease of ``query`` as it is; refused while it holds."""
        with self._hold():
            doc = read_lease(self.store.root, query)
            if doc is not None and why_stale(doc) is None:
                raise held(self.store, doc, query, what)
            return doc

    def await_preempted(self, echo: Callable[[str], None]) -> None:
        """After preempting live holders (``abort``): wait until each has stopped writing.
        On this host its process exits at its next write or wait (each takes the lease's
        lock and finds it lost); waited for up to the TTL.  On another host, until its last
        heartbeat is a TTL old: its budget ran out long before, and its renewal, which it
        needs to write again, fails (the lease is this process's, and on the Kafka store its
        producer is fenced)."""
        for q, doc in sorted(self.preempted.items()):
            h = doc.get("holder") or {}
            who = f"pid {h.get('pid')} on {h.get('host')}"
            if h.get("host") == this_host():
                wait = Deadline(self.ttl)
                while process_alive(int(h.get("pid") or 0), h.get("proc_start")) and \
                        not wait.expired():
                    self.renew()
                    time.sleep(0.1)
                gone = not process_alive(int(h.get("pid") or 0), h.get("proc_start"))
                echo(f"  took '{q}' over from {who}: " + (
                    "it stopped" if gone else "it has not exited yet, and writes nothing "
                    "more (the lease is this process's)"))
            else:
                end = float(doc.get("heartbeat", 0)) + float(doc.get("ttl", self.ttl))
                while time.time() < end:
                    self.renew()
                    time.sleep(min(0.2, max(0.0, end - time.time())))
                echo(f"  took '{q}' over from {who}: its lease ran out; it writes nothing "
                     "more")

    # -- holding --------------------------------------------------------------------------
    def renew(self, force: bool = False) -> None:
        """Renew when due (every :data:`RENEW_EVERY` of the TTL; ``force``: now), else check
        that the leases are still this process's.  Raises :class:`LeaseLost` when one was
        taken over, :class:`Lapsed` when the renewal came too late while the pause was in
        force (after renewing: the lease holds again)."""
        if self.lost:
            raise LeaseLost(self.lost)
        now = time.monotonic()
        if not force and now - self.renewed < RENEW_EVERY * self.ttl:
            self.check()
            return
        with self._hold():
            self._renew_locked(now)

    def _renew_locked(self, now: float) -> None:
        gap = now - self.renewed
        for q in self.queries:
            self._verify(q)
            self._write(q, self.epochs[q], self.seqs[q] + 1)
        self.renewed = now
        if gap > BUDGET * self.ttl and self.critical:
            raise Lapsed(f"migration {self.migration}: its lease went {gap:.1f} s without a "
                         f"renewal while the queries were paused (its budget is "
                         f"{BUDGET * self.ttl:.1f} s): the pause may have been lifted")

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless every lease is still this process's."""
        if self.lost:
            raise LeaseLost(self.lost)
        for q in self.queries:
            self._verify(q)

    def _verify(self, query: str) -> None:
        try:
            doc = read_lease(self.store.root, query)
        except Exception as e:  # unreadable: not provably ours
            doc = None
            why = f"its lease cannot be read ({e})"
        else:
            why = ""
        if doc is not None and doc.get("epoch") == self.epochs.get(query) and \
                not doc.get("released") and self._same_holder(doc):
            return
        if doc is not None and not why:
            h = doc.get("holder") or {}
            why = (f"was taken over by pid {h.get('pid')} on {h.get('host')} "
                   f"({h.get('command') or 'unknown command'}, epoch {doc.get('epoch')})"
                   if doc.get("epoch") != self.epochs.get(query) else
                   "had its lease released by another process")
        self.lost = (f"migration {self.migration} of '{query}' {why or 'lost its lease'}; "
                     "this process stops")
        raise LeaseLost(self.lost)

    def _same_holder(self, doc: dict[str, Any]) -> bool:
        h = doc.get("holder") or {}
        return (h.get("host"), h.get("pid")) == (self.holder["host"], self.holder["pid"])

    @contextmanager
    def guard(self) -> Iterator[None]:
        """What every write of the owner runs in: the leases' locks held (a takeover waits
        for the write), each lease checked to be still this process's, and renewed first
        once its budget ran out."""
        if self._depth:  # a write inside a guarded operation
            yield
            return
        with self._hold():
            self._depth += 1
            try:
                if self.lost:
                    raise LeaseLost(self.lost)
                now = time.monotonic()
                if now - self.renewed > BUDGET * self.ttl:
                    self._renew_locked(now)
                else:
                    for q in self.queries:
                        self._verify(q)
                yield
            finally:
                self._depth -= 1

    @contextmanager
    def installed(self) -> Iterator[Lease]:
        """Every file this thread writes goes through :meth:`guard`; released at the end."""
        try:
            with guarded(self.guard):
                yield self
        finally:
            self.release()

    # -- releasing ------------------------------------------------------------------------
    def release(self) -> None:
        """Give the leases up (those still this process's): readers lift what they held."""
        for q in list(self.epochs):
            try:
                with self._hold():
                    doc = read_lease(self.store.root, q)
                    if doc is not None and doc.get("epoch") == self.epochs[q] and \
                            self._same_holder(doc) and not doc.get("released"):
                        self._write(q, self.epochs[q], doc["seq"] + 1, released=True)
            except Exception as e:  # the process ends anyway; the TTL frees it
                print(f"theseus: could not release the lease of '{q}': {e}", file=sys.stderr)
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()

    # -- the file -------------------------------------------------------------------------
    def _write(self, query: str, epoch: int, seq: int, released: bool = False) -> None:
        doc = {"query": query, "migration": self.migration, "epoch": epoch, "seq": seq,
               "holder": self.holder, "heartbeat": round(time.time(), 3), "ttl": self.ttl,
               "released": released}
        text = json.dumps(doc, indent=1) + "\n"
        # published first (Kafka: in a transaction, refused once another process took the
        # lease), so that a fenced write never reaches even this host's mirror
        if not self.store.lease_publish(query, text, self.ttl):
            try:  # only to name the new holder: fenced is fenced, store readable or not
                self.store.lease_sync(self.ttl)
                now = read_lease(self.store.root, query) or {}
            except TheseusError:
                now = {}
            h = now.get("holder") or {}
            who = (f"pid {h.get('pid')} on {h.get('host')}" if now.get("epoch") !=
                   self.epochs.get(query) and h else "another process")
            self.lost = (f"migration {self.migration} of '{query}' was taken over by {who} "
                         "(its producer was fenced at the broker); this process stops")
            raise LeaseLost(self.lost)
        with guarded(None):  # the lease is the guard; its lock is held
            atomic_write(lease_path(self.store.root, query), text)
        self.epochs[query], self.seqs[query] = epoch, seq

    def _fd(self, query: str) -> int:
        if query not in self._fds:
            p = lock_path(self.store.root, query)
            p.parent.mkdir(parents=True, exist_ok=True)
            self._fds[query] = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fds[query]

    @contextmanager
    def _hold(self) -> Iterator[None]:
        """The locks of every lease of this process, re-entrant (a renewal inside a guarded
        write): taken in the same (sorted) order by everyone, so two owners never wait on
        each other; given back by the outermost."""
        if self._holding:
            self._holding += 1
            try:
                yield
            finally:
                self._holding -= 1
            return
        fds = [self._fd(q) for q in self.queries]
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_EX)
        self._holding = 1
        try:
            yield
        finally:
            self._holding = 0
            for fd in reversed(fds):
                fcntl.flock(fd, fcntl.LOCK_UN)
