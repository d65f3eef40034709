"""Sources: topic, format, role and schema must match (a partition change is scaling)."""

from __future__ import annotations

from compat import types as T
from compat.findings import Finding
from compat.model import Source
from compat.rules import RuleContext


def check_source(old: Source, new: Source, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    f = ctx.f
    if old.topic != new.topic:
        out.append(f("source-topic-changed", f"source '{new.id}' reads topic '{new.topic}' "
                     f"instead of '{old.topic}'; Spark refuses a checkpoint whose sources "
                     f"changed", old, new, "topic"))
    if old.format != new.format:
        out.append(f("source-format-changed", f"source '{new.id}' format changes from "
                     f"{old.format} to {new.format}", old, new, "format"))
    if old.role != new.role:
        out.append(f("source-role-changed", f"source '{new.id}' role changes from "
                     f"{old.role} to {new.role}", old, new, "role"))
    if [k.lower() for k in old.key_columns] != [k.lower() for k in new.key_columns]:
        table = new.role == "table" or old.role == "table"
        out.append(f("source-key-changed", f"source '{new.id}' key columns change from "
                     f"{list(old.key_columns)} to {list(new.key_columns)}", old, new,
                     "key_columns", effect=None if table else "in_place",
                     severity=None if table else "info"))
    ocols = {c.name.lower(): (i, T.parse_type(c.type)) for i, c in enumerate(old.schema)}
    ncols = {c.name.lower(): (i, T.parse_type(c.type)) for i, c in enumerate(new.schema)}
    stateful_downstream = ctx.notes.get("stateful_plan", False)
    for name, (i, t) in ncols.items():
        if name not in ocols:
            out.append(f("source-column-added", f"source '{new.id}' reads a new column "
                         f"'{name}' ({t})", old, new, "schema", f"schema/{i}"))
    for name, (i, t) in ocols.items():
        if name not in ncols:
            out.append(f("source-column-removed", f"source '{new.id}' no longer reads "
                         f"column '{name}'", old, new, f"schema/{i}", "schema"))
        elif ncols[name][1] != t:
            out.append(f("source-column-type-changed", f"source '{new.id}' reads column "
                         f"'{name}' as {ncols[name][1]} instead of {t}", old, new,
                         f"schema/{i}/type", f"schema/{ncols[name][0]}/type",
                         history=stateful_downstream))
    if old.event_time != new.event_time:
        def show(e):
            return f"{e.column} with watermark {e.watermark}" if e else "none"
        out.append(f("source-event-time-changed", f"source '{new.id}' event time changes "
                     f"from {show(old.event_time)} to {show(new.event_time)}", old, new,
                     "event_time", history=stateful_downstream))
    if old.partitions != new.partitions:
        code = "source-partitions-changed" if new.partitions > old.partitions \
            else "source-partitions-reduced"
        out.append(f(code, f"source '{new.id}' topic '{new.topic}' goes from "
                     f"{old.partitions} to {new.partitions} partitions", old, new,
                     "partitions"))
    if old.starting_offsets != new.starting_offsets:
        out.append(f("source-starting-offsets-changed", f"source '{new.id}' starting offsets "
                     f"change to {new.starting_offsets}", old, new, "starting_offsets"))
    return out
