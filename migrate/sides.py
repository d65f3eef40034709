"""The two sides of a migration, the old query and the shadow, as the record and the store
describe them: their plans, the topics each reads and under which gate, where each one's
output query is cut, and where the shadow writes before the cut."""

from __future__ import annotations

from typing import Any

from compat.check import load_plan
from compat.model import Plan
from compat.steps import Recursive, Source
from compat.steps.source import SNAPSHOT, table_read
from migrate.record import Migration, int_offsets
from migrate.store import DirectoryStore


def plans(store: DirectoryStore, m: Migration) -> tuple[Plan, Plan]:
    """The old plan (as the old instance records it runs) and the new one."""
    old = load_plan(str(store.plan_path(m.old_instance)))
    new = load_plan(m.new_plan)
    return old, new


def source_topics(plan: Plan) -> list[str]:
    """The stream sources' topics: the cut, the caps and the acks are about these.

    A table read as a snapshot (latest value per key) is read whole at every batch, so it
    has no position to cap; its topic is left alone.  A table read as a changelog is a
    stream of its changes: it is cut like a stream."""
    return sorted({n.topic for n in plan.nodes.values()
                   if isinstance(n, Source) and table_read(n) != SNAPSHOT})


def has_recursion(plan: Plan) -> bool:
    return any(isinstance(n, Recursive) for n in plan.nodes.values())


def through_loops(store: DirectoryStore, m: Migration) -> bool:
    """A plan of this migration has a recursive step: the cut goes through the loops."""
    return any(map(has_recursion, plans(store, m)))


def loops(store: DirectoryStore, instance: str) -> dict[str, dict[str, str]]:
    """The loop queries ``instance`` runs, as its host recorded them (``theseus run``):
    recursive step id -> its gate and its internal topic."""
    return dict(store.status(instance).get("loops") or {})


def source_gate(store: DirectoryStore, instance: str) -> str:
    """The gate under which ``instance`` reads its source topics: its loop query's when
    it runs one (the output query behind it reads the loop's internal topic under the
    instance's own gate), else its own."""
    running = loops(store, instance)
    return next(iter(running.values()))["gate"] if running else instance


def instance_topics(store: DirectoryStore, m: Migration) -> dict[str, list[str]]:
    """The source topics of each side, by the gate that caps their reading: the
    instance's own, or its loop query's for a plan with a recursive step."""
    old, new = plans(store, m)
    return {source_gate(store, m.old_instance): source_topics(old),
            source_gate(store, m.new_instance): source_topics(new)}


def output_cut(store: DirectoryStore, m: Migration, side: str) -> dict[str, dict[int, int]]:
    """Where the output query of ``side`` (old, new) is cut; a plan without recursion:
    at C."""
    if side in m.output_cuts:
        return int_offsets(m.output_cuts[side])
    full = int_offsets(m.cut)
    plan = plans(store, m)[0 if side == "old" else 1]
    return {t: full[t] for t in source_topics(plan)}


def output_topic(m: Migration) -> str:
    """The topic the new plan writes (through which a cascade's upstream feeds)."""
    return load_plan(m.new_plan).sink.topic


def side_topic_used(m: Migration) -> bool:
    """The shadow writes its output before the cut to ``<output>.shadow``: with
    --compare, to reconcile, and for the downstream shadows of a cascade."""
    return m.compare or m.reconciling or bool(m.feeds)


def compare_topic(m: Migration) -> str:
    """``<output>.shadow``: where the shadow writes until the cutover with --compare."""
    return f"{output_topic(m)}.shadow"


def reconcile_spec(m: Migration) -> dict[str, Any] | None:
    """What the shadow's start gate says about reconciliation (gates.reconcile)."""
    if not m.reconciling:
        return None
    return {"topic": compare_topic(m), "from": m.side_from, "migration": m.id}
