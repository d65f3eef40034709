"""What the phase handlers of a run share: one :class:`Context` over the store, the run's
one deadline, where its lines go, the services the phases call, and the records of the
migrations it drives (a cascade's driver runs several migrations over one context, as the
Flink Kubernetes Operator's blue/green state handlers share one ``BlueGreenContext``)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from gates.deadline import Deadline
from migrate.lease import Lease
from migrate.progress import Progress
from migrate.protocol import step_number
from migrate.record import Migration
from migrate.services.arming import GateArming
from migrate.services.processes import Processes
from migrate.services.topics import TopicAdmin
from migrate.store import DirectoryStore

#: seconds between two looks at a query's acknowledgements while the output is handed over
#: (steps 5 and 6, a cascade's adoption of the propagated cut): each look reads a small file,
#: and every wait of the hand-over is part of the output's stall
CUT_POLL = 0.05


class Context:
    """``echo`` prints lines that stay (the phases), ``live`` the line that follows the
    shadow (:mod:`migrate.progress`: one line rewritten in place on a terminal; by default
    plain lines, at most one every 10 s). One time budget (``deadline``, else ``timeout``
    seconds from now) is shared by every Kafka/Spark wait of the run.  ``lease``: the
    migrator's (:mod:`migrate.lease`), renewed in every wait and guarding every Kafka write
    and process start (files are guarded where they are written); None in tests of a step
    alone."""

    def __init__(self, store: DirectoryStore, echo: Callable[[str], None] = print,
                 timeout: float = 600.0, *, deadline: Deadline | None = None, hint: str = "",
                 live: Callable[[str, str], None] | None = None, lag_threshold: int = 2000,
                 steady_batches: int = 6, lease: Lease | None = None) -> None:
        self.store = store
        self.lease = lease
        self.echo = echo
        if live is None:
            plain = Progress(tty=False)
            plain._write = lambda text: echo(text.rstrip("\n"))  # type: ignore[method-assign]
            live = plain.live
        self.live = live
        self.deadline = deadline or Deadline(timeout, hint=hint)
        self.lag_threshold = lag_threshold
        self.steady_batches = steady_batches
        self.topics = TopicAdmin(self.deadline, echo, self.guard)
        self.processes = Processes(store, self.deadline, self.guard)
        self.gates = GateArming(store, self.deadline, lease)
        #: the records of the migrations this run drives, by id: one record in memory per
        #: migration (what a cascade's downstream writes in its upstream's, the upstream's
        #: own steps read)
        self.records: dict[str, Migration] = {}
        #: a cascade's upstream: the producer of its propagated cut's control events,
        #: created while its old query finishes (gates.control.control_producer), by id
        self.producers: dict[str, Any] = {}

    def record(self, migration_id: str) -> Migration:
        """The migration ``migration_id``: the one this run drives, else as stored."""
        if migration_id in self.records:
            return self.records[migration_id]
        return Migration.load(self.store, migration_id)

    def save(self, m: Migration) -> None:
        m.save(self.store, self.deadline)

    def guard(self) -> AbstractContextManager[Any]:
        """What a write that is not a file's runs in (a Kafka write, a process start): the
        lease checked to be still this process's, its lock held meanwhile."""
        return self.lease.guard() if self.lease is not None else nullcontext()

    def renew(self, force: bool = False) -> None:
        """Renew the lease when due; raises LeaseLost once another process owns the
        migration, Lapsed when the renewal came too late while the queries were paused."""
        if self.lease is not None:
            self.lease.renew(force)

    def flush(self) -> None:
        self.store.flush(self.deadline)

    def enter(self, m: Migration, phase: str) -> None:
        """Record a phase before acting on it."""
        m.phase = phase
        m.history.append([phase, round(time.time(), 3)])
        self.save(m)
        n = step_number(m.kind, phase, m.dry_run)
        self.echo(f"[{m.id}] {phase}" if n is None else f"[{m.id}] {n}. {phase}")
        # tests: die (after:PHASE) or hang (stop:PHASE) right after recording a phase
        fault = os.environ.get("THESEUS_FAULT")
        if fault == f"after:{phase}":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == f"stop:{phase}":
            os.kill(os.getpid(), signal.SIGSTOP)

    @staticmethod
    def mark(m: Migration, name: str) -> None:
        """Note in the history (saved with the next record) when a moment of a step that is
        not a phase happened: where a benchmark finds where the time goes."""
        m.history.append([name, round(time.time(), 3)])

    def wait(self, m: Migration, what: str, cond: Callable[[], bool], interval: float = 0.2,
             show: bool = True) -> None:
        """Poll ``cond`` until true while the queries of ``m`` are alive; the deadline
        running out raises DeadlineExceeded. ``show``: say on the live line what is awaited,
        once it takes a second."""
        t0 = self.deadline.remaining()
        self.renew()
        while not cond():
            self.renew()
            self.processes.check_alive(m)
            waited = t0 - self.deadline.remaining()
            if show and waited >= 1:
                self.live(f"  waiting for {what} ({waited:.0f} s)", f"wait {what}")
            self.deadline.sleep(interval, what)
