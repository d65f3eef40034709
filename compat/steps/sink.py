"""``sink``: writes the query's output to a Kafka topic.  Enforcing: the topic, key
columns (by name and order: the key's bytes decide partitioning and compaction), mode and
format must match; delivery may change.  What consumers notice of the output (its schema
and changelog mode) is the cross-step family ``compat.rules.output``.

Versions (old versions stay buildable and keep their bytes):

1. the record key is the JSON object of ``key_columns``, in order;
2. as 1, but a windowed output is keyed by its window too, as ksqlDB's windowed keys are:
   when the input carries the ``window`` column a windowed aggregate adds
   (``struct<start:timestamp,end:timestamp>``) and ``key_columns`` does not list it, the
   window is the key's last member, ``{"page": "home", "window": {"start":
   "2026-01-01T10:00:00.000000Z", "end": "2026-01-01T10:01:00.000000Z"}}`` (timestamps as
   in the value).  The window under another name (``window AS w``, ``session_window``)
   is keyed the same way; an output that carries only bounds of the window, under any
   name (``window.start AS day``), is keyed by them, last, in output order (which columns
   hold a window: ``NodeInfo.windows``).  Keyed by its group columns alone, a compacted
   topic would keep only the last window of each group.  Without a window, or with one
   of its columns in ``key_columns``, version 2 writes what 1 does.  ``plan compile`` and
   ``plan import`` write version 2 for a windowed output.

``format: avro`` (any version: it gives no existing plan another meaning) writes values in the
schema registry's wire format under the subject ``avro`` names
(:class:`~compat.model.AvroSpec`); the writer schema is the output columns' (every one
nullable, default null) or the one ``avro.schema`` gives, whose fields must be the columns.
Whether the new schema may replace the old is ``compat.rules.avro``'s (Avro's resolution
rules under ``--schema-compat``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat import avro as A
from compat import types as T
from compat.demand import Demand, everything, moves_filter, reads
from compat.findings import NEW_OUTPUT, RESTART, Finding, register_codes
from compat.infer import (
    INSERT,
    RETRACT,
    UPSERT,
    WINDOW_COLUMN,
    WINDOW_TYPE,
    InferContext,
    NodeInfo,
    covering_key,
    infer_step,
)
from compat.model import ENFORCING, NAME, RECORD_FORMAT, AvroSpec, Node, Plan, enum, prop
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import Code, Refusal, export_step, py, var
from compat.rules import RuleContext, compare
from compat.signing import NodeSig, digest, sign_step


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
    avro: AvroSpec | None = prop(None, doc="how an Avro topic is written (format avro only)")
    step: ClassVar[str] = "sink"
    klass: ClassVar[str] = ENFORCING
    max_version: ClassVar[int] = 2
    infers_from_inputs: ClassVar[bool] = False  # complete mode looks for an aggregate upstream


#: the first sink version whose key holds the window of a windowed output
WINDOWED_KEY_VERSION = 2


def window_column(info: NodeInfo) -> str | None:
    """The ``window`` column of a windowed aggregate's output, as written, if ``info``
    (a sink's or its input's) carries one."""
    for (name, typ), written in zip(info.columns, info.names or (c[0] for c in info.columns)):
        if name == WINDOW_COLUMN and typ == WINDOW_TYPE:
            return written
    return None


def window_bounds(info: NodeInfo) -> tuple[str, ...]:
    """The columns of a windowed output that say which window a row is of, as written, in
    output order: the window itself under whatever name (``window AS w``,
    ``session_window``), else the bounds it carries (``window.start AS day``,
    ``window.end``).  Empty for an output that carries neither."""
    names = info.names or tuple(c[0] for c in info.columns)
    found = [(written, typ) for (name, typ), written in zip(info.columns, names)
             if name in info.windows]
    structs = tuple(w for w, typ in found if typ == WINDOW_TYPE)
    return structs or tuple(w for w, _ in found)


def written_key(node: Sink, info: NodeInfo) -> tuple[str, ...]:
    """The columns of the record key, in order, as the gated sink writes them (``info``
    is the sink's or its input's): ``key_columns``, then, from version 2, the window of a
    windowed output (:func:`window_bounds`) unless ``key_columns`` already holds it.  An
    empty tuple is a null key."""
    keys = tuple(node.key_columns)
    if node.version < WINDOWED_KEY_VERSION:
        return keys
    listed = {k.lower() for k in keys}
    window = window_column(info)
    if window is not None:  # the ``window`` column itself, keyed as it always was
        return keys if WINDOW_COLUMN in listed else keys + (window,)
    bounds = window_bounds(info)
    if listed & {b.lower() for b in bounds}:
        return keys  # the key already says which window a row is of
    return keys + bounds


def avro_spec(node: Sink) -> AvroSpec:
    """The node's Avro settings, defaults filled in (format avro)."""
    return node.avro or AvroSpec()


def avro_record(node: Sink) -> str:
    return avro_spec(node).record or A.record_name(node.topic)


def avro_subject(node: Sink, info: NodeInfo, topic: str | None = None) -> str:
    """The registry subject the sink's values are written under (``topic``: the topic
    really written, where a run writes elsewhere than the plan's)."""
    spec = avro_spec(node)
    return A.subject_name(spec.subject, topic or node.topic, avro_schema(node, info)["name"])


def avro_schema(node: Sink, info: NodeInfo) -> A.Schema:
    """The writer schema of an Avro sink over its input's ``info`` (a valid plan's)."""
    names = info.names or tuple(c[0] for c in info.columns)
    return A.columns_schema(avro_record(node), [(n, t, True) for n, (_, t) in
                                                zip(names, info.columns)],
                            avro_spec(node).schema, writing=True)


def avro_key_schema(node: Sink, info: NodeInfo) -> A.Schema:
    """The writer schema of an Avro sink's record keys (``avro.key``): a record of the
    written key's columns (:func:`written_key`), named after the value's record with
    ``Key`` (``shop.Order``: ``shop.OrderKey``), each column a union with null as in a
    derived value schema."""
    names = info.names or tuple(c[0] for c in info.columns)
    types = {n.lower(): t for n, (_, t) in zip(names, info.columns)}
    return A.columns_schema(avro_schema(node, info)["name"] + "Key",
                            [(k, types[k.lower()], True) for k in written_key(node, info)],
                            None, writing=True)


def avro_key_subject(node: Sink, info: NodeInfo, topic: str | None = None) -> str:
    """The registry subject of the sink's Avro record keys."""
    return A.subject_name(avro_spec(node).subject, topic or node.topic,
                          avro_key_schema(node, info)["name"], key=True)


def _check_avro(node: Sink, ctx: InferContext, src: NodeInfo) -> None:
    if node.format != "avro":
        if node.avro is not None:
            raise ctx.err(node, "avro", "'avro' says how an Avro topic is written",
                          expected="format 'avro', or no 'avro'",
                          found=f"format '{node.format}'")
        return
    spec = avro_spec(node)
    if spec.key and not written_key(node, src):
        raise ctx.err(node, "avro/key", "an Avro key is a record of the key columns",
                      expected="key_columns", found="none")
    try:
        avro_schema(node, src)
    except A.ColumnMismatch as e:
        names = src.names or tuple(c[0] for c in src.columns)
        raise ctx.err(node, "avro/schema" if spec.schema else "inputs",
                      f"output column '{names[e.index]}': {e.message}",
                      expected=e.expected, found=e.found) from None
    except A.AvroSchemaError as e:
        raise ctx.err(node, "avro/schema", e.message, expected=e.expected,
                      found=e.found) from None


register_codes({
    "sink-topic-changed": ("unsupported", "error", "topology", NEW_OUTPUT),
    "sink-key-changed": ("unsupported", "error", "topology", NEW_OUTPUT),
    "sink-mode-changed": ("unsupported", "error", "topology", NEW_OUTPUT),
    "sink-format-changed": ("unsupported", "error", "schema_evolution", NEW_OUTPUT),
    "sink-delivery-changed": ("in_place", "warning", "transparent", RESTART),
    "sink-subject-changed": ("in_place", "warning", "schema_evolution",
                             "The new subject starts its own history: the registry checks "
                             "the next schemas against it alone. Register the old schema "
                             "under it first if the history must carry over."),
})


@infer_step.register
def _infer(node: Sink, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    ctx.topic(node, node.topic)
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
    ctx.distinct_keys(node, node.key_columns)
    _check_avro(node, ctx, src)
    if src.changelog and node.key_columns:
        _unique_over_changelog(node, ctx, src)
    if src.mode == RETRACT and not written_key(node, src):
        unique = [k for k in src.keys if k]
        raise ctx.err(node, "key_columns", "the input retracts rows, and a retraction is "
                      "written as a tombstone for its key", expected="key_columns" + (
                          " (" + " or ".join(_show(src, k) for k in unique) + ")"
                          if src.changelog and unique else ""), found="none")
    if src.changelog and node.mode != "update":
        raise ctx.err(node, "mode", "a table read as a changelog is written as upserts and "
                      "tombstones of its key", expected="mode 'update'",
                      found=repr(node.mode))
    if not src.stream:
        raise ctx.err(node, "inputs", "the sink is fed only by tables read as snapshots; a "
                      "streaming query needs a stream source or a table read as a changelog",
                      expected="a stream upstream, or source version 2 with read: changelog",
                      found="snapshot-read tables only")
    return NodeInfo(src.columns, src.mode if node.mode != "complete" else UPSERT, src.stream,
                    False, src.watermarks, True, src.names, changelog=src.changelog,
                    keys=src.keys, windows=src.windows)


def _show(info: NodeInfo, key: tuple[str, ...]) -> str:
    written = dict(zip((c[0] for c in info.columns), info.names or (c[0] for c in info.columns)))
    return "[" + ", ".join(written.get(k, k) for k in key) + "]"


def _unique_over_changelog(node: Sink, ctx: InferContext, src: NodeInfo) -> None:
    """A sink over a changelog writes each key's last row, and a retraction as a tombstone
    for its key: unless the key tells the changelog's rows apart, one key holds several
    rows, and retracting one of them deletes the key while the others are still there
    (and which row the key shows is arbitrary)."""
    if covering_key(src, node.key_columns) is not None:
        return
    found = f"key_columns {list(node.key_columns)}"
    if not src.keys:
        raise ctx.err(node, "key_columns", "no columns are unique per row of the changelog "
                      "this sink writes (the table's key is not output as it is, or an "
                      "explode or a union gives rows that no column tells apart), so its "
                      "rows cannot be written as upserts and tombstones of a key: a "
                      "retraction would delete rows that are still there",
                      expected="an output with a unique key: the table's key columns "
                      "output as they are, or an aggregate (GROUP BY the output key)",
                      found=found)
    options = " or ".join(_show(src, k) for k in src.keys)
    raise ctx.err(node, "key_columns", "the sink's key does not tell the rows of the "
                  "changelog it writes apart: one key would hold several rows, and the "
                  "retraction of one of them would tombstone the key while the others are "
                  f"still in the table; the rows are unique by {options}",
                  expected=f"key_columns including {options}", found=found,
                  hint=f"Key the output by {_show(src, src.keys[0])}, or aggregate by the "
                  "key you want (GROUP BY) so that it is unique.")


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


@reads.register
def _reads(node: Sink, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    return everything(node, ins)  # the topic's readers may need any column it writes


@moves_filter.register
def _moves(node: Sink, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    return None  # nothing is above a sink


@compare.register
def _compare(old: Sink, new: Sink, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    f = ctx.f
    # The key as written: a version 2 sink keys a windowed output by its window too.
    old_key, new_key = written_key(old, ctx.oi(old)), written_key(new, ctx.ni(new))
    rekeyed = [k.lower() for k in old_key] != [k.lower() for k in new_key]
    if old.topic != new.topic:
        # The new topic holds only the new keys: a new key changes no existing output.
        keyed = f", keyed by {list(new_key)} instead of {list(old_key)}" if rekeyed else ""
        unprotected = ctx.schema_compat == "none" and "cascading" not in ctx.require \
            and ctx.notes.get("output_rules", True)
        if unprotected:
            # No consumer to protect: Spark restarts the query on its checkpoint writing
            # to the new topic (a Kafka sink's topic may change between restarts).
            out.append(f("sink-topic-changed", f"the output topic changes from "
                         f"'{old.topic}' to '{new.topic}': from the restart on, the output "
                         f"is written to '{new.topic}'{keyed}", old, new, "topic",
                         effect="in_place", severity="warning",
                         hint=f"Restart the query on its checkpoint: '{new.topic}' gets the "
                         f"output from then on and '{old.topic}' keeps what was written "
                         "before (nothing is copied); --schema-compat none says no consumer "
                         f"of '{old.topic}' needs protecting."))
        else:
            out.append(f("sink-topic-changed", f"the output topic changes from "
                         f"'{old.topic}' to '{new.topic}'{keyed}: that is a new output, not "
                         "an upgrade of this one", old, new, "topic",
                         hint=NEW_OUTPUT + (" If no consumer needs protecting, "
                                            "--schema-compat none restarts the query on "
                                            "the new topic." if "cascading" not in
                                            ctx.require and ctx.notes.get("output_rules",
                                                                          True)
                                            else "")))
    elif rekeyed:
        out.append(_key_changed(old, new, old_key, new_key, ctx))
    if old.mode != new.mode:
        out.append(f("sink-mode-changed", f"the output mode changes from {old.mode} to "
                     f"{new.mode}", old, new, "mode"))
    if old.format != new.format:
        out.append(f("sink-format-changed", f"the output format changes from {old.format} "
                     f"to {new.format}", old, new, "format"))
    if old.format == new.format == "avro":
        out += _compare_avro(old, new, ctx)
    if old.delivery != new.delivery:
        out.append(f("sink-delivery-changed", f"delivery changes from {old.delivery} to "
                     f"{new.delivery}", old, new, "delivery"))
    return out


def _key_changed(old: Sink, new: Sink, old_key: tuple[str, ...], new_key: tuple[str, ...],
                 ctx: RuleContext) -> Finding:
    """The output's key as written changes.  Spark would restart on its checkpoint (the
    key is computed per row, in no state), but consumers read the topic as a table keyed
    by it: records of one entity land under two keys and partitions, and compaction keeps
    both."""
    f = ctx.f
    if [k.lower() for k in old.key_columns] != [k.lower() for k in new.key_columns]:
        return f("sink-key-changed", f"the output key changes from {list(old_key)} to "
                 f"{list(new_key)}: records of one entity would land under two keys and "
                 "partitions", old, new, "key_columns")
    # The window joins or leaves the key (ksqlDB's windowed keys): the table the
    # compacted topic holds changes shape, one row per group becomes one per group and
    # window (or back), and the rows written before stay beside the new ones.
    before = "the records written before stay under their old keys (on other partitions) " \
        "beside the new ones"
    if len(old_key) == len(new_key):  # the window kept, said by other columns
        shape = f"each window's row moves to a new key, and {before}"
    else:
        coarse, fine = sorted((old_key, new_key), key=len)
        was = f"keyed by {list(coarse)} it keeps one row per {' and '.join(coarse)}, its " \
            "last window's" if coarse else "with a null key it is no table (compaction " \
            "refuses records without a key)"
        shape = f"the compacted topic changes shape: {was}; keyed by {list(fine)}, one row " \
            f"per {' and '.join(fine)} — and {before}"
    if old.version != new.version:
        why = f"sink version {old.version} -> {new.version}: from version " \
            f"{WINDOWED_KEY_VERSION} a windowed output is keyed by its window too"
        where = "version"
    else:
        why = "the window enters or leaves the output of a sink that keys a windowed " \
            "output by its window"
        where = "inputs"
    relax = " (with --schema-compat none, when no consumer needs protecting, the query " \
        "restarts on its checkpoint writing to the new topic)" if "cascading" not in \
        ctx.require and ctx.notes.get("output_rules", True) else ""
    keep = f"keep sink version {old.version} on this topic" if where == "version" else \
        "keep the window's columns in the output"
    return f("sink-key-changed", f"the output key changes from {list(old_key)} to "
             f"{list(new_key)} ({why}): {shape}", old, new, where,
             hint=f"Write the new keys to a new output topic and move consumers over{relax}"
             f"; or {keep}.")


def _compare_avro(old: Sink, new: Sink, ctx: RuleContext) -> list[Finding]:
    f = ctx.f
    out = []
    if avro_spec(old).key != avro_spec(new).key:
        enc = {True: "an Avro record", False: "a JSON object"}
        out.append(f("sink-key-changed", f"the output key is written as "
                     f"{enc[avro_spec(new).key]} instead of {enc[avro_spec(old).key]}: "
                     "records of one entity would land under two keys and partitions",
                     old, new, "avro/key"))
    was, now = avro_subject(old, ctx.oi(old)), avro_subject(new, ctx.ni(new))
    if was != now:
        out.append(f("sink-subject-changed", f"the output's values are registered under "
                     f"subject '{now}' instead of '{was}'", old, new, "avro"))
    return out


@sign_step.register
def _sign(node: Sink, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    # Names count: a sink's column names are the JSON keys it writes; its topic does not
    # (two whole queries equal but for it are complete sharing).
    (src,) = ins
    out = tuple(sorted((n.lower(), src.columns.get(n.lower(), "?")) for n in names))
    keys = tuple(k.lower() for k in node.key_columns)
    sig = digest("sink", node.version, src.sig, out, keys, node.format, node.mode,
                 node.delivery,
                 # what an Avro sink writes besides its columns (others hash as before)
                 *((avro_spec(node),) if node.format == "avro" else ()))
    return NodeSig(sig, src.columns)


@push_through.register
def _push_through(node: Sink, c: Conjunct, g: PushGraph) -> Targets | None:
    return None  # a sink is the top of its plan: no filter reads it


@export_step.register
def _export(node: Sink, plan: Plan) -> Code | Refusal:
    info = plan.info[node.inputs[0]]
    names = info.names
    avro = None
    if node.format == "avro":
        spec = avro_spec(node)
        if spec.key:
            return Refusal(f"sink '{node.id}' writes Avro record keys: a job writes its "
                           "key as the JSON object of the key columns")
        if spec.subject != "topic_name":
            return Refusal(f"sink '{node.id}' names its subject by {spec.subject}: a job "
                           "says its subject only to the registry, and imports back as "
                           "topic_name (<topic>-value)")
        avro = "VALUE_SCHEMA"  # the module's constant (compat.export writes it)
    key = list(written_key(node, info))
    windowed = window_column(info) is not None or bool(window_bounds(info))
    if avro is not None:
        # What users write: the registry's header (the id their schema got, asked of the
        # registry when the job starts) in front of to_avro's body.
        value = (f"F.concat(F.lit(value_header({py(node.topic + '-value')}, {avro})), "
                 f"to_avro(F.struct({', '.join(py(n) for n in names)}), {avro}))"
                 '.alias("value")')
    elif node.format == "string":
        value = f"F.col({py(names[0])}).cast(\"string\").alias(\"value\")"
    else:
        value = f"F.to_json(F.struct({', '.join(py(n) for n in names)}))" \
                '.alias("value")'
    cols = ([f"F.to_json(F.struct({', '.join(py(k) for k in key)})).alias(\"key\")"]
            if key else []) + [value]
    lines = [f"return ({var(node.inputs[0])}.select({', '.join(cols)})",
             f'        .writeStream.format("kafka").queryName({py(plan.query)})',
             '        .option("kafka.bootstrap.servers", BOOTSTRAP)',
             f'        .option("topic", {py(node.topic)})',
             '        .option("checkpointLocation", CHECKPOINT)',
             f"        .outputMode({py(node.mode)}))"]
    # A window in the record key reads back as version 2 (a window-keyed sink).
    written = WINDOWED_KEY_VERSION if node.version == WINDOWED_KEY_VERSION and windowed else 1
    return Code(lines, version=written)
