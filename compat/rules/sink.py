"""The sink: topic, key columns (by name and order: the key's bytes decide partitioning
and compaction), mode and format must match; delivery may change."""

from __future__ import annotations

from compat.findings import Finding
from compat.model import Sink
from compat.rules import RuleContext


def check_sink(old: Sink, new: Sink, ctx: RuleContext) -> list[Finding]:
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
