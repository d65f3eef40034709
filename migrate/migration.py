"""Live migrations: swap a running query for a new plan at one exact cut in its input.

``theseus migrate start|resume|abort`` of one query come here; the protocol, its seven
steps and the table of its phases are :mod:`migrate.protocol`'s, each phase's handler is in
:mod:`migrate.phases`, and :mod:`migrate.runner` runs them.  A migration that is part of a
cascade (several queries chained through topics) is resumed and aborted with its chain
(:mod:`migrate.cascade`).  Each command first takes the query's lease (:mod:`migrate.lease`):
one process owns a migration at a time; ``start`` and ``resume`` are refused while a live
process owns it, ``abort`` takes it over and stops that process."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migrate import cascade, runner
from migrate.context import Context
from migrate.lease import Lease
from migrate.phases import rollback
from migrate.protocol import TERMINAL
from migrate.record import (
    Migration,
    NothingToResume,
    current,
    new_migration,
    restore_current,
    resume_hint,
)
from migrate.store import DirectoryStore

if TYPE_CHECKING:
    from compat.model import Plan


def start(store: DirectoryStore, query: str, new_plan_path: str, *, bootstrap: str,
          strategy: str = "auto", cut_mode: str = "control-events",
          require: list[str] | None = None, compare: bool = False, reconcile: str = "auto",
          master: str = "local[2]",
          trigger: str = "1 second", echo: Callable[[str], None] = print,
          timeout: float = 600.0, live: Callable[[str, str], None] | None = None,
          dry_run: bool = False, allow_deletes: bool = False,
          max_delete_ratio: float = 0.1,
          plan_file: str | None = None, rollback_of: str = "",
          lease_ttl: float | None = None, plan: Plan | None = None) -> Migration:
    lease = Lease.take(store, [query], "", what="theseus migrate start", ttl=lease_ttl)
    with lease.installed():
        m = new_migration(store, query, new_plan_path, bootstrap=bootstrap,
                          strategy=strategy, cut_mode=cut_mode, require=require,
                          compare=compare, reconcile=reconcile, master=master,
                          trigger=trigger, plan_file=plan_file, rollback_of=rollback_of,
                          plan=plan)
        m.dry_run, m.allow_deletes = dry_run, allow_deletes
        m.max_delete_ratio = max_delete_ratio
        lease.migration = m.id
        lease.renew(force=True)  # the lease names the migration it runs
        # the time budget starts here
        ctx = Context(store, echo, timeout, hint=resume_hint(query), live=live, lease=lease)
        ctx.save(m)
        try:
            return runner.run(m, ctx)
        finally:
            ended(store, m)


def ended(store: DirectoryStore, m: Migration) -> Migration:
    """A dry run that ended (reported, or refused) leaves the query's current migration as
    it was; one whose step failed stays current, to be resumed."""
    if m.dry_run and m.phase in TERMINAL:
        restore_current(store, m)
    return m


def resume(store: DirectoryStore, query: str, echo: Callable[[str], None] = print,
           timeout: float = 600.0, live: Callable[[str, str], None] | None = None,
           lease_ttl: float | None = None) -> Migration:
    m = current(store, query)
    if m.cascade:  # one migration of a chain: the chain goes on
        return cascade.resume(store, m.cascade, echo=echo, timeout=timeout, live=live,
                              query=query, lease_ttl=lease_ttl)
    if m.phase in TERMINAL:
        raise NothingToResume.of(store, f"migration {m.id} of '{m.query}'", m.phase, m.error)
    lease = Lease.take(store, [m.query], m.id, what="theseus migrate resume", ttl=lease_ttl)
    with lease.installed():
        m = Migration.load(store, m.id)  # as its last owner left it
        if m.phase in TERMINAL:
            raise NothingToResume.of(store, f"migration {m.id} of '{m.query}'", m.phase, m.error)
        try:
            return runner.run(m, Context(store, echo, timeout, hint=resume_hint(query),
                                         live=live, lease=lease))
        finally:
            ended(store, m)



def abort(store: DirectoryStore, query: str, echo: Callable[[str], None] = print) -> Migration:
    m = current(store, query)
    if m.cascade:
        return cascade.abort(store, m.cascade, echo=echo, query=query)
    rollback.refuse_late(m, store)  # before anything is taken over
    lease = Lease.take(store, [m.query], m.id, what="theseus migrate abort", preempt=True)
    with lease.installed():
        lease.await_preempted(echo)
        m = Migration.load(store, m.id)  # as the process it stopped left it
        return rollback.abort(m, Context(store, echo, hint=resume_hint(query), lease=lease))
