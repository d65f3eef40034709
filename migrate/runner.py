"""Runs a migration through its phases: :data:`HANDLERS` maps every phase of
:data:`migrate.protocol.PHASES` that acts to its handler (one module of
:mod:`migrate.phases` per step); :func:`step` records the phase, runs its handler and
records the next phase of the path, so the record alone says where a resume re-enters.
A run renews its owner's lease before every step (:mod:`migrate.lease`), catches up with
what an expiry left when it starts (:mod:`migrate.phases.catch_up`), and pauses again when
its lease lapsed while the queries were paused."""

from __future__ import annotations

from collections.abc import Callable

from compat.errors import DeadlineExceeded, MigrationError, RuntimeFailure, TheseusError
from migrate.context import Context
from migrate.lease import Lapsed
from migrate.phases import (
    align,
    check,
    cut,
    cutover,
    finish,
    in_place,
    pause,
    preview,
    shadow,
)
from migrate.phases.catch_up import catch_up, rewind
from migrate.protocol import TERMINAL, next_phase, resume_phase, step_number
from migrate.record import Migration, resume_hint

#: phase -> its handler; every phase of the table but the terminal ones has one
HANDLERS: dict[str, Callable[[Migration, Context], None]] = {
    "check": check.check,
    "in_place": in_place.in_place,
    "shadow": shadow.shadow,
    "pause": pause.pause,
    "cut": cut.cut,
    "align": align.align,
    "propagate": align.propagate,
    "cutover": cutover.cutover,
    "finish": finish.finish,
    "preview": preview.preview,
}


def run(m: Migration, ctx: Context) -> Migration:
    """Run ``m`` from its recorded phase until it ends (done, or refused)."""
    m.phase = resume_phase(m.kind, m.phase)
    catch_up(m, ctx)
    while m.phase not in TERMINAL:
        step(m, ctx)
    return m


def step(m: Migration, ctx: Context) -> None:
    """Run the step of the recorded phase: one phase (a cascade interleaves the phases
    of its migrations, :mod:`migrate.cascade`).  The phase is recorded before its handler
    acts; once it is done the next phase of the path is recorded (the last one, ``done``,
    as a phase of its own)."""
    phase = m.phase
    handler = HANDLERS[phase]
    try:
        ctx.renew()
        ctx.enter(m, phase)
        handler(m, ctx)
        after = next_phase(m)
        if after in TERMINAL:
            ctx.enter(m, after)
        else:
            m.phase = after
            ctx.save(m)
    except Lapsed as e:
        # the queries may have read on past the pause: never cut at H, pause again
        rewind(m, ctx, e.message)
    except DeadlineExceeded as e:
        n = step_number(m.kind, phase, m.dry_run)
        e.message = f"step {n} ({phase}) of migration {m.id}: {e.message}"
        e.args = (e.render(),)
        raise
    except MigrationError:
        raise
    except RuntimeFailure as e:
        # Kafka, the store or a gate failed under this step: one message that says
        # which step, what failed, and that the recorded phase can be resumed.
        n = step_number(m.kind, phase, m.dry_run)
        m.error = e.render()
        try:
            ctx.save(m)
        except TheseusError:  # the store itself failed (or the lease is gone): say why
            pass
        raise MigrationError(f"step {n} ({phase}) of migration {m.id} failed: "
                             f"{e.render()}", hint=resume_hint(m.query)) from e
