"""``deduplicate``: keeps the first row per key.  Enforcing: the keys are the state's key
schema and must match."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat import types as T
from compat.demand import Demand, columns, merge, moves_filter, own, reads
from compat.findings import MIGRATE, Finding, register_codes
from compat.infer import INSERT, InferContext, NodeInfo, duration_seconds, infer_step
from compat.model import DURATION, ENFORCING, NAME, Node, Plan, prop
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import Code, Refusal, export_step, var
from compat.rules import RuleContext, compare
from compat.signing import NodeSig, digest, duration, sign_step
from compat.steps.source import Source


@dataclass(frozen=True, kw_only=True)
class Deduplicate(Node):
    """Keeps the first row of every combination of ``keys``; with ``within``, a key is
    forgotten that long after its row's event time (Spark's
    ``dropDuplicatesWithinWatermark``)."""

    keys: tuple[str, ...] = prop(items=NAME, min_items=1)
    within: str | None = prop(None, schema=DURATION)
    step: ClassVar[str] = "deduplicate"
    klass: ClassVar[str] = ENFORCING


register_codes({
    "dedup-keys-changed": ("migrate", "error", "topology", MIGRATE),
    "dedup-within-changed": ("in_place", "warning", "data_selection",
                             "Rows are remembered for the new duration from the restart on."),
    "dedup-within-toggled": ("migrate", "error", "topology", MIGRATE),
    "dedup-state-schema-changed": ("migrate", "error", "schema_evolution", MIGRATE),
})


@infer_step.register
def _infer(node: Deduplicate, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    for i, k in enumerate(node.keys):
        if k.lower() not in src.types:
            raise ctx.err(node, f"keys/{i}", f"key column '{k}' is not in the input",
                          expected="one of " + ", ".join(src.types), found=repr(k))
    if src.mode != INSERT:
        raise ctx.err(node, "inputs", "Spark cannot deduplicate a stream of updates",
                      expected="[I]", found=f"[{src.mode}]")
    if node.within:
        ctx.duration(node, "within", node.within)
        if not src.watermarks:
            raise ctx.err(node, "within", "deduplication within a time needs a watermark "
                          "on the input", expected="an event_time upstream", found="none")
    return NodeInfo(src.columns, INSERT, src.stream, src.stream, src.watermarks, True,
                    src.names, windows=src.windows)


@reads.register
def _reads(node: Deduplicate, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    # Spark keeps the keys in state (and the rows' event time, within a time): the rest
    # of the row passes through only where it is read above.
    cols = set(columns(ins[0]))
    return [merge(demand, own(node, {k.lower() for k in node.keys} & cols))]


@moves_filter.register
def _moves(node: Deduplicate, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    return None  # Spark keeps a filter above a deduplication (measured on 4.3)


@compare.register
def _compare(old: Deduplicate, new: Deduplicate, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    if [k.lower() for k in old.keys] != [k.lower() for k in new.keys]:
        out.append(ctx.f("dedup-keys-changed", f"deduplicate '{new.id}' keys change from "
                         f"{list(old.keys)} to {list(new.keys)}", old, new, "keys"))
    else:
        a = [ctx.oi_input(old).types.get(k.lower(), T.UNKNOWN) for k in old.keys]
        b = [ctx.ni_input(new).types.get(k.lower(), T.UNKNOWN) for k in new.keys]
        if not all(T.same_layout(x, y) for x, y in zip(a, b)):
            out.append(ctx.f("dedup-state-schema-changed", f"deduplicate '{new.id}' keys its "
                             f"state by ({', '.join(b)}), was ({', '.join(a)}): Spark keeps "
                             "the keys in state and refuses the old ones "
                             "(STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE)", old, new, "keys"))
    if (old.within is None) != (new.within is None):
        out.append(ctx.f("dedup-within-toggled", f"deduplicate '{new.id}' "
                         f"{'now' if new.within else 'no longer'} forgets keys after a "
                         "time: a different Spark operator with a different state", old, new,
                         "within"))
    elif old.within and duration_seconds(old.within) != duration_seconds(new.within or ""):
        out.append(ctx.f("dedup-within-changed", f"deduplicate '{new.id}' remembers keys "
                         f"for {new.within} instead of {old.within}", old, new, "within"))
    return out


@sign_step.register
def _sign(node: Deduplicate, ins: list[NodeSig], names: tuple[str, ...],
          plan: Plan) -> NodeSig:
    (src,) = ins
    keys = tuple(sorted(src.columns.get(k.lower(), k.lower()) for k in node.keys))
    sig = digest("deduplicate", node.version, src.sig, keys, duration(node.within))
    return NodeSig(sig, src.columns)


@push_through.register
def _push_through(node: Deduplicate, c: Conjunct, g: PushGraph) -> Targets | None:
    keys = {k.lower() for k in node.keys}
    return [(node.inputs[0], c)] if c.used and c.used <= keys else None


@export_step.register
def _export(node: Deduplicate, plan: Plan) -> Code | Refusal:
    if node.within and _watermarks(plan, node.id) != {duration_seconds(node.within)}:
        return Refusal(f"deduplicate '{node.id}' keeps keys for {node.within}, not for its "
                       "watermark delay: Spark's dropDuplicatesWithinWatermark keeps them "
                       "for the watermark delay")
    fn = "dropDuplicatesWithinWatermark" if node.within else "dropDuplicates"
    return Code([f"{var(node.id)} = {var(node.inputs[0])}.{fn}({list(node.keys)!r})"])


def _watermarks(plan: Plan, nid: str) -> set[float | None]:
    """The watermark delays (seconds) of the sources upstream of ``nid``."""
    out: set[float | None] = set()
    stack = [nid]
    while stack:
        node = plan.nodes[stack.pop()]
        if isinstance(node, Source):
            out.add(duration_seconds(node.event_time.watermark) if node.event_time
                    else None)
        stack.extend(node.inputs)
    return out
