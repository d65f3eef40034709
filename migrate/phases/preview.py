"""Step 3 of a dry run (``theseus migrate start --dry-run``): what the cutover would do.

Steps 1 and 2 are the real run's (the check with its preflight and refusals; the shadow,
its output before the cut in the side topic when it reconciles).  Then, with no cap on the
old query, no control event and nothing written to the output:

1. note the high watermarks of the shadow's source topics (the head, ``head``) and wait
   until the shadow has acknowledged them: its output for all input before the head is
   committed to the side topic;
2. count the reconciliation against the output's last value per key as it is now, the way
   the shadow's sink would (:class:`gates.reconcile.Comparison`, as the delete guard of
   step 3 counts it), with the delete guard's verdict.  The old query keeps writing
   meanwhile, so a key whose input arrives while the dry run reads may count as corrected
   where the real cut finds it already right (or the reverse); deleted and added keys, the
   guard's business, change only with keys that are new since;
3. stop the shadow and delete the topic the dry run created (its side topic).

The report (:attr:`Migration.preview`): the path, the reconciliation's counts and the guard's
verdict, the topics the real run would create and the control events it would write
(how many, into which topics; from step 1, :func:`planned`).  The record stays in the
store, marked ``dry_run``; the query's current migration is the one before it
(:func:`migrate.migration.start`)."""

from __future__ import annotations

import json
from typing import Any

from compat.errors import Refused
from compat.model import Plan
from gates.state import is_acked
from migrate import sides
from migrate.context import Context
from migrate.phases import guard
from migrate.record import Migration, int_offsets, json_offsets


def planned(m: Migration, old: Plan, new: Plan, have: dict[str, int]) -> dict[str, Any]:
    """What the real run would create and write, from step 1's decisions and the
    cluster's topics (``have``: name -> partitions)."""
    if m.kind != "shadow":
        return {"path": m.kind, "topics_created": [],
                "control_events": {"count": 0, "topics": {}}}
    side = sides.compare_topic(m) if sides.side_topic_used(m) else None
    topics = sorted(set(sides.source_topics(old)) | set(sides.source_topics(new)))
    events = {t: have.get(t, 0) for t in topics} if m.cut_mode == "control-events" else {}
    return {"path": "shadow",
            "topics_created": [side] if side is not None and side not in have else [],
            "control_events": {"count": sum(events.values()), "topics": events}}


def preview(m: Migration, ctx: Context) -> None:
    if m.kind == "shadow":
        at_head(m, ctx)
        if m.reconciling:
            views = guard.comparison(m, ctx)
            g = guard.verdict(guard.count(views), m.max_delete_ratio, m.allow_deletes)
            m.guard = {**g, "at": m.preview["head"]}
            ctx.save(m)
        clean_up(m, ctx)
    for line in render(m):
        ctx.echo(line)


def at_head(m: Migration, ctx: Context) -> None:
    """Wait until the shadow acknowledged the head (noted once: a resumed dry run waits
    for the same offsets)."""
    inst = m.new_instance
    gate = sides.source_gate(ctx.store, inst)
    if not m.preview.get("head"):
        topics = sides.instance_topics(ctx.store, m)[gate]
        m.preview["head"] = json_offsets(ctx.topics.high_watermarks(m.bootstrap, topics))
        ctx.save(m)
    head = int_offsets(m.preview["head"])

    def there() -> bool:
        ctx.processes.check_alive(m, always=True)  # a shadow that failed never gets there
        return is_acked(ctx.store.root, gate, head)

    ctx.wait(m, f"the shadow '{inst}' to reach the head", there)


def clean_up(m: Migration, ctx: Context) -> None:
    """Stop the shadow; delete the topics the dry run created (a real run deletes its side
    topic when it ends too; one that was there before stays)."""
    ctx.store.request_stop(m.new_instance)
    ctx.processes.wait_stopped(m)
    for topic in m.preview.get("topics_created", []):
        ctx.topics.delete_topic(m.bootstrap, topic)


def render(m: Migration) -> list[str]:
    """The dry run's report as lines of text."""
    p, g = m.preview, m.guard
    lines = [f"dry run of migration {m.id} of '{m.query}' to {m.plan_file or m.new_plan}: "
             f"verdict {m.verdict}, " + ("a live migration through a shadow query"
                                         if m.kind == "shadow" else
                                         "a restart in place on the checkpoint")]
    if m.kind != "shadow":
        lines.append("  no shadow, no control event, no new topic")
        return lines
    if g:
        lines.append(f"  reconciliation at the cut (counted with the shadow at the head "
                     f"{json.dumps(p.get('head'))}): {g['corrected']} corrected, "
                     f"{g['added']} added, "
                     f"{g['deleted']} deleted, {g['matched']} already right, of the "
                     f"output's {g['keys']} keys")
        lines.append("  delete guard: " + (
            f"would refuse: {g['ratio']:.0%} of the keys deleted, more than "
            f"--max-delete-ratio {g['max_ratio']:.0%} (--allow-deletes lets it)"
            if g["refuses"] else
            f"passes: {g['ratio']:.0%} of the keys deleted" +
            (" (--allow-deletes)" if g["allow_deletes"] and g["deleted"] else
             f", at most {g['max_ratio']:.0%}")))
    else:
        lines.append("  no reconciliation (" + ("--reconcile off" if m.reconcile == "off"
                                                 else "the output is not reconciled") + ")")
    created = p.get("topics_created") or []
    lines.append("  topics it would create: " + (
        ", ".join(f"{t} (deleted when the migration ends)" for t in created) or "none"))
    ce = p.get("control_events") or {}
    lines.append(f"  control events it would write: {ce.get('count', 0)}" + (
        ", one into every partition of " + ", ".join(
            f"{t} ({n})" for t, n in sorted(ce["topics"].items()))
        if ce.get("topics") else " (--cut offsets)" if m.cut_mode == "offsets" else ""))
    return lines


def report(m: Migration) -> dict[str, Any]:
    """The dry run's report as ``--format json`` prints it."""
    p = m.preview
    return {"migration": m.id, "query": m.query, "plan": m.plan_file or m.new_plan,
            "dry_run": True, "verdict": m.verdict, "path": p.get("path", m.kind),
            "reconciliation": {k: m.guard[k] for k in
                               ("corrected", "added", "deleted", "matched", "keys")}
            if m.guard else None,
            "delete_guard": {k: m.guard[k] for k in
                             ("ratio", "max_ratio", "allow_deletes", "refuses")}
            if m.guard else None,
            "head": p.get("head"), "topics_created": p.get("topics_created", []),
            "control_events": p.get("control_events", {}),
            "warnings": p.get("warnings", [])}


def would_refuse(m: Migration) -> Refused | None:
    """The refusal the real run would meet at step 3 (the delete guard), if any."""
    if m.guard and m.guard.get("refuses"):
        return guard.refusal(m, m.guard, "the migration (dry run)")
    return None
