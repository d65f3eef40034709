"""Live migrations: swap a running query for a new plan at one exact cut in its input.

``theseus migrate start|resume|abort`` of one query come here; the protocol, its seven
steps and the table of its phases are :mod:`migrate.protocol`'s, each phase's handler is in
:mod:`migrate.phases`, and :mod:`migrate.runner` runs them.  A migration that is part of a
cascade (several queries chained through topics) is resumed and aborted with its chain
(:mod:`migrate.cascade`)."""

from __future__ import annotations

from collections.abc import Callable

from compat.errors import Refused
from migrate import cascade, runner
from migrate.context import Context
from migrate.phases import rollback
from migrate.protocol import TERMINAL
from migrate.record import Migration, current, new_migration, restore_current, resume_hint
from migrate.store import DirectoryStore


def start(store: DirectoryStore, query: str, new_plan_path: str, *, bootstrap: str,
          strategy: str = "auto", cut_mode: str = "control-events",
          require: list[str] | None = None, compare: bool = False, reconcile: str = "auto",
          master: str = "local[2]",
          trigger: str = "1 second", echo: Callable[[str], None] = print,
          timeout: float = 600.0, live: Callable[[str, str], None] | None = None,
          dry_run: bool = False, allow_deletes: bool = False,
          max_delete_ratio: float = 0.1,
          plan_file: str | None = None, rollback_of: str = "") -> Migration:
    m = new_migration(store, query, new_plan_path, bootstrap=bootstrap, strategy=strategy,
                      cut_mode=cut_mode, require=require, compare=compare,
                      reconcile=reconcile, master=master, trigger=trigger,
                      plan_file=plan_file, rollback_of=rollback_of)
    m.dry_run, m.allow_deletes, m.max_delete_ratio = dry_run, allow_deletes, max_delete_ratio
    # the time budget starts here
    ctx = Context(store, echo, timeout, hint=resume_hint(query), live=live)
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
           timeout: float = 600.0, live: Callable[[str, str], None] | None = None
           ) -> Migration:
    m = current(store, query)
    if m.cascade:  # one migration of a chain: the chain goes on
        return cascade.resume(store, m.cascade, echo=echo, timeout=timeout, live=live,
                              query=query)
    if m.phase in TERMINAL:
        # nothing to resume: a script must not read "resumed" into it (6)
        raise Refused(f"migration {m.id} of '{query}' is {m.phase}: nothing to resume" +
                      (f" ({m.error})" if m.error else ""), file=str(store.root),
                      expected="a migration in progress", found=m.phase)
    try:
        return runner.run(m, Context(store, echo, timeout, hint=resume_hint(query), live=live))
    finally:
        ended(store, m)


def abort(store: DirectoryStore, query: str, echo: Callable[[str], None] = print) -> Migration:
    m = current(store, query)
    if m.cascade:
        return cascade.abort(store, m.cascade, echo=echo, query=query)
    return rollback.abort(m, Context(store, echo, hint=resume_hint(query)))
