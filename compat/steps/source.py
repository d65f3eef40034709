"""``source``: a Kafka topic read as a stream of records (or, ``role: table``, as the latest
value per key).  Enforcing: Spark's checkpoint records each source and its offsets, so the
topic, format, role and schema must match; a partition change is scaling.

Versions (old versions stay buildable and keep their meaning):

1. a table (``role: table``) is a snapshot: read in full at every micro-batch, the static
   side of a stream-static join;
2. adds ``read`` (``changelog`` default for a table, or ``snapshot`` as in version 1): a
   table read as a changelog is a stream of upserts of its key (a null value deletes the
   key), normalised in Spark state into retractions of the old row plus the new row
   (Flink's ChangelogNormalize), so that a table alone, a table aggregate and a
   table-table join run incrementally.  ``read`` is refused in version 1 and on a stream.
3. a table read as a changelog is normalised by PySpark's row-based ``transformWithState``
   (no pandas frame per key; ``bench/results/profile_tables.md``) instead of
   ``transformWithStateInPandas``: the same state, but Spark names the operator otherwise
   (``transformWithStateInPySparkExec``) and refuses a checkpoint whose operators differ, so
   a query moves from version 2 by a migration.  Refused where it would mean what 2 means
   (a stream, a table read as a snapshot).
4. a table read as a changelog keeps its normalisation's state per *bucket* of table keys
   (``state_buckets``, default :data:`DEFAULT_BUCKETS`; a key's bucket is
   ``pmod(xxhash64(key), state_buckets)``), one value of the bucket's current rows,
   instead of one value per key: PySpark 4.3's state API costs a synchronous round trip
   per key and call, with no call for many keys at once, so a batch pays per bucket it
   touches instead of per key (``bench/results/table_buckets.json``: the load 3.2-3.3x,
   updates 1.75x faster at 100,000 keys).  The output is version 3's.  The price: a batch
   rewrites every bucket it touches in full, so the count is the user's to fit the table
   (more buckets for a larger table or smaller batches).  The count is part of the state's
   layout: changing it, or moving between versions 3 and 4, is a migration.  Refused where
   it would mean what 2 means, as 3 is; ``state_buckets`` is refused below version 4 and
   where no changelog is normalised.

``format: avro`` (any version: it gives no existing plan another meaning) reads values in the
schema registry's wire format; ``avro`` (:class:`~compat.model.AvroSpec`) says how, and its
reader schema is the columns' (or the one it gives, whose fields must be the columns).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat import avro as A
from compat import types as T
from compat.demand import Demand, moves_filter, reads
from compat.findings import MIGRATE, RESTART, Finding, register_codes
from compat.infer import INSERT, RETRACT, UPSERT, InferContext, NodeInfo, infer_step
from compat.model import (
    ENFORCING,
    NAME,
    PARTITIONS,
    RECORD_FORMAT,
    AvroSpec,
    Column,
    EventTime,
    Node,
    Plan,
    enum,
    prop,
)
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import Code, Refusal, export_step, ident, py, var
from compat.rules import RuleContext, compare
from compat.signing import NodeSig, digest, duration, sign_step, token, type_key

#: a version 4 table's bucket count's bound: ``pmod``'s divisor is a Java int
MAX_BUCKETS = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class Source(Node):
    """Reads a Kafka topic: a stream of records, or (role ``table``) the latest value per
    key, read in full at every micro-batch."""

    topic: str = prop(schema=NAME)
    partitions: int = prop(schema=PARTITIONS)
    format: str = prop(schema=RECORD_FORMAT)
    role: str = prop(schema=enum("stream", "table"))
    schema: tuple[Column, ...] = prop(min_items=1)
    key_columns: tuple[str, ...] = prop((), items=NAME)
    event_time: EventTime | None = prop(None)
    starting_offsets: str = prop("earliest", schema=enum("earliest", "latest"))
    read: str | None = prop(None, schema=enum("changelog", "snapshot"),
                            doc="how a table is read (source version 2): changelog (default) "
                            "or snapshot (re-read in full at every micro-batch, as version 1)")
    avro: AvroSpec | None = prop(None, doc="how an Avro topic is read (format avro only)")
    state_buckets: int | None = prop(None, schema={"type": "integer", "minimum": 1,
                                                   "maximum": MAX_BUCKETS},
                                     doc="how many buckets of table keys the normalisation "
                                     "of a table read as a changelog keeps its state in "
                                     "(source version 4; default 64)")

    step: ClassVar[str] = "source"
    klass: ClassVar[str] = ENFORCING
    min_inputs: ClassVar[int] = 0
    max_inputs: ClassVar[int | None] = 0
    max_version: ClassVar[int] = 4


#: the first source version with ``read`` (a table read as a changelog by default)
CHANGELOG_VERSION = 2
#: the first source version whose changelog normalisation is the row-based operator
ROWS_VERSION = 3
#: the first source version whose changelog normalisation keeps its state per bucket of keys
BUCKETS_VERSION = 4
#: version 4's bucket count when the plan gives none: measured at 100,000 keys against
#: version 3, 64 buckets (~1,600 keys each) made the load 3.2-3.3x and updates in batches of
#: 25,000 offsets 1.75x faster, and still 1.15x in batches of 500 offsets, where a batch
#: rewrites whole buckets for few changed keys (bench/results/table_buckets.json); and 64
#: spreads over many more state partitions than a 2-core machine runs
DEFAULT_BUCKETS = 64
CHANGELOG = "changelog"
SNAPSHOT = "snapshot"


def table_read(node: Source) -> str | None:
    """How a table source is read, ``changelog`` or ``snapshot`` (None for a stream): as
    written, else by its version's default (version 1 knows only snapshots)."""
    if node.role != "table":
        return None
    if node.read is not None:
        return node.read
    return CHANGELOG if node.version >= CHANGELOG_VERSION else SNAPSHOT


def state_buckets(node: Source) -> int | None:
    """How many buckets of table keys the changelog normalisation of ``node`` keeps its
    state in (source version 4), or None: one state value per key (versions 2 and 3), or
    no normalisation at all (a stream, a snapshot)."""
    if node.version < BUCKETS_VERSION or table_read(node) != CHANGELOG:
        return None
    return node.state_buckets if node.state_buckets is not None else DEFAULT_BUCKETS


def layout(node: Source) -> str:
    """The normalisation's state layout in words, for findings."""
    b = state_buckets(node)
    return "one value per table key" if b is None else \
        f"one value per bucket of table keys ({b} buckets)"


register_codes({
    "source-read-changed": ("migrate", "error", "source_modifying", MIGRATE),
    "source-topic-changed": ("migrate", "error", "source_modifying", MIGRATE),
    "source-format-changed": ("migrate", "error", "source_modifying", MIGRATE),
    "source-role-changed": ("migrate", "error", "source_modifying", MIGRATE),
    "source-key-changed": ("migrate", "error", "source_modifying", MIGRATE),
    "source-column-added": ("in_place", "info", "schema_evolution", RESTART),
    "source-column-removed": ("in_place", "warning", "schema_evolution", RESTART),
    "source-column-type-changed": ("in_place", "warning", "schema_evolution", RESTART),
    "source-event-time-changed": ("in_place", "warning", "data_selection",
                                  "Late rows are judged by the new watermark from the restart "
                                  "on; windows already closed stay closed."),
    "source-partitions-changed": ("in_place", "warning", "scaling",
                                  "Spark picks up added partitions on restart; make sure "
                                  "they exist before the upgrade."),
    "source-partitions-reduced": ("migrate", "error", "scaling", MIGRATE),
    "source-avro-schema-changed": ("in_place", "info", "schema_evolution",
                                   "Records are read with the new reader schema from the "
                                   "restart on (its defaults fill the fields a writer "
                                   "lacks); rows read before keep the old one's values."),
    "source-state-layout-changed": ("migrate", "error", "scaling",
                                    "A restart on the checkpoint would start the "
                                    "normalisation without its table (the state is named "
                                    "after its layout), or, under one name, read one "
                                    "layout as the other: deploy it with a live migration "
                                    "(theseus migrate start), whose shadow rebuilds the "
                                    "state from the topic."),
    "source-starting-offsets-changed": ("none", "info", "transparent",
                                        "Starting offsets apply only to a fresh checkpoint."),
})


@infer_step.register
def _infer(node: Source, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    ctx.topic(node, node.topic)
    cols = []
    for i, c in enumerate(node.schema):
        try:
            cols.append((c.name.lower(), T.parse_type(c.type)))
        except T.TypeSyntaxError as e:
            raise ctx.err(node, f"schema/{i}/type", f"invalid type: {e}",
                          expected="a Spark SQL type such as bigint or array<string>",
                          found=repr(c.type)) from None
    ctx.unique(node, [c.name for c in node.schema], "schema")
    types = dict(cols)
    if node.format == "string" and (len(cols) != 1 or cols[0][1] != "string"):
        raise ctx.err(node, "schema", "a source with format 'string' reads each record "
                      "as one string column", expected="one column of type string",
                      found=", ".join(f"{n} {t}" for n, t in cols))
    for i, k in enumerate(node.key_columns):
        if k.lower() not in types:
            raise ctx.err(node, f"key_columns/{i}", f"key column '{k}' is not in the schema",
                          expected="one of " + ", ".join(types), found=repr(k))
    ctx.distinct_keys(node, node.key_columns)
    _check_avro(node, ctx)
    if node.role == "table" and not node.key_columns:
        raise ctx.err(node, "key_columns", "a table source keeps the latest value per key, "
                      "so it needs key_columns", expected="a non-empty key_columns list",
                      found="none")
    if node.read is not None and node.version < CHANGELOG_VERSION:
        raise ctx.err(node, "read", f"'read' is a field of source version {CHANGELOG_VERSION}",
                      expected=f"version {CHANGELOG_VERSION}, or no 'read' (version 1 reads "
                      "a table as a snapshot)", found=f"version {node.version}")
    if node.read is not None and node.role != "table":
        raise ctx.err(node, "read", "'read' says how a table is read; a stream is read "
                      "record by record", expected="role 'table', or no 'read'",
                      found=f"role '{node.role}'")
    changelog = table_read(node) == CHANGELOG
    what = "stream" if node.role == "stream" else "table read as a snapshot"
    if node.state_buckets is not None and node.version < BUCKETS_VERSION:
        raise ctx.err(node, "state_buckets", "'state_buckets' is a field of source version "
                      f"{BUCKETS_VERSION} (a changelog's state kept per bucket of keys)",
                      expected=f"version {BUCKETS_VERSION}, or no 'state_buckets' (version "
                      f"{node.version} keeps one state value per key)",
                      found=f"version {node.version}")
    if node.state_buckets is not None and not changelog:
        raise ctx.err(node, "state_buckets", "'state_buckets' says how a table read as a "
                      "changelog keeps its state; this source keeps none",
                      expected="a table read as a changelog, or no 'state_buckets'",
                      found=f"a {what}")
    if node.version >= ROWS_VERSION and not changelog:
        raise ctx.err(node, "version", f"source version {node.version} differs from "
                      f"{CHANGELOG_VERSION} only for a table read as a changelog (its "
                      "normalisation's operator)", expected=f"version {CHANGELOG_VERSION} "
                      "for a stream or a table read as a snapshot",
                      found=f"version {node.version} on a {what}")
    marks: frozenset[str] = frozenset()
    if changelog and node.event_time:
        raise ctx.err(node, "event_time", "a table read as a changelog has no event time "
                      "(its rows are updated in place, not appended)",
                      expected="no event_time, or read: snapshot", found="an event_time")
    if node.event_time:
        col = node.event_time.column.lower()
        if col not in types:
            raise ctx.err(node, "event_time/column", f"event-time column '{col}' is not in "
                          "the schema", expected="one of " + ", ".join(types), found=repr(col))
        if types[col] not in ("timestamp", "timestamp_ntz"):
            raise ctx.err(node, "event_time/column", "the event-time column must be a "
                          "timestamp", expected="timestamp", found=types[col])
        ctx.duration(node, "event_time/watermark", node.event_time.watermark)
        marks = frozenset({col})
    names = tuple(c.name for c in node.schema)
    if changelog:
        # Normalised in state: every change is the old row's retraction plus the new row.
        # A table's rows are unique by its key (the normalisation keeps one row per key).
        return NodeInfo(tuple(cols), RETRACT, True, True, marks, True, names, changelog=True,
                        keys=(tuple(k.lower() for k in node.key_columns),))
    mode = UPSERT if node.role == "table" else INSERT
    return NodeInfo(tuple(cols), mode, node.role == "stream", False, marks, True, names)


def avro_spec(node: Source) -> AvroSpec:
    """The node's Avro settings, defaults filled in (format avro)."""
    return node.avro or AvroSpec()


def avro_record(node: Source) -> str:
    return avro_spec(node).record or A.record_name(node.topic)


def avro_schema(node: Source) -> A.Schema:
    """The reader schema of an Avro source (a valid plan's: errors were raised by
    inference)."""
    spec = avro_spec(node)
    return A.columns_schema(avro_record(node), [(c.name, c.type, c.nullable)
                                                for c in node.schema], spec.schema)


def _check_avro(node: Source, ctx: InferContext) -> None:
    if node.format != "avro":
        if node.avro is not None:
            raise ctx.err(node, "avro", "'avro' says how an Avro topic is read",
                          expected="format 'avro', or no 'avro'",
                          found=f"format '{node.format}'")
        return
    spec = avro_spec(node)
    if spec.key and not node.key_columns:
        raise ctx.err(node, "avro/key", "an Avro key is a record of the key columns",
                      expected="key_columns", found="none")
    try:
        avro_schema(node)
    except A.ColumnMismatch as e:
        where = f"schema/{e.index}" + ("" if spec.schema else "/type")
        raise ctx.err(node, where, e.message, expected=e.expected, found=e.found) from None
    except A.AvroSchemaError as e:
        raise ctx.err(node, "avro/schema", e.message, expected=e.expected,
                      found=e.found) from None


@reads.register
def _reads(node: Source, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    return []  # no inputs: what it reads is its schema


@moves_filter.register
def _moves(node: Source, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    return None  # the bottom of the query


@compare.register
def _compare(old: Source, new: Source, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    f = ctx.f
    if table_read(old) != table_read(new) and old.role == new.role == "table":
        out.append(f("source-read-changed", f"table '{new.id}' is read as a "
                     f"{table_read(new)} instead of a {table_read(old)}: a changelog keeps "
                     "the table in state and its offsets in the checkpoint, a snapshot "
                     "neither", old, new, "read" if new.read is not None else "version"))
    if old.topic != new.topic:
        # A snapshot is read afresh at every micro-batch (the walk judges its changes as
        # passive ones); a stream's offsets, and a changelog's, are in the checkpoint.
        snap = table_read(old) == table_read(new) == SNAPSHOT
        why = "" if snap else \
            "; Spark refuses a checkpoint whose sources changed"
        out.append(f("source-topic-changed", f"source '{new.id}' reads topic '{new.topic}' "
                     f"instead of '{old.topic}'{why}", old, new, "topic"))
    if old.format != new.format:
        out.append(f("source-format-changed", f"source '{new.id}' format changes from "
                     f"{old.format} to {new.format}", old, new, "format"))
    elif new.format == "avro" and avro_spec(old).key != avro_spec(new).key:
        out.append(f("source-format-changed", f"source '{new.id}' reads its record keys as "
                     f"{'Avro' if avro_spec(new).key else 'JSON'} instead of "
                     f"{'Avro' if avro_spec(old).key else 'JSON'}", old, new, "avro/key"))
    elif new.format == "avro" and avro_spec(new).schema is not None and \
            A.canonical(avro_schema(old)) != A.canonical(avro_schema(new)):
        # the columns' changes have findings of their own; this is what else the given
        # schema changes (defaults, names, fields no column reads)
        out.append(f("source-avro-schema-changed", f"source '{new.id}' reads its records "
                     "with another Avro reader schema", old, new, "avro/schema",
                     history=ctx.notes.get("stateful_plan", False)))
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
    if table_read(old) == table_read(new) == CHANGELOG and \
            state_buckets(old) != state_buckets(new):
        # versions 3 and 4 key their state by text (a table key's JSON, a bucket's number)
        # and store text, so Spark's schema check would not stop a restart reading one
        # layout as the other; the state's name (compat.tws_state) tells them apart
        def where(n: Source) -> str:
            # the count as written, else the version that sets the layout (or the default)
            return "state_buckets" if old.version == new.version and \
                n.state_buckets is not None else "version"
        out.append(f("source-state-layout-changed", f"table '{new.id}' keeps its "
                     f"normalisation's state as {layout(new)} instead of {layout(old)}",
                     old, new, where(old), where(new)))
    if old.starting_offsets != new.starting_offsets:
        out.append(f("source-starting-offsets-changed", f"source '{new.id}' starting offsets "
                     f"change to {new.starting_offsets}", old, new, "starting_offsets"))
    return out


@sign_step.register
def _sign(node: Source, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    # Names count: a source's column names are the JSON keys it reads.
    schema = tuple(sorted((c.name.lower(), type_key(c.type), c.nullable)
                          for c in node.schema))
    et = node.event_time
    sig = digest("source", node.version, node.topic, node.format, node.role, schema,
                 tuple(k.lower() for k in node.key_columns),
                 (et.column.lower(), duration(et.watermark)) if et else None,
                 node.starting_offsets,
                 # how a version 2 table is read (version 1 hashes as it always did)
                 *((table_read(node),) if node.version >= CHANGELOG_VERSION else ()),
                 # the reader schema and key encoding of an Avro topic (others hash as before)
                 *((A.canonical(avro_schema(node)), avro_spec(node).key)
                   if node.format == "avro" else ()),
                 # a version 4 table's state layout (its bucket count)
                 *((state_buckets(node),) if node.version >= BUCKETS_VERSION else ()))
    return NodeSig(sig, {c.name.lower(): token(sig, c.name.lower()) for c in node.schema})


@push_through.register
def _push_through(node: Source, c: Conjunct, g: PushGraph) -> Targets | None:
    return None  # nothing lies below a source


@export_step.register
def _export(node: Source, plan: Plan) -> Code | Refusal:
    if node.role == "table":
        return Refusal(f"source '{node.id}' is a table (latest value per key): a Spark job "
                       "reads a Kafka topic as a stream or as every record")
    if node.key_columns:
        return Refusal(f"source '{node.id}' reads key columns from the record key: a job "
                       "reads the record value only")
    out = [f"{var(node.id)} = (spark.readStream.format(\"kafka\")",
           '      .option("kafka.bootstrap.servers", BOOTSTRAP)',
           f'      .option("subscribe", {py(node.topic)})',
           f'      .option("startingOffsets", {py(node.starting_offsets)})',
           "      .load()"]
    if node.format == "avro":
        if avro_spec(node).key:
            return Refusal(f"source '{node.id}' reads Avro record keys: a job reads the "
                           "record value only")
        # What users write today: the 5-byte header cut off, every record read with this
        # one schema (Spark's from_avro cannot look writer schemas up by id).
        out += [f'      .select(from_avro(F.expr("substring(value, 6)"), '
                f'{py(A.canonical(avro_schema(node)))}).alias("v"))',
                '      .select("v.*")']
    elif node.format == "string":
        out.append(f'      .select(F.col("value").cast("string")'
                   f'.alias({py(node.schema[0].name)}))')
    else:
        ddl = ", ".join(f"{ident(c.name)} {c.type}" for c in node.schema)
        out += [f'      .select(F.from_json(F.col("value").cast("string"), '
                f'{py(ddl)}).alias("v"))',
                '      .select("v.*")']
    if node.event_time:
        out.append(f"      .withWatermark({py(node.event_time.column)}, "
                   f"{py(node.event_time.watermark)})")
    out[-1] += ")"
    return Code(out)
