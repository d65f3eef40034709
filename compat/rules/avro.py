"""What consumers of an Avro output notice: whether the new writer schema may replace the
old one under ``--schema-compat``, by Avro's own resolution rules (``compat.avro``).

The registry's levels and ``--schema-compat`` name the same directions: ``backward`` (the
registry's BACKWARD) is readers of the new schema reading records written with the old one,
so a field added without a default breaks it; ``forward`` is readers of the old schema
reading new records, so a field dropped without a default breaks it; ``full`` both.  For
Avro these replace the JSON rules of ``compat.rules.output``, which cannot know defaults.
"""

from __future__ import annotations

from typing import Any

from compat import avro as A
from compat.findings import Finding, register_codes
from compat.rules import RuleContext
from compat.steps.sink import Sink, avro_schema, avro_subject

REGISTRY_HINT = "Make the new schema compatible at the subject's level, or change the " \
    "subject's level with its owners (the registry refuses the schema when the sink " \
    "registers it, and the query fails)."

register_codes({
    "registry-accepts": ("none", "info", "schema_evolution",
                         "The sink registers the new schema when it starts writing."),
    "registry-refuses": ("unsupported", "error", "schema_evolution", REGISTRY_HINT),
    "registry-unreachable": ("unsupported", "error", "schema_evolution",
                             "Check --registry (or SCHEMA_REGISTRY_URL) and run the check "
                             "again where the registry answers; the check does not pass "
                             "without its answer."),
    "avro-schema-changed": ("in_place", "info", "schema_evolution",
                            "The new schema is registered under the subject before the "
                            "new plan writes; records keep the id of the schema they were "
                            "written with."),
    "avro-backward-incompatible": ("unsupported", "error", "schema_evolution",
                                   "Give the new field a default (a nullable column "
                                   "defaults to null), or relax --schema-compat to forward "
                                   "if no consumer reads old records with the new schema."),
    "avro-forward-incompatible": ("unsupported", "error", "schema_evolution",
                                  "Keep the field, or give it a default in the old "
                                  "consumers' schema, or relax --schema-compat to backward "
                                  "if every consumer upgrades first."),
})

#: advice by Avro rule, where the code's own (about fields) does not fit
_HINTS = {
    "NAME_MISMATCH": "Keep the record's name (avro.record), or list the old name in the new "
                     "schema's aliases (avro.schema).",
    "TYPE_MISMATCH": "Keep the field's type, or change it only as Avro promotes (int to long, "
                     "float or double; long to float or double; float to double; string and "
                     "bytes).",
    "MISSING_UNION_BRANCH": "Keep every branch of the union that records may carry.",
    "MISSING_ENUM_SYMBOLS": "Keep the enum's symbols, or give the reader's enum a default.",
    "FIXED_SIZE_MISMATCH": "Keep the fixed type's size.",
}

_WHO = {"backward": "readers of the new schema cannot read records written with the old",
        "forward": "readers of the old schema cannot read records written with the new"}


def check_avro_output(old: Sink, new: Sink, ctx: RuleContext) -> list[Finding]:
    mode = ctx.schema_compat
    if mode == "none" and "cascading" in ctx.require:
        mode = "forward"  # other queries read this output: it must stay readable
    was = avro_schema(old, ctx.oi(old))
    now = avro_schema(new, ctx.ni(new))
    if A.canonical(was) == A.canonical(now):
        return []
    directions = {"forward": ("forward",), "backward": ("backward",),
                  "full": ("backward", "forward")}.get(mode, ())
    f = ctx.f
    where = "inputs" if new.avro is None else "avro/schema" if new.avro.schema else "avro"
    out = []
    for direction, inc in A.check_level(was, now, directions):
        out.append(f(f"avro-{direction}-incompatible",
                     f"the Avro schema of the output breaks {direction.upper()} "
                     f"compatibility (--schema-compat {mode}): {inc.message}; {_WHO[direction]} "
                     f"(Avro rule {inc.rule})", old, new, where,
                     **({"hint": _HINTS[inc.rule]} if inc.rule in _HINTS else {})))
    if not out:
        subject = avro_subject(new, ctx.ni(new))
        level = mode if mode != "none" else "none (not checked)"
        out.append(f("avro-schema-changed", f"the output's Avro schema changes, compatible "
                     f"under --schema-compat {level}; the new schema goes to subject "
                     f"'{subject}'", old, new, where))
    return out


def ask_registry(ctx: RuleContext, registry: Any) -> list[Finding]:
    """Whether the subject of the new plan's Avro output accepts its schema at the
    subject's own level (the registry's compatibility endpoint): one finding."""
    from compat.registry import RegistryError

    new = ctx.new.nodes[ctx.new.sink_id]
    if not isinstance(new, Sink) or new.format != "avro":
        return []
    subject = avro_subject(new, ctx.ni(new))
    schema = A.canonical(avro_schema(new, ctx.ni(new)))
    old = ctx.old.nodes.get(ctx.old.sink_id)
    old = old if isinstance(old, Sink) else None
    where = "inputs" if new.avro is None else "avro/schema" if new.avro.schema else "avro"
    try:
        verdict = registry.check(subject, schema)
    except RegistryError as e:
        return [ctx.f("registry-unreachable", f"cannot ask the schema registry whether "
                      f"subject '{subject}' accepts the new schema: {e.render()}", old, new,
                      where if old is not None else None, where)]
    level = verdict.level or "its default level"
    if verdict.compatible is False:
        why = "; ".join(verdict.reasons) or "no reason given"
        return [ctx.f("registry-refuses", f"subject '{subject}' ({level}) refuses the new "
                      f"schema: {why}", old, new, where, where)]
    said = "has no version yet and accepts any schema" if verdict.compatible is None \
        else f"({level}) accepts the new schema"
    return [ctx.f("registry-accepts", f"subject '{subject}' {said}", old, new, where,
                  where)]
