"""``sink``: writes the query's output to a Kafka topic.  Enforcing: the topic, key
columns (by name and order: the key's bytes decide partitioning and compaction), mode and
format must match; delivery may change.  What consumers notice of the output (its schema
and changelog mode) is the cross-step family ``compat.rules.output``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compat import types as T
from compat.findings import NEW_OUTPUT, RESTART, Finding, register_codes
from compat.infer import INSERT, RETRACT, UPSERT, InferContext, NodeInfo, infer_step
from compat.model import ENFORCING, NAME, RECORD_FORMAT, Node, enum, prop
from compat.rules import RuleContext, compare


@dataclass(frozen=True, kw_only=True)
class Sink(Node):
    """Writes every row as a JSON (or string) record keyed by ``key_columns``; a retraction
    is a tombstone for its key.  ``exactly_once`` writes each micro-batch in one Kafka
    transaction and skips a batch already written."""

    topic: str = prop(schema=NAME)
    format: str = prop(schema=RECORD_FORMAT)
    key_columns: tuple[str, ...] = prop(items=NAME)
    mode: str = prop(schema=enum("append", "update", "complete"))
    delivery: str = prop(schema=enum("exactly_once", "at_least_once"))
    step: ClassVar[str] = "sink"
    klass: ClassVar[str] = ENFORCING
    infers_from_inputs: ClassVar[bool] = False  # complete mode looks for an aggregate upstream


register_codes({
    "sink-topic-changed": ("unsupported", "error", "topology", NEW_OUTPUT),
    "sink-key-changed": ("unsupported", "error", "topology", NEW_OUTPUT),
    "sink-mode-changed": ("unsupported", "error", "topology", NEW_OUTPUT),
    "sink-format-changed": ("unsupported", "error", "schema_evolution", NEW_OUTPUT),
    "sink-delivery-changed": ("in_place", "warning", "transparent", RESTART),
})


@infer_step.register
def _infer(node: Sink, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    for i, k in enumerate(node.key_columns):
        if k.lower() not in src.types:
            raise ctx.err(node, f"key_columns/{i}", f"key column '{k}' is not in the output",
                          expected="one of " + ", ".join(src.types), found=repr(k))
    if node.format == "string" and (len(src.columns) != 1 or
                                    src.columns[0][1] not in ("string", T.UNKNOWN)):
        raise ctx.err(node, "format", "a sink with format 'string' writes one string column",
                      expected="exactly one string column",
                      found=", ".join(f"{n} {t}" for n, t in src.columns))
    if node.mode == "append" and src.mode != INSERT:
        raise ctx.err(node, "mode", "an append sink needs an insert-only input",
                      expected="[I]", found=f"[{src.mode}]")
    if node.mode == "complete" and not _aggregates_upstream(ctx, node):
        raise ctx.err(node, "mode", "Spark's complete mode needs a streaming aggregation",
                      expected="an aggregate upstream", found="none")
    if src.mode == RETRACT and not node.key_columns:
        raise ctx.err(node, "key_columns", "the input retracts rows, and a retraction is "
                      "written as a tombstone for its key", expected="key_columns",
                      found="none")
    if not src.stream:
        raise ctx.err(node, "inputs", "the sink is fed only by tables; a streaming query "
                      "needs at least one stream source", expected="a stream upstream",
                      found="tables only")
    return NodeInfo(src.columns, src.mode if node.mode != "complete" else UPSERT, src.stream,
                    False, src.watermarks, True, src.names)


def _aggregates_upstream(ctx: InferContext, node: Node) -> bool:
    stack = list(node.inputs)
    seen = set()
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        n = ctx.nodes[nid]
        if n.step == "aggregate":
            return True
        stack.extend(n.inputs)
    return False


@compare.register
def _compare(old: Sink, new: Sink, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    f = ctx.f
    if old.topic != new.topic:
        out.append(f("sink-topic-changed", f"the output topic changes from '{old.topic}' to "
                     f"'{new.topic}': that is a new output, not an upgrade of this one",
                     old, new, "topic"))
    if [k.lower() for k in old.key_columns] != [k.lower() for k in new.key_columns]:
        out.append(f("sink-key-changed", f"the output key changes from "
                     f"{list(old.key_columns)} to {list(new.key_columns)}: records of one "
                     "entity would land under two keys and partitions", old, new,
                     "key_columns"))
    if old.mode != new.mode:
        out.append(f("sink-mode-changed", f"the output mode changes from {old.mode} to "
                     f"{new.mode}", old, new, "mode"))
    if old.format != new.format:
        out.append(f("sink-format-changed", f"the output format changes from {old.format} "
                     f"to {new.format}", old, new, "format"))
    if old.delivery != new.delivery:
        out.append(f("sink-delivery-changed", f"delivery changes from {old.delivery} to "
                     f"{new.delivery}", old, new, "delivery"))
    return out
