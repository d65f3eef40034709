"""Plan-level settings: ``state_partitions`` is fixed forever by a checkpoint; and the order
of the stream sources, which a checkpoint's offset log fixes too."""

from __future__ import annotations

from compat.findings import MIGRATE, Finding, finding, register_codes
from compat.model import Plan
from compat.rules import RuleContext

register_codes({
    "sources-reordered": ("migrate", "error", "topology", MIGRATE),
})


def stream_sources(plan: Plan) -> list[str]:
    """The topics of the plan's stream sources in Spark's order: the leaves of its plan
    from the sink, inputs left to right, a source read twice counted once."""
    seen: dict[str, None] = {}
    done: set[str] = set()
    # a stack, not recursion: plans are thousands of steps deep
    stack = [plan.sink_id]
    while stack:
        nid = stack.pop()
        node = plan.nodes[nid]
        if not node.inputs:
            if plan.info[nid].stream:
                seen.setdefault(nid, None)
        elif nid not in done:  # a shared subtree's leaves come where Spark first sees them
            done.add(nid)
            stack.extend(reversed(node.inputs))
    return [getattr(plan.nodes[n], "topic", n) for n in seen]


def check_sources_order(ctx: RuleContext) -> list[Finding]:
    # A restart gives stream source i the checkpoint's offsets of source i: the same
    # sources in another order (a union's inputs listed the other way) hand each the other
    # topic's offsets.  Spark's Kafka connector fails ("Some data may have been lost"), the
    # gated source finds no offset for its topic (make truth, union_inputs_reordered).
    before, after = stream_sources(ctx.old), stream_sources(ctx.new)
    if before == after or sorted(before) != sorted(after):
        return []  # the same order, or other sources (their own findings say so)
    return [finding("sources-reordered",
                    f"the stream sources are read in another order ({', '.join(before)} -> "
                    f"{', '.join(after)}): Spark matches a restart's sources to the "
                    "checkpoint's offsets by position, so each gets another topic's offsets "
                    "and the restart fails", new_pointer="/nodes")]


def check_config(ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    old, new = ctx.old, ctx.new
    a, b = old.state_partitions, new.state_partitions
    if a != b:
        stateful = any(i.stateful for i in new.info.values())
        msg = f"config.state_partitions changes from {a or 'default'} to {b or 'default'}"
        if stateful:
            msg += "; the checkpoint fixes the number of state partitions forever"
        out.append(finding("state-partitions-changed", msg, old_pointer=
                           "/config/state_partitions", new_pointer="/config/state_partitions",
                           effect=None if stateful else "in_place",
                           severity=None if stateful else "info"))
    rest_a = {k: v for k, v in old.config.items() if k != "state_partitions"}
    rest_b = {k: v for k, v in new.config.items() if k != "state_partitions"}
    if rest_a != rest_b:
        keys = sorted(k for k in set(rest_a) | set(rest_b) if rest_a.get(k) != rest_b.get(k))
        out.append(finding("config-changed", f"config keys changed: {', '.join(keys)}",
                           old_pointer="/config", new_pointer="/config"))
    return out + check_sources_order(ctx)
