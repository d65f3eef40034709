"""The statements of a script: settings, table declarations, views and the one query.

A script is Spark SQL DDL and one query::

    SET spark.sql.shuffle.partitions = 8;          -- config.state_partitions
    SET theseus.query = 'ship_load';               -- the plan's query name
    CREATE TABLE packages (ship_id STRING, weight DOUBLE, ts TIMESTAMP)
      USING kafka OPTIONS (partitions 3, event_time 'ts', watermark '30 seconds');
    CREATE TABLE alerts USING kafka OPTIONS (topic 'ship_alerts') AS SELECT ...;

Declared tables are sources when the query reads them and the sink when it writes them; their
OPTIONS are checked for that use (``source_step``, ``sink_options``).  Tables the query does not
read are left out of the plan.

A ``role 'table'`` table is read as a changelog (source version 2) when the query reads no
stream (``CREATE TABLE b AS SELECT ... FROM a`` over tables, as in ksqlDB), and as a snapshot
(version 1, the static side of a stream-table join) when it also reads a stream; the
``read`` option ('changelog' | 'snapshot') says it explicitly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from compat import types as T
from compat.errors import SqlError
from compat.infer import duration_seconds
from compat.model import AvroSpec, Column, EventTime
from compat.sql.text import Span, SqlText, did_you_mean, span_of
from compat.steps import Source
from compat.steps.source import CHANGELOG, CHANGELOG_VERSION, SNAPSHOT

#: how a ``format 'avro'`` table's records are named and shaped (``AvroSpec``'s fields)
AVRO_OPTIONS = ("avro.subject", "avro.record", "avro.schema")
SOURCE_OPTIONS = ("topic", "partitions", "format", "role", "key", "event_time", "watermark",
                  "starting_offsets", "read", *AVRO_OPTIONS)
SINK_OPTIONS = ("topic", "format", "key", "mode", "delivery", *AVRO_OPTIONS)
SETTINGS = ("spark.sql.shuffle.partitions", "theseus.query",
            "theseus.optimizer.excluded_rules", "theseus.config.<key>",
            "theseus.metadata.<key>")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Value:
    """An option or setting value and where it was written."""

    value: Any
    span: Span | None
    key_span: Span | None = None


@dataclass
class Table:
    name: str
    columns: list[Column] | None  # None: no column list
    options: dict[str, Value]
    span: Span | None  # the table name in CREATE TABLE
    column_spans: dict[str, Span | None] = field(default_factory=dict)
    query: exp.Expression | None = None  # CREATE TABLE ... AS SELECT


@dataclass
class Script:
    src: SqlText
    tables: dict[str, Table] = field(default_factory=dict)  # by lower-case name
    views: dict[str, exp.Expression] = field(default_factory=dict)  # by lower-case name
    settings: dict[str, Value] = field(default_factory=dict)
    target: Table | None = None
    query: exp.Expression | None = None
    query_span: Span | None = None

    def setting(self, name: str) -> Value | None:
        return self.settings.get(name)

    def reads_streams(self) -> bool:
        """Whether the query (or a view, which it may read) names a stream-role table."""
        exprs = [self.query, *self.views.values()]
        names = {t.name.lower() for e in exprs if e is not None for t in e.find_all(exp.Table)}
        return any(str(t.options["role"].value if "role" in t.options else "stream").lower()
                   == "stream" for n, t in self.tables.items()
                   if n in names and t is not self.target)


def read_script(src: SqlText, statements: list[exp.Expression]) -> Script:
    script = Script(src)
    inserts: list[tuple[exp.Expression, Table, exp.Expression]] = []
    for stmt in statements:
        if isinstance(stmt, exp.Set):
            _set(script, stmt)
        elif isinstance(stmt, exp.Create):
            _create(script, stmt, inserts)
        elif isinstance(stmt, exp.Insert):
            _insert(script, stmt, inserts)
        else:
            what = stmt.key.upper() if not isinstance(stmt, exp.Command) else \
                str(stmt.this).upper()
            raise src.error(f"{what} statements are not supported here (a script holds SET, "
                            "CREATE TABLE ... USING kafka, CREATE VIEW and one INSERT INTO or "
                            "CREATE TABLE ... AS SELECT)", stmt)
    if not inserts:
        raise SqlError("no query: the script needs one INSERT INTO <table> SELECT ... or "
                       "CREATE TABLE <table> USING kafka ... AS SELECT ...", file=src.file)
    if len(inserts) > 1:
        raise src.error("a plan has exactly one output: this is a second query (write one "
                        "script per query)", inserts[1][0])
    stmt, table, query = inserts[0]
    script.target = table
    script.query = query
    script.query_span = span_of(stmt)
    return script


# -- SET ------------------------------------------------------------------------------------


def _set(script: Script, stmt: exp.Set) -> None:
    src = script.src
    for item in stmt.expressions:
        eq = item.this if isinstance(item, exp.SetItem) else None
        if not isinstance(eq, exp.EQ):
            raise src.error("SET needs a key and a value: SET key = value", item)
        key = _dotted(eq.this)
        if key is None:
            raise src.error("SET needs a dotted key such as spark.sql.shuffle.partitions",
                            eq.this)
        low = key.lower()
        value = _literal(eq.expression)
        if value is _NOT_LITERAL:
            raise src.error(f"the value of {key} must be a literal", eq.expression)
        known = low in SETTINGS or low.startswith(("theseus.config.", "theseus.metadata."))
        if not known:
            raise src.error(f"unknown setting '{key}'" +
                            did_you_mean(low, [s for s in SETTINGS if "<" not in s]) +
                            "; supported: " + ", ".join(SETTINGS), eq.this)
        v = Value(value, span_of(eq.expression), span_of(eq.this))
        if low == "spark.sql.shuffle.partitions" and \
                (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise src.error("spark.sql.shuffle.partitions must be a positive integer",
                            eq.expression)
        if low == "theseus.query" and (not isinstance(value, str) or not _NAME.match(value)):
            raise src.error("theseus.query must be a name of letters, digits, '_', '.' or "
                            "'-'", eq.expression)
        script.settings[low] = v


def _dotted(e: exp.Expression) -> str | None:
    if isinstance(e, exp.Column):
        return ".".join(p.name for p in e.parts)
    if isinstance(e, exp.Dot):
        left = _dotted(e.this)
        return f"{left}.{e.expression.name}" if left else None
    if isinstance(e, (exp.Identifier, exp.Var)):
        return e.name
    return None


_NOT_LITERAL = object()


def _literal(e: exp.Expression | None) -> Any:
    if isinstance(e, exp.Literal):
        if e.is_string:
            return e.this
        text = e.this
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return text
    if isinstance(e, exp.Neg) and isinstance(e.this, exp.Literal) and not e.this.is_string:
        v = _literal(e.this)
        return -v if isinstance(v, (int, float)) else _NOT_LITERAL
    if isinstance(e, exp.Boolean):
        return bool(e.this)
    if isinstance(e, (exp.Var, exp.Identifier)):
        return e.name
    if isinstance(e, exp.Column) and not e.table:
        return e.name
    return _NOT_LITERAL


# -- CREATE and INSERT ----------------------------------------------------------------------


def _create(script: Script, stmt: exp.Create,
            inserts: list[tuple[exp.Expression, Table, exp.Expression]]) -> None:
    src = script.src
    kind = (stmt.args.get("kind") or "").upper()
    target = stmt.this
    if kind == "VIEW":
        name = target.name if isinstance(target, exp.Table) else None
        if not name or stmt.expression is None:
            raise src.error("CREATE VIEW needs a name and AS SELECT ...", stmt)
        script.views[name.lower()] = stmt.expression
        return
    if kind != "TABLE":
        raise src.error(f"CREATE {kind or '...'} is not supported (declare Kafka topics "
                        "with CREATE TABLE ... USING kafka)", stmt)
    schema = target if isinstance(target, exp.Schema) else None
    table_node = schema.this if schema is not None else target
    if not isinstance(table_node, exp.Table) or table_node.args.get("db"):
        raise src.error("a table name is one plain name (the Kafka topic is an option)",
                        table_node)
    name = table_node.name
    if name.lower() in script.tables:
        raise src.error(f"table '{name}' is declared twice", table_node)
    if not _NAME.match(name):
        raise src.error(f"table name '{name}' must be letters, digits, '_', '.' or '-' "
                        "(it becomes a node id)", table_node)
    options: dict[str, Value] = {}
    for prop in (stmt.args.get("properties") or exp.Properties(expressions=[])).expressions:
        if isinstance(prop, exp.FileFormatProperty):
            using = prop.name or _dotted(prop.this) or ""
            if using.lower() != "kafka":
                after = span_of(table_node)
                raise src.error(f"tables are Kafka topics: USING {using} is not supported "
                                "(write USING kafka)",
                                src.find_after(using, after[1] if after else None))
        elif isinstance(prop, exp.OptionsProperty):
            for opt in prop.expressions:
                _option(src, opt, options)
        elif isinstance(prop, exp.TemporaryProperty):
            continue
        else:
            raise src.error(f"{prop.sql(dialect='spark')} is not supported (use "
                            "OPTIONS (...))", prop)
    columns = None
    spans: dict[str, Span | None] = {}
    if schema is not None:
        columns = []
        for cdef in schema.expressions:
            if not isinstance(cdef, exp.ColumnDef) or cdef.args.get("kind") is None:
                raise src.error("a column is declared as <name> <type>", cdef)
            cname = cdef.name
            if cname.lower() in spans:
                raise src.error(f"column '{cname}' is declared twice", cdef.this)
            ctype = _type(src, cdef.args["kind"])
            nullable = True
            for c in cdef.args.get("constraints") or []:
                if isinstance(c.args.get("kind"), exp.NotNullColumnConstraint):
                    nullable = False
                elif isinstance(c.args.get("kind"), exp.CommentColumnConstraint):
                    continue
                else:
                    raise src.error("only NOT NULL and COMMENT are supported on a column",
                                    span_of(c) or span_of(cdef))
            columns.append(Column(cname, ctype, nullable))
            spans[cname.lower()] = span_of(cdef.this)
    table = Table(name, columns, options, span_of(table_node), spans)
    script.tables[name.lower()] = table
    if stmt.expression is not None:
        if columns is not None:
            raise src.error("CREATE TABLE ... AS SELECT takes its columns from the query: "
                            "drop the column list (or declare the table and INSERT INTO it)",
                            schema)
        table.query = stmt.expression
        inserts.append((stmt, table, stmt.expression))
    elif columns is None:
        raise src.error(f"table '{name}' needs a column list (or AS SELECT ...)", table_node)


def _insert(script: Script, stmt: exp.Insert,
            inserts: list[tuple[exp.Expression, Table, exp.Expression]]) -> None:
    src = script.src
    target = stmt.this
    if isinstance(target, exp.Schema):
        raise src.error("a column list after INSERT INTO is not supported: the query's "
                        "columns go to the table's columns by position", target)
    if not isinstance(target, exp.Table):
        raise src.error("INSERT INTO needs a table name", stmt)
    if stmt.args.get("overwrite"):
        raise src.error("INSERT OVERWRITE is not supported on a Kafka topic (use INSERT "
                        "INTO)", stmt)
    table = script.tables.get(target.name.lower())
    if table is None:
        raise src.error(f"unknown table '{target.name}'" +
                        did_you_mean(target.name, [t.name for t in script.tables.values()]) +
                        ": declare it first with CREATE TABLE ... USING kafka", target)
    if stmt.expression is None:
        raise src.error("INSERT INTO needs a SELECT", stmt)
    inserts.append((stmt, table, stmt.expression))


def _option(src: SqlText, opt: exp.Expression, options: dict[str, Value]) -> None:
    if not isinstance(opt, exp.Property):
        raise src.error("an option is written key 'value'", opt)
    k = opt.this
    key = (k.this if isinstance(k, exp.Literal) else _dotted(k) or k.name).lower()
    value_span = span_of(opt.args.get("value"))
    # sqlglot keeps no position for an unquoted key: find it just before its value.
    key_span = span_of(k) or src.find_before(key, value_span[0] if value_span else None)
    allowed = sorted(set(SOURCE_OPTIONS) | set(SINK_OPTIONS))
    if key not in allowed:
        raise src.error(f"unknown option '{key}'" + did_you_mean(key, allowed) +
                        "; supported: " + ", ".join(allowed), key_span)
    if key in options:
        raise src.error(f"option '{key}' is given twice", key_span)
    value = _literal(opt.args.get("value"))
    if value is _NOT_LITERAL:
        raise src.error(f"the value of option '{key}' must be a literal", opt.args["value"])
    options[key] = Value(value, value_span or key_span, key_span)


def _type(src: SqlText, dt: exp.DataType) -> str:
    text = dt.sql(dialect="spark")
    try:
        return T.parse_type(text)
    except T.TypeSyntaxError as e:
        raise src.error(f"unsupported column type {text}: {e}", dt) from None


# -- a table used as a source or as the sink ---------------------------------------------


def _opt(src: SqlText, table: Table, key: str, kind: type | tuple[type, ...], default: Any,
         choices: tuple[str, ...] | None = None) -> Any:
    v = table.options.get(key)
    if v is None:
        return default
    value = v.value
    if isinstance(value, bool) or not isinstance(value, kind):
        want = "a number" if kind is int else "a string"
        raise src.error(f"option '{key}' of table '{table.name}' must be {want}", v.span)
    if choices is not None:
        value = str(value).lower()
        if value not in choices:
            raise src.error(f"option '{key}' must be one of " + ", ".join(choices) +
                            did_you_mean(value, choices), v.span)
    return value


def _refuse(src: SqlText, table: Table, allowed: tuple[str, ...], role: str) -> None:
    for key, v in table.options.items():
        if key not in allowed:
            raise src.error(f"option '{key}' does not apply to {role} table '{table.name}'",
                            v.key_span)


def _key_list(src: SqlText, table: Table, names: list[str] | None) -> tuple[str, ...]:
    v = table.options.get("key")
    if v is None:
        return ()
    if not isinstance(v.value, str) or not v.value.strip():
        raise src.error("option 'key' is a comma-separated list of columns", v.span)
    keys = tuple(k.strip() for k in v.value.split(","))
    if not all(keys):
        raise src.error("option 'key' is a comma-separated list of columns", v.span)
    if names is not None:
        lowered = {n.lower(): n for n in names}
        out = []
        for k in keys:
            if k.lower() not in lowered:
                raise src.error(f"key column '{k}' is not a column of '{table.name}'" +
                                did_you_mean(k, names), v.span)
            out.append(lowered[k.lower()])
        keys = tuple(out)
    return keys


def source_step(src: SqlText, table: Table, step_id: str, *,
                changelog: bool = False) -> Source:
    """The source step reading a declared table; a table as a changelog when ``changelog``
    (the query reads no stream) or option ``read`` says so (module doc)."""
    _refuse(src, table, SOURCE_OPTIONS, "input")
    assert table.columns is not None
    names = [c.name for c in table.columns]
    topic = _opt(src, table, "topic", str, table.name)
    partitions = _opt(src, table, "partitions", int, 1)
    if partitions < 1:
        raise src.error("option 'partitions' must be at least 1",
                        table.options["partitions"].span)
    fmt = _opt(src, table, "format", str, "json", ("json", "string", "avro"))
    avro = _avro(src, table, fmt)
    role = _opt(src, table, "role", str, "stream", ("stream", "table"))
    keys = _key_list(src, table, names)
    if role == "table" and not keys:
        raise src.error(f"table '{table.name}' has role 'table' (latest value per key), so it "
                        "needs OPTIONS (key '<column>[,<column>...]')", table.span)
    et = _opt(src, table, "event_time", str, None)
    wm = _opt(src, table, "watermark", str, None)
    if et is not None:
        lowered = {n.lower(): n for n in names}
        if et.lower() not in lowered:
            raise src.error(f"event_time column '{et}' is not a column of '{table.name}'" +
                            did_you_mean(et, names), table.options["event_time"].span)
        et = lowered[et.lower()]
        ctype = next(c.type for c in table.columns if c.name == et)
        if ctype not in ("timestamp", "timestamp_ntz"):
            raise src.error(f"event_time column '{et}' must be a TIMESTAMP (it is {ctype})",
                            table.options["event_time"].span)
        if wm is None:
            raise src.error(f"event_time '{et}' needs a watermark: OPTIONS (... watermark "
                            "'30 seconds')", table.options["event_time"].span)
    if wm is not None:
        if et is None:
            raise src.error("a watermark needs an event_time column",
                            table.options["watermark"].span)
        if duration_seconds(wm) is None:
            raise src.error(f"invalid watermark '{wm}' (expected a duration such as "
                            "'30 seconds')", table.options["watermark"].span)
    start = _opt(src, table, "starting_offsets", str, "earliest", ("earliest", "latest"))
    read = _opt(src, table, "read", str, None, (CHANGELOG, SNAPSHOT))
    if read is not None and role != "table":
        raise src.error(f"option 'read' says how a table is read; '{table.name}' has role "
                        f"'{role}' (add OPTIONS (role 'table'))", table.options["read"].span)
    version = 1
    if role == "table" and (read == CHANGELOG or (read is None and changelog)):
        version, read = CHANGELOG_VERSION, None  # version 2 reads a table as a changelog
    elif read == SNAPSHOT:
        version = CHANGELOG_VERSION
    return Source(id=step_id, topic=topic, partitions=partitions, format=fmt, role=role,
                  schema=tuple(table.columns), key_columns=keys,
                  event_time=EventTime(et, wm) if et is not None and wm is not None else None,
                  starting_offsets=start, version=version, read=read, avro=avro)


def _avro(src: SqlText, table: Table, fmt: str) -> AvroSpec | None:
    """The ``avro.*`` options as the step's ``avro`` field (None when none is given)."""
    given = [k for k in AVRO_OPTIONS if k in table.options]
    if not given:
        return None
    if fmt != "avro":
        raise src.error(f"option '{given[0]}' says how an Avro topic is encoded; table "
                        f"'{table.name}' has format '{fmt}' (add OPTIONS (format 'avro'))",
                        table.options[given[0]].key_span)
    return AvroSpec(subject=_opt(src, table, "avro.subject", str, "topic_name",
                                 ("topic_name", "record_name", "topic_record_name")),
                    record=_opt(src, table, "avro.record", str, None),
                    schema=_opt(src, table, "avro.schema", str, None))


@dataclass(frozen=True)
class SinkOptions:
    topic: str
    format: str
    key_columns: tuple[str, ...] | None  # None: not given
    mode: str | None
    delivery: str
    avro: AvroSpec | None = None


def sink_options(src: SqlText, table: Table) -> SinkOptions:
    _refuse(src, table, SINK_OPTIONS, "output")
    names = [c.name for c in table.columns] if table.columns is not None else None
    keys = _key_list(src, table, names) if "key" in table.options else None
    fmt = _opt(src, table, "format", str, "json", ("json", "string", "avro"))
    return SinkOptions(
        topic=_opt(src, table, "topic", str, table.name),
        format=fmt,
        avro=_avro(src, table, fmt),
        key_columns=keys,
        mode=_opt(src, table, "mode", str, None, ("append", "update", "complete")),
        delivery=_opt(src, table, "delivery", str, "exactly_once",
                      ("exactly_once", "at_least_once")),
    )


__all__ = ["SETTINGS", "SINK_OPTIONS", "SOURCE_OPTIONS", "Script", "SinkOptions", "Table",
           "Value", "read_script", "sink_options", "source_step"]
