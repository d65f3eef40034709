"""Catching up after an expiry: where a migration goes on once its lease changed hands, or
lapsed while the pause was in force (:mod:`gates.lease` says what a stale lease lifts).

A new owner (``resume``) and an owner whose renewal came too late (:class:`migrate.lease.
Lapsed`) cannot know whether the queries read on past the pause while it was lifted, and
need not: before the cap at C that retires the old query, pausing again is always safe.

* phase ``pause`` (the caps at H may be in force) and ``cut`` before the old query's cap at C:
  reopen both queries' gates (they may be capped at an H the queries passed, or hold the
  shadow where it cannot keep pace), reset the shadow's start gate, forget H and C, and
  enter step 3 again: the shadow catches up, both are capped at the new high watermarks and
  a new cut is written.  Control events of a forgotten cut are skipped as data and
  tombstoned with the migration's others.
* ``cut`` once the old query is capped at C: step 4 is done (a crash before ``align`` was
  recorded); go on with step 5, which arms what is missing.
* ``align`` when the old query read past C (its pause was lifted before its cap at C was
  written): it can never hand over at C (:func:`gates.state.handed_over`), so pause again.
* anything else: nothing an expiry can have lifted (the hand-over goes on by itself).

A cascade's downstream has no pause of its own, and a plan with a recursive step is caught
up in step 3 only (its loops' caps at C are never leased).
"""

from __future__ import annotations

import time

from gates.startgate import write_start_gate
from gates.state import overran, read_gate
from migrate import sides
from migrate.context import Context
from migrate.protocol import TERMINAL
from migrate.record import Migration, int_offsets


def catch_up(m: Migration, ctx: Context) -> None:
    """Put ``m`` where its new owner goes on (the module's docstring)."""
    if m.kind != "shadow" or m.phase in TERMINAL or m.cut_from:
        return
    if m.phase == "pause":
        if any(read_gate(ctx.store.root, g).mode != "open" for g in _gates(m, ctx)):
            rewind(m, ctx, "the queries may have read on while the migrator was gone")
    elif m.phase == "cut":
        if m.cut and _armed(m, ctx):
            m.phase = "align"
            ctx.save(m)
        else:
            rewind(m, ctx, "the cut was not armed when the migrator stopped")
    elif m.phase == "align" and m.cut and not m.out_cut and \
            not sides.through_loops(ctx.store, m):
        past = overran(ctx.store.root, m.old_instance, sides.output_cut(ctx.store, m, "old"),
                       marks=m.cut_mode != "offsets")
        if past:
            rewind(m, ctx, "the old query read past the cut while its pause was lifted ("
                   + ", ".join(f"{t} {ps}" for t, ps in sorted(past.items())) + ")")


def rewind(m: Migration, ctx: Context, why: str) -> None:
    """Reopen the queries and go back to step 3 (pause again from the new high
    watermarks)."""
    ctx.echo(f"[{m.id}] catching up: {why}; pausing again from the new high watermarks")
    for g in _gates(m, ctx):
        if read_gate(ctx.store.root, g).mode != "open":
            ctx.gates.set(m, g, "open")
    write_start_gate(ctx.store.root, m.new_instance, False, m.id,
                     reconcile=sides.reconcile_spec(m))
    m.high, m.cut, m.output_cuts = {}, {}, {}
    m.history.append(["rewound", round(time.time(), 3)])
    m.phase = "pause"
    ctx.save(m)


def _gates(m: Migration, ctx: Context) -> list[str]:
    """The gates a pause caps: each side's source gate (its loop query's, or its own)."""
    return list(sides.instance_topics(ctx.store, m))


def _armed(m: Migration, ctx: Context) -> bool:
    """The old side is capped at C for good (not a leased cap at H)."""
    old = sides.source_gate(ctx.store, m.old_instance)
    per = sides.instance_topics(ctx.store, m)
    full = int_offsets(m.cut)
    g = read_gate(ctx.store.root, old)
    return g.mode == "capped" and not g.lease and g.cap == {t: full[t] for t in per[old]}
