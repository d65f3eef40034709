"""A SQL script as a plan: ``theseus check``, ``plan show`` and the rest read ``.sql`` files
through here (``compat.check.load_plan`` dispatches on the suffix).

The script is compiled on the fly, exactly as ``theseus plan compile`` compiles it, and the
plan keeps where each of its parts was written (``Plan.positions``, by JSON pointer): a node
at the SQL that produced it (the compiler's origins), a source's or the sink's options and
declared columns at their text in ``CREATE TABLE``, the config and the query name at their
``SET``.  Reports point there rather than at a compiled JSON nobody wrote.
"""

from __future__ import annotations

import sys

from compat.errors import SqlError
from compat.model import Plan, Position
from compat.sql.compiler import Compiled, compile_script
from compat.sql.script import Value
from compat.sql.text import Span, SqlText

#: table option -> the plan field it fills (a JSON pointer below the node)
OPTION_FIELDS = {"topic": "topic", "partitions": "partitions", "format": "format",
                 "role": "role", "key": "key_columns", "event_time": "event_time/column",
                 "watermark": "event_time/watermark", "starting_offsets": "starting_offsets",
                 "read": "read", "mode": "mode", "delivery": "delivery",
                 "avro.subject": "avro/subject", "avro.record": "avro/record",
                 "avro.schema": "avro/schema"}


def read_sql(path: str, raw: bytes | None = None) -> str:
    """The text of a SQL file (``-`` reads standard input; ``raw`` gives the bytes of a file
    that is not on disk, such as a file at a git ref)."""
    try:
        if raw is not None:
            return raw.decode("utf-8-sig")
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except FileNotFoundError:
        raise SqlError("file not found", file=path) from None
    except IsADirectoryError:
        raise SqlError("is a directory, not a SQL file", file=path) from None
    except UnicodeDecodeError as e:
        raise SqlError(f"not UTF-8 text (byte {e.start})", file=path) from None
    except OSError as e:
        raise SqlError(f"cannot read file: {e.strerror}", file=path) from None


def load_sql_plan(path: str, raw: bytes | None = None) -> Plan:
    """Compile a SQL file into a validated plan that knows where its parts were written."""
    text = read_sql(path, raw)
    name = "<stdin>" if path == "-" and raw is None else path
    compiled = compile_script(text, name)
    plan = compiled.plan
    plan.positions = positions(SqlText(text, name), compiled)
    return plan


def positions(src: SqlText, compiled: Compiled) -> dict[str, Position]:
    """Where each part of the compiled plan was written, by JSON pointer."""
    plan, graph, script = compiled.plan, compiled.graph, compiled.script
    out: dict[str, Position] = {}

    def put(pointer: str, span: Span | None) -> None:
        if span is not None:
            out[pointer] = _position(src, span)

    def setting(pointer: str, name: str) -> None:
        if script is not None and name in script.settings:
            put(pointer, _value_span(script.settings[name]))

    for nid, ptr in plan.pointers.items():
        put(ptr, graph.origins.get(nid))
    if script is None:
        return out
    put("", script.query_span)
    if script.target is not None:
        put("/query", script.target.span)
    setting("/query", "theseus.query")
    setting("/config/state_partitions", "spark.sql.shuffle.partitions")
    for name in script.settings:
        if name.startswith("theseus.config."):
            setting("/config/" + name[len("theseus.config."):], name)
    config = [p for k, p in out.items() if k.startswith("/config/")]
    if config:  # the config as a whole: its first SET
        out["/config"] = min(config)
    # Sources and the sink are declared tables: their fields come from OPTIONS and the
    # column list, each written somewhere of its own.
    for nid, node in plan.nodes.items():
        if node.step == "sink":
            table = script.target
        elif node.step == "source":
            table = script.tables.get(nid.lower())
        else:
            continue
        if table is None or nid not in plan.pointers:
            continue
        ptr = plan.pointers[nid]
        for option, value in table.options.items():
            if option in OPTION_FIELDS:
                put(f"{ptr}/{OPTION_FIELDS[option]}", _value_span(value))
        for i, column in enumerate(getattr(node, "schema", ()) or ()):
            put(f"{ptr}/schema/{i}", table.column_spans.get(column.name.lower()))
    return out


def _value_span(value: Value) -> Span | None:
    """From a setting's or option's key to the end of its value."""
    if value.key_span is None or value.span is None:
        return value.span or value.key_span
    return min(value.key_span[0], value.span[0]), max(value.key_span[1], value.span[1])


def _position(src: SqlText, span: Span) -> Position:
    line, col = src.position(span[0])
    end_line, end_col = src.position(span[1])
    return Position(line, col, end_line, end_col)


__all__ = ["OPTION_FIELDS", "load_sql_plan", "positions", "read_sql"]
