"""The migration record: what the store keeps of one migration
(``compat/schemas/migration.v1.json``), and how a new one is made.  The record alone says
where a migration resumes: its ``phase`` (:mod:`migrate.protocol`)."""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compat.check import is_job, load_plan
from compat.errors import InvalidRequest, MigrationError, Refused, StoreError, TheseusError
from compat.model import Plan
from compat.serde import dumps
from gates.deadline import Deadline
from gates.files import atomic_write
from gates.state import ack_path
from migrate.protocol import TERMINAL
from migrate.store import DirectoryStore, read_json


@dataclass
class Migration:
    id: str
    query: str
    new_plan: str  # path of the new plan as recorded in the store
    old_instance: str
    new_instance: str = ""
    generation: int = 0
    strategy: str = "auto"  # auto | in-place | shadow
    cut_mode: str = "control-events"  # control-events | offsets
    require: list[str] = field(default_factory=list)
    compare: bool = False
    reconcile: str = "off"  # auto | on | off, as asked
    reconciling: bool = False  # decided in step 1
    side_from: dict[str, int] = field(default_factory=dict)  # side topic offsets at step 2
    counts: dict[str, Any] = field(default_factory=dict)  # the reconciliation's
    phase: str = "check"
    kind: str = ""  # in_place | shadow, decided in step 1
    verdict: str = ""
    high: dict[str, dict[str, int]] = field(default_factory=dict)
    cut: dict[str, dict[str, int]] = field(default_factory=dict)
    epoch: int = 0
    history: list[list[Any]] = field(default_factory=list)
    bootstrap: str = ""
    master: str = "local[2]"
    trigger: str = "1 second"
    error: str | None = None
    #: what the checkpoint check said before an in-place restart (``checkpoint.restart``
    #: of ``theseus check --query``): outcome and reason, "" when it did not run
    checkpoint: str = ""
    #: the cascade this migration is part of (``migrate.cascade``), "" alone
    cascade: str = ""
    #: the downstream migrations of the cascade fed by this query's output (this one
    #: propagates its cut into its output topic)
    feeds: list[str] = field(default_factory=list)
    #: the upstream migration whose propagated control events are this migration's cut
    cut_from: str = ""
    #: the propagated cut: this migration's control events in its output topic
    out_cut: dict[str, dict[str, int]] = field(default_factory=dict)
    #: where the shadow's output before the cut ends in ``<output>.shadow`` (an upstream's)
    side_end: dict[str, int] = field(default_factory=dict)
    #: a plan with a recursive step: where each side's (``old``, ``new``) output query is
    #: cut, recorded in step 5 once its loop acknowledged C: the control events written
    #: into the loop's internal topic (C' for the old query, C'' for the shadow); for a
    #: side without recursion, C on its source topics
    output_cuts: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    #: the plan file as the user gave it (``new_plan`` is the store's copy): what refusals
    #: and messages name
    plan_file: str = ""
    #: that file's digest when the migration started (:func:`source_digest`): a job file
    #: is the source of truth, and the store's copy is only what it imported then
    plan_digest: str = ""
    #: ``--dry-run``: the shadow runs to the head, nothing is cut (:mod:`migrate.protocol`)
    dry_run: bool = False
    #: the delete guard (step 3): ``--allow-deletes``, and the largest share of the
    #: output's keys the reconciliation may delete without it (``--max-delete-ratio``)
    allow_deletes: bool = False
    max_delete_ratio: float = 0.1
    #: what the delete guard counted at the pause (or a dry run at the head): the
    #: reconciliation's counts, the output's live keys, where, and its verdict
    guard: dict[str, Any] = field(default_factory=dict)
    #: a dry run's report: what the cutover would do (:mod:`migrate.phases.preview`)
    preview: dict[str, Any] = field(default_factory=dict)
    #: the query's migration before this one ("" for none): a dry run leaves it current
    previous: str = ""

    #: a copy of the plan the query ran before (what ``migrate rollback`` goes back to),
    #: and the user's file it came from ("" when not known)
    old_plan: str = ""
    old_plan_file: str = ""
    #: ``migrate rollback``: the migration whose plan change this one undoes
    rollback_of: str = ""
    #: the shadow's backfill, recorded at step 2 before it starts: ``from`` where it reads
    #: each partition of its source topics, ``to`` the high watermarks then (the progress
    #: bar's whole: :func:`migrate.progress.backfill`)
    backfill: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    @property
    def shadowing(self) -> bool:
        """Step 1 decided a shadow migration (the dry run's step 2 runs only then)."""
        return self.kind == "shadow"

    def save(self, store: DirectoryStore, deadline: Deadline | None = None) -> None:
        atomic_write(store.migration_path(self.id), json.dumps(asdict(self), indent=2) + "\n")
        atomic_write(store.query_dir(self.query) / "migration", self.id)
        store.flush(deadline)  # recorded where every host reads it, before anyone acts on it

    @classmethod
    def load(cls, store: DirectoryStore, migration_id: str) -> Migration:
        return load_record(cls, store, store.migration_path(migration_id), "migration",
                           migration_id)


def load_record(cls: Any, store: DirectoryStore, path: Path, kind: str, record_id: str) -> Any:
    """A record of the store (a migration, a cascade) as its dataclass ``cls``: one clear
    error when it is missing or does not have the dataclass's fields."""
    try:
        doc = read_json(path, f"{kind} record")
    except FileNotFoundError:
        raise MigrationError(f"no {kind} '{record_id}' in the store",
                             file=str(store.root)) from None
    try:
        return cls(**doc)
    except TypeError as e:
        raise StoreError(f"malformed {kind} record", file=str(path),
                         expected=f"the fields of a {kind}", found=str(e)) from None


class NothingToResume(Refused):
    """A migration (or cascade) that ended — done, aborted, refused: nothing to resume, and
    a script must not read "resumed" into it (6)."""

    @classmethod
    def of(cls, store: DirectoryStore, what: str, phase: str,
           error: str | None = "") -> NothingToResume:
        return cls(f"{what} is {phase}: nothing to resume" + (f" ({error})" if error else ""),
                   file=str(store.root), expected="a migration in progress", found=phase)


class NoMigration(Refused):
    """The query has no migration: nothing to resume or abort (6); ``migrate status``
    shows "no migration" (0)."""


def current(store: DirectoryStore, query: str) -> Migration:
    p = store.query_dir(query) / "migration"
    if not p.exists():
        known(store, query)
        raise NoMigration(f"query '{query}' has no migration", file=str(store.root),
                          expected="a migration started with theseus migrate start",
                          found="none")
    return Migration.load(store, p.read_text().strip())


def known(store: DirectoryStore, query: str) -> None:
    """A query name the store does not know is invalid input (2), not a state (6)."""
    if not store.query_dir(query).is_dir():
        raise InvalidRequest(f"no query named '{query}' in the store", file=str(store.root),
                             expected="a query started with theseus run", found=repr(query))


def restore_current(store: DirectoryStore, m: Migration) -> None:
    """A finished dry run leaves the query's current migration as it found it: the one
    before (``previous``), or none.  Its own record stays, marked ``dry_run``."""
    pointer = store.query_dir(m.query) / "migration"
    if m.previous:
        atomic_write(pointer, m.previous)
    else:
        pointer.unlink(missing_ok=True)
    store.flush()


def user_plan(m: Migration) -> str:
    """The plan file as the user named it (a record of an older Theseus: the store's copy)."""
    return m.plan_file or m.new_plan


def source_digest(target: str) -> str:
    """``sha256:HEX`` of the bytes of the user's plan file (a JSON plan, a SQL script, or
    the job file of ``FILE.py[:FUNCTION]``), "" when it cannot be read.  The store keeps
    it beside the plan it made: the recorded plan of a job is what the job built then,
    and only the file's digest says whether the file still builds it."""
    file = target.rsplit(":", 1)[0] if is_job(target) and not \
        target.lower().endswith(".py") else target
    try:
        return "sha256:" + hashlib.sha256(Path(file).read_bytes()).hexdigest()
    except OSError:
        return ""


def source_changed(file: str, recorded: str) -> bool | None:
    """Whether the user's file now differs from the bytes its plan was made from (None
    when unknown).  For a job file this is the drift that matters first: the recorded plan
    is what the job built at start, and an edited job runs only once migrated to."""
    if not file or not recorded:
        return None
    now = source_digest(file)
    return None if not now else now != recorded


def user_source(store: DirectoryStore, instance: str) -> tuple[str, str]:
    """The user's file of the plan ``instance`` runs and its digest when the plan was made
    from it (``("", "")`` when not recorded): :func:`user_file`, with the digest its host
    or its migration recorded."""
    st = store.status(instance)
    f = str(st.get("plan_file") or "")
    p = Path(f)
    if p.parent.name == "migrations" and p.name.endswith(".plan.json") and \
            not p.name.endswith(".old.plan.json"):
        try:
            m = Migration.load(store, p.name[:-len(".plan.json")])
            return (m.plan_file or f, m.plan_digest) if m.plan_file else (f, "")
        except (TheseusError, OSError):
            return f, ""
    return f, str(st.get("plan_digest") or "")


def user_file(store: DirectoryStore, instance: str) -> str:
    """The user's file of the plan ``instance`` runs, as its host recorded it (``theseus
    run``); an instance a migration started runs the store's copy of the migration's new
    plan: that migration's ``plan_file`` then.  "" when not recorded (an older host)."""
    return user_source(store, instance)[0]


def resume_hint(query: str) -> str:
    return (f"theseus migrate resume {query} continues from here; theseus migrate abort "
            f"{query} rolls back")


def json_offsets(offsets: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
    """Offsets as the record keeps them (JSON: partitions as strings)."""
    return {t: {str(p): int(o) for p, o in ps.items()} for t, ps in offsets.items()}


def int_offsets(doc: dict[str, dict[str, int]]) -> dict[str, dict[int, int]]:
    """Offsets of the record as the gates take them (partitions as ints)."""
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in doc.items()}


def new_migration(store: DirectoryStore, query: str, new_plan_path: str, *, bootstrap: str,
                  strategy: str = "auto", cut_mode: str = "control-events",
                  require: list[str] | None = None, compare: bool = False,
                  reconcile: str = "auto", master: str = "local[2]",
                  trigger: str = "1 second", plan_file: str | None = None,
                  rollback_of: str = "", plan: Plan | None = None) -> Migration:
    """A new migration of the running ``query`` to the plan at ``new_plan_path`` (recorded
    in the store), not saved yet; refused when the query is unknown or already migrating.
    ``plan_file``: the user's file of that plan (default: ``new_plan_path``); ``plan``: that
    plan when the caller loaded it already (a job file is not imported twice)."""
    running = store.live_instance(query)
    st = store.status(running)
    if not st:
        raise InvalidRequest(f"query '{query}' is not known to the store",
                             file=new_plan_path, expected="a query started with theseus "
                             f"run in the store {store.root}", found="nothing")
    try:
        prev: Migration | None = current(store, query)
    except NoMigration:
        prev = None
    if prev is not None and prev.phase not in TERMINAL:
        # The caller holds the query's lease (migrate.lease): no process runs this
        # one, so resuming or aborting it runs beside nobody.
        raise Refused(f"migration {prev.id} of '{query}' is in phase {prev.phase} and "
                      "no process runs it", file=str(store.migration_path(prev.id)),
                      hint=f"theseus migrate resume {query} continues it; theseus "
                           f"migrate abort {query} rolls it back")
    gen = int(st.get("generation", 0)) + 1
    while store.query_dir(f"{query}.g{gen}").exists() or \
            ack_path(store.root, f"{query}.g{gen}").exists():
        gen += 1  # an aborted migration's shadow: its checkpoint and acks are not ours
    mid = f"m{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"
    recorded = store.root / "migrations" / f"{mid}.plan.json"
    # the plan as JSON (a SQL plan compiled), as `theseus run` records the plan it runs
    atomic_write(recorded, dumps(plan if plan is not None else load_plan(new_plan_path)))
    # the plan the query runs now, kept: the store keeps one plan per instance, and a
    # migration's finish writes the new one over the query's (migrate rollback goes back)
    kept = store.root / "migrations" / f"{mid}.old.plan.json"
    try:
        atomic_write(kept, store.plan_path(running).read_text(encoding="utf-8"))
        old_plan = str(kept)
    except FileNotFoundError:  # a status without a plan: nothing to go back to
        old_plan = ""
    return Migration(id=mid, query=query, new_plan=str(recorded), old_instance=running,
                     new_instance=f"{query}.g{gen}", generation=gen, strategy=strategy,
                     cut_mode=cut_mode, require=list(require or []), compare=compare,
                     reconcile=reconcile, bootstrap=bootstrap, master=master,
                     trigger=trigger,
                     plan_file=plan_file or os.path.abspath(new_plan_path),
                     plan_digest=source_digest(plan_file or new_plan_path),
                     old_plan=old_plan, old_plan_file=user_file(store, running),
                     rollback_of=rollback_of, previous=prev.id if prev is not None else "")
