"""Step 3. Pause: once the shadow keeps pace near the head, cap both queries at the high
watermarks H and wait until both acknowledge H; a reconciling migration then counts what a
cut there would correct, add and delete, and stops before the cut when it would delete too
much of the output (the delete guard, :mod:`migrate.phases.guard`).  A cascade's downstream
has no pause of its own: its shadow catches up with the upstream shadow's side topic
(:func:`catch_up`)."""

from __future__ import annotations

import json
import time

from compat.errors import GateStateError
from gates.cascade import read_switch
from gates.state import is_acked, read_ack
from migrate import sides
from migrate.context import Context
from migrate.phases.guard import DeleteGuard
from migrate.progress import Rate, backfill_counts, bar_line
from migrate.record import Migration, json_offsets


def pause(m: Migration, ctx: Context) -> None:
    if m.cut_from:
        catch_up(m, ctx)
        return
    per = sides.instance_topics(ctx.store, m)
    topics = sorted({t for ts in per.values() for t in ts})
    inst = m.new_instance

    # Close to the head is not enough: the shadow must keep pace there for a few
    # batches. A shadow fresh from its backfill runs its first small batches on a cold
    # JVM (code generation, JIT), several times slower than the old query's; paused
    # then, it would reach the cut a batch late and the output would stall for it.
    steady = {"batches": 0, "at": ""}  # batches in a row near the head, and the last
    rate = Rate()
    guard = DeleteGuard(m, ctx)
    src = sides.source_gate(ctx.store, inst)  # the loop query of a recursive plan

    def keeping_up() -> bool:
        done = ctx.gates.acked(src)
        high = ctx.topics.high_watermarks(m.bootstrap, per[src])
        lag = {t: {p: max(0, hi - done.get(t, {}).get(p, 0)) for p, hi in parts.items()}
               for t, parts in high.items()}
        total = sum(sum(ps.values()) for ps in lag.values())
        if total > ctx.lag_threshold or not ctx.processes.running(inst):
            steady.update(batches=0, at="")
        else:
            if not any(h[0] == "caught_up" for h in m.history):
                # the backfill ends here
                m.history.append(["caught_up", round(time.time(), 3)])
                ctx.save(m)
            at = json.dumps(done, sort_keys=True)
            if total == 0 or at != steady["at"]:  # a new batch, or idle at the head
                steady.update(batches=steady["batches"] + 1, at=at)
        n = steady["batches"]
        if n:
            guard.read_ahead()  # near the head: read both topics now, the tails at H
            ctx.live(f"  shadow near the head: lag {total:,} records, {n} of "
                     f"{ctx.steady_batches} batches in a row", "steady")
        else:
            read, whole, since = backfill_counts(m.backfill or {"to": json_offsets(high)},
                                                 done, high)
            ctx.live("  " + bar_line(read, whole, rate.add(read), arrived=since), "backfill")
        return n >= ctx.steady_batches

    ctx.wait(m, "the shadow to catch up", keeping_up, interval=1.0, show=False)
    m.history.append(["steady", round(time.time(), 3)])
    high = ctx.topics.high_watermarks(m.bootstrap, topics)
    m.high = json_offsets(high)
    ctx.save(m)
    first = m.epoch + 1
    for q, ts in per.items():
        # held by the lease: a migrator gone from here on never stalls the output for
        # longer than its TTL (gates.lease)
        ctx.gates.set(m, q, "capped", {t: high[t] for t in ts}, leased=True)
    for q, ts in per.items():
        cap = {t: high[t] for t in ts}
        ctx.wait(m, f"'{q}' to reach H", lambda q=q, cap=cap: is_acked(
            ctx.store.root, q, cap, first))
    # Before any control event: what a cut at H would reconcile, and the delete guard.
    guard.judge(m.high)


def catch_up(m: Migration, ctx: Context) -> None:
    """Step 3 of a cascade's downstream: no pause of its own (its cut is the upstream's,
    propagated); its shadow reads the upstream shadow's side topic: wait until it is near
    that topic's head and keeps the trigger's pace there (``steady_batches`` batches in
    a row, each planned within 1.3 trigger intervals of the one before), so that it
    switches quickly at the upstream's hand-over. A shadow fresh from its backfill runs
    its first batches on a cold JVM, slower than its trigger: cut then, each of its two
    batches of the hand-over (the side topic's tail, then the topic from the cut) would
    add to the chain's stall. A shadow that stays near the head but never keeps the pace
    (a machine too slow for the trigger) is not waited for beyond three times as many
    batches."""
    inst = m.new_instance
    sw = read_switch(ctx.store.root, inst) or {}
    side = sw.get("side") or sides.compare_topic(ctx.record(m.cut_from))
    pace = 1.3 * trigger_seconds(m.trigger)
    seen = {"time": None, "paced": 0, "near": 0}

    def near() -> bool:
        try:
            entry = read_ack(ctx.store.root, inst)["topics"].get(side) or {}
        except GateStateError:
            entry = {}
        done = {int(p): int(o) for p, o in (entry.get("offsets") or {}).items()}
        high = ctx.topics.high_watermarks(m.bootstrap, [side]).get(side, {})
        lag = sum(max(0, h - done.get(p, 0)) for p, h in high.items())
        at = entry.get("time")
        if not ctx.processes.running(inst) or lag > ctx.lag_threshold:
            seen.update(paced=0, near=0)
        elif at is not None and at != seen["time"]:  # a new batch planned
            if seen["time"] is not None:
                seen["near"] += 1
                paced = float(at) - float(seen["time"]) <= pace
                seen["paced"] = seen["paced"] + 1 if paced else 0
        seen["time"] = at
        ctx.live(f"  downstream shadow on {side}: lag {lag:,} records, "
                 f"{seen['paced']} of {ctx.steady_batches} batches at the trigger's "
                 "pace", "catch up")
        return seen["paced"] >= ctx.steady_batches or \
            seen["near"] >= 3 * ctx.steady_batches

    ctx.wait(m, f"the shadow '{inst}' to catch up with {side}", near, interval=0.25,
             show=False)


def trigger_seconds(trigger: str) -> float:
    """Seconds of a processing-time trigger as ``--trigger`` says it (``1 second``,
    ``500 milliseconds``, ``2 minutes``); 1.0 when it does not parse."""
    units = {"ms": 0.001, "millisecond": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0,
             "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
    parts = trigger.strip().lower().split()
    try:
        n = float(parts[0])
    except (IndexError, ValueError):
        return 1.0
    unit = parts[1].rstrip("s") if len(parts) > 1 else "s"
    unit = unit if unit in units else unit + "s" if unit + "s" in units else unit
    return n * units.get(unit, 1.0)
