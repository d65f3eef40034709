"""A query's past migrations (``theseus migrate history``) and the way back to the plan
before the last one (``theseus migrate rollback``).

Every migration leaves its record in the store (``<store>/migrations/<id>.json``, kept when
it ends) with a copy of the new plan and, since issue 32, of the plan the query ran before
(``<id>.old.plan.json``): the store keeps one plan per query, which the migration's finish
overwrites.

A rollback is a migration like any other — the same ``start`` path, the same phases, the
same checks and guards — whose new plan is the copy of the plan before the last migration
that was done.  Rolling back a rollback therefore goes forward again, as ``helm rollback``
does without a revision.  It is refused (exit 6, nothing changed) while a migration of the
query is running, when no migration of it is done, when the plan before was not kept (a
migration of an earlier Theseus), when the last migration was part of a cascade (its
queries change together: ``migrate start`` with the plans the history names), and when the
plan before is the plan running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compat.errors import Refused, TheseusError
from migrate import migration
from migrate.protocol import TERMINAL
from migrate.record import Migration, current
from migrate.store import DirectoryStore
from migrate.view import digest

FORMAT = "theseus.migration-history/1"


def migrations_of(store: DirectoryStore, query: str) -> list[Migration]:
    """The migrations of ``query`` recorded in the store, oldest first."""
    folder = store.root / "migrations"
    found = []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if p.name.count(".") != 1:
            continue  # a plan's copy (.plan.json, .old.plan.json), a cascade (.cascade.json)
        m = Migration.load(store, p.stem)
        if m.query == query:
            found.append(m)
    return sorted(found, key=lambda m: (m.history[0][1] if m.history else 0.0, m.id))


def outcome(m: Migration) -> str:
    """done, aborted, refused — or running, while it is not over."""
    return m.phase if m.phase in TERMINAL else "running"


def entry(m: Migration) -> dict[str, Any]:
    """One migration as the history shows it."""
    started = m.history[0][1] if m.history else None
    ended = m.history[-1][1] if m.history and m.phase in TERMINAL else None
    return {
        "id": m.id, "outcome": outcome(m), "phase": m.phase, "kind": m.kind,
        "verdict": m.verdict, "started_at": started, "ended_at": ended,
        "seconds": round(ended - started, 1) if started and ended else None,
        "cut": m.cut, "counts": m.counts, "error": m.error,
        "rollback_of": m.rollback_of, "cascade": m.cascade,
        "plans": {"old": {"file": m.old_plan_file, "recorded": m.old_plan},
                  "new": {"file": m.plan_file, "recorded": m.new_plan}},
    }


def history(store: DirectoryStore, query: str) -> dict[str, Any]:
    ms = migrations_of(store, query)
    if not ms and not store.query_dir(query).exists():
        raise TheseusError(f"no query named '{query}' in the store", file=str(store),
                           expected="a query started with theseus run", found=repr(query))
    return {"format": FORMAT, "query": query, "migrations": [entry(m) for m in ms]}


def when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def render_text(doc: dict[str, Any]) -> str:
    ms = doc["migrations"]
    if not ms:
        return f"no migrations of '{doc['query']}'\n"
    out = [f"migrations of '{doc['query']}', oldest first:"]
    for e in ms:
        took = f", {e['seconds']:g} s" if e["seconds"] is not None else ""
        out += ["", f"{e['id']}  {e['outcome']}" +
                (f" (phase {e['phase']})" if e["outcome"] == "running" else "") +
                f"  started {when(e['started_at'])}{took}" +
                (f"  rollback of {e['rollback_of']}" if e["rollback_of"] else "") +
                (f"  cascade {e['cascade']}" if e["cascade"] else "")]
        if e["verdict"] or e["kind"]:
            out.append(f"  verdict {e['verdict'] or '-'}, {e['kind'] or 'undecided'}")
        old, new = e["plans"]["old"], e["plans"]["new"]
        out.append(f"  plan {old['file'] or old['recorded'] or '(not kept)'} -> "
                   f"{new['file'] or new['recorded']}")
        if e["cut"]:
            out.append("  cut " + ", ".join(
                f"{t} " + " ".join(f"{p}:{o}" for p, o in sorted(ps.items(),
                                                                key=lambda kv: int(kv[0])))
                for t, ps in sorted(e["cut"].items())))
        c = e["counts"]
        if c:
            out.append(f"  reconciled {c.get('corrected', 0)} corrected, "
                       f"{c.get('added', 0)} added, {c.get('deleted', 0)} deleted, "
                       f"{c.get('matched', 0)} already right")
        if e["error"]:
            out.append(f"  {'why' if e['outcome'] == 'refused' else 'error'}: {e['error']}")
    return "\n".join(out) + "\n"


def previous(store: DirectoryStore, query: str) -> Migration:
    """The last migration of ``query`` that was done, whose plan before is the one a
    rollback goes back to; :class:`~compat.errors.Refused` when there is none to go back
    to, or a migration is running."""
    try:
        now = current(store, query)
    except TheseusError:
        now = None
    if now is not None and now.phase not in TERMINAL:
        raise Refused(f"migration {now.id} of '{query}' is running (phase {now.phase}): a "
                      "rollback would be a second migration beside it", file=str(store),
                      hint=f"follow it with theseus migrate status {query} --watch; roll "
                      "back once it is over")
    done = [m for m in migrations_of(store, query) if m.phase == "done"]
    if not done:
        if not store.query_dir(query).exists():
            raise TheseusError(f"no query named '{query}' in the store", file=str(store),
                               expected="a query started with theseus run",
                               found=repr(query))
        raise Refused(f"'{query}' has no previous plan: none of its migrations is done",
                      file=str(store), expected="a done migration", found="none")
    last = done[-1]
    if last.cascade:
        raise Refused(f"the last migration of '{query}', {last.id}, was part of cascade "
                      f"{last.cascade}: its queries changed together and go back together",
                      file=str(store), hint="theseus migrate history names each query's "
                      "plan before; migrate them with theseus migrate start PLAN...")
    if not last.old_plan or not Path(last.old_plan).is_file():
        raise Refused(f"the plan '{query}' ran before migration {last.id} was not kept "
                      "(a migration of an earlier theseus)", file=str(store),
                      expected=f"{last.id}.old.plan.json in the store's migrations",
                      found="none")
    live = store.plan_path(store.live_instance(query))
    if digest(Path(last.old_plan)) == digest(live):
        raise Refused(f"'{query}' already runs the plan it ran before migration {last.id}",
                      file=str(store), expected="a plan to go back to",
                      found=f"the same plan ({digest(live)})")
    return last


def rollback(store: DirectoryStore, query: str, *, bootstrap: str | None = None,
             strategy: str = "auto", reconcile: str = "auto", timeout: float = 600.0,
             echo: Callable[[str], None] = print,
             live: Callable[[str, str], None] | None = None) -> tuple[Migration, Migration]:
    """Migrate ``query`` live back to the plan before its last done migration, through
    the ``migrate start`` path.  Returns (the migration undone, the rollback)."""
    last = previous(store, query)
    where = last.old_plan_file or last.old_plan
    echo(f"theseus: rolling '{query}' back to the plan before migration {last.id} "
         f"({where}, {digest(Path(last.old_plan))})")
    m = migration.start(store, query, last.old_plan, bootstrap=bootstrap or last.bootstrap,
                        strategy=strategy, cut_mode=last.cut_mode, require=last.require,
                        reconcile=reconcile, master=last.master, trigger=last.trigger,
                        echo=echo, timeout=timeout, live=live, plan_file=where,
                        rollback_of=last.id)
    return last, m
