"""Live migrations, the protocol: the one table of the phases, their order and their numbers.

The protocol is docs/design.md's "The migration protocol"; the step numbers below are its
numbers.  Each phase is handled by one function of :mod:`migrate.phases` over the migration
record and a shared :class:`~migrate.context.Context` (:data:`migrate.runner.HANDLERS` maps
phase to handler).  The runner records every phase in the store *before* its handler acts, and every
handler is idempotent, so a migrator killed anywhere resumes (``theseus migrate resume``:
the recorded phase is where it re-enters) or rolls back (``theseus migrate abort``) without
loss.  All coordination goes through the store: the old query may run in another process
on another host.  One :class:`~gates.deadline.Deadline` (``--timeout``) bounds every wait
and every Kafka call of a run; running out raises one
:class:`~compat.errors.DeadlineExceeded` naming what was awaited.  A failure of a step (a
broker that does not answer, a control record not delivered) ends the run with one
:class:`~compat.errors.MigrationError` naming the step, the phase stays recorded, and
``resume`` retries it.

1. Check     refuse ``unsupported``; the preflight, before anything is written: refuse a
             source topic of the new plan that does not exist, warn on an empty one;
             ``in_place`` is a graceful stop and a restart on the
             same checkpoint (unless ``--strategy shadow``): the in-place path, below —
             once the checkpoint check agrees (``auto`` goes through a shadow when the
             checkpoint contradicts the plan check or cannot be read on this host).
             (:mod:`migrate.phases.check`)
2. Shadow    start the new plan as a new instance (fresh checkpoint, earliest offsets) with
             its start gate closed: its output is discarded while it backfills.
             (:mod:`migrate.phases.shadow`)
3. Pause     when the shadow keeps pace near the head (``steady_batches`` batches in a
             row), cap both queries at the high watermarks H and wait until both
             acknowledge H. (:mod:`migrate.phases.pause`)  A reconciling migration then
             counts what a cut at H would reconcile and, without ``--allow-deletes``,
             stops here, the pause rolled back, when it would delete more than
             ``--max-delete-ratio`` of the output's keys: no control event is ever
             written before this guard passed. (:mod:`migrate.phases.guard`)
4. Cut       write one control event into every partition of every source topic; their
             offsets are the cut C (``--cut offsets``: C = H, nothing is written).  C is
             checked to be at or beyond H in every partition (a topic deleted and
             created again since the pause would put it behind).  Both
             gates now admit data up to C; the shadow's cap *follows* the old query: it
             reads on past C by itself, and its start gate opens *from C*, holding the
             first batch from C until the old query acknowledged C (all its output
             before C committed) — without waiting for this process, so the shadow
             computes that batch while the old query finishes and the output stall is
             about one batch.  The old query's cap *retires* it: once it acknowledged C
             its sink writes nothing more and its host stops it. (:mod:`migrate.phases.cut`)
5. Align     wait until both queries acknowledge C: everything before C is committed.
             (A cascade's upstream waits for its old query here and propagates its cut
             into its output at once, phase ``propagate``; its shadow's alignment is
             awaited before the downstream shadow switches and before its own cutover:
             ``migrate.cascade``.) (:mod:`migrate.phases.align`)
6. Cutover   wait until the shadow writes; record its gates open; stop the old query.
             A reconciling shadow (``--reconcile``, :mod:`gates.reconcile`) writes, in the
             transaction of its first batch from C, the corrections that make the compacted
             output the new plan over all input before C; this step waits until they are
             committed (restarting the shadow's host if it died) and records their counts.
             (:mod:`migrate.phases.cutover`)
7. Finish    record the new plan and instance as the query's; the migration is done.
             (:mod:`migrate.phases.finish`)

The in-place path (the design's step 1 carried out) has its own numbers:

1. Check     as above; the verdict is ``in_place`` (or ``identical``).
2. In place  stop the query between batches, restart it on the same checkpoint with the
             new plan (skipped when resumed after it already runs the new plan).
             (:mod:`migrate.phases.in_place`)
3. Finish    record the new plan as the query's; the migration is done.

The dry run (``migrate start --dry-run``) has its own numbers.  It writes no control event,
caps neither query, writes nothing to the output, and leaves the query's current migration
as it found it:

1. Check     as above: the real run's refusals, preflight included.
2. Shadow    as above, when step 1 decided a shadow migration (``only_if``).
3. Preview   wait until the shadow reached the head; count what the cutover would do
             (the reconciliation against the output's last value per key, the delete
             guard's verdict, the topics it would create, the control events it would
             write); stop the shadow and delete the side topic it created.
             (:mod:`migrate.phases.preview`)
4. Previewed the report is in the record; the query's current migration is the one before.

``abort`` before the cutover vetoes the hand-over atomically with the old query's
acknowledgements (one lock, one file) and refuses when the old query already acknowledged
C (the shadow may be writing): ``resume`` then finishes (:mod:`migrate.phases.rollback`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from compat.errors import MigrationError


class Phase(NamedTuple):
    """One row of :data:`PHASES`."""

    #: its step on the shadow path (docs/design.md's numbers); None: not a step of that path
    shadow: int | None
    #: its step on the in-place path
    in_place: int | None
    #: the step of the shadow path it is part of, when it has no number of its own
    part_of: int | None = None
    #: a field of the record that must be set for the phase to run (else it is passed over)
    only_if: str = ""
    #: the migration ends here: nothing runs, a resume has nothing to do
    terminal: bool = False
    #: its step on the dry run's path (``--dry-run``)
    dry_run: int | None = None


# Every phase of the three paths, in the order they run: phase -> Phase(its step on the
# shadow path, on the in-place path, ..., on the dry run's).  A phase runs its handler and
# then the next phase of its path (the record's ``kind``, decided in step 1, or its
# ``dry_run``) is recorded; a resume re-enters at the recorded phase.
PHASES: dict[str, Phase] = {
    "check": Phase(1, 1, dry_run=1),
    "in_place": Phase(None, 2),
    "shadow": Phase(2, None, only_if="shadowing", dry_run=2),
    "pause": Phase(3, None),
    "cut": Phase(4, None),
    "align": Phase(5, None),
    # a cascade's upstream: its cut propagated into its output, the downstream's cut
    "propagate": Phase(None, None, part_of=5, only_if="feeds"),
    "cutover": Phase(6, None),
    "finish": Phase(7, 3),
    "done": Phase(8, 4, terminal=True),
    "aborted": Phase(None, None, terminal=True),
    "refused": Phase(None, None, terminal=True),
    "preview": Phase(None, None, dry_run=3),
    "previewed": Phase(None, None, terminal=True, dry_run=4),
}
TERMINAL = tuple(name for name, row in PHASES.items() if row.terminal)
#: phases recorded under another name by an earlier Theseus: (path, phase) -> where a resume
#: re-enters (the in-place restart was recorded as "cutover" before it had its own phase)
RENAMED = {("in_place", "cutover"): "in_place"}


def step_number(kind: str, phase: str, dry_run: bool = False) -> int | None:
    """The number of ``phase`` on the path ``kind`` (``shadow``, ``in_place``, or "" while
    undecided; a dry run has a path of its own), None for a phase that is not a step
    (``aborted``, ``refused``)."""
    row = PHASES.get(phase, Phase(None, None))
    if dry_run:
        return row.dry_run
    return row.in_place if kind == "in_place" else row.shadow


def path_of(kind: str, dry_run: bool = False) -> tuple[str, ...]:
    """The phases of the path ``kind`` in order (the shadow path while undecided; with
    ``dry_run``, the dry run's whatever the kind)."""
    if dry_run:
        return tuple(name for name, row in PHASES.items() if row.dry_run is not None)
    if kind == "in_place":
        return tuple(name for name, row in PHASES.items() if row.in_place is not None)
    return tuple(name for name, row in PHASES.items()
                 if row.shadow is not None or row.part_of is not None)


def next_phase(m: Any) -> str:
    """The phase that follows the recorded one of the migration ``m`` on its path."""
    order = path_of(m.kind, getattr(m, "dry_run", False))
    if m.phase in order:
        for name in order[order.index(m.phase) + 1:]:
            row = PHASES[name]
            if not row.only_if or getattr(m, row.only_if):
                return name
    raise MigrationError(f"migration {m.id}: no phase follows '{m.phase}' on the "
                         f"{m.kind or 'undecided'} path", expected=", ".join(order),
                         found=m.phase)


def resume_phase(kind: str, phase: str) -> str:
    """Where a migration recorded in ``phase`` re-enters."""
    return RENAMED.get((kind, phase), phase)
