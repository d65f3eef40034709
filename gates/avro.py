"""The schema registry's wire format, read and written with fastavro.

A value is a zero byte (the magic byte), the writer schema's id (4 bytes, big-endian), then
the Avro binary body.  :class:`AvroDecoder` reads a value with the plan's reader schema:
the writer schema comes from the registry by id (parsed once per id), and fastavro resolves
one against the other by Avro's rules (defaults for missing fields, promotions, unions with
null).  :class:`AvroEncoder` registers (or finds) its schema under a subject once and
prefixes every body with that id.

A bad record is a :class:`~compat.errors.SourceError` naming the topic, partition and offset:
no magic byte, an id the registry does not know, a body that does not decode with the
writer schema.  The source fails on it rather than inventing a row: a JSON value that is
not an object has no row to give either, but an Avro record always has a writer schema that
says what it holds, so a bad one is a producer's bug to see, not data.  A registry that does
not answer fails the task too (Spark retries it).
"""
from __future__ import annotations

import base64
import datetime as _dt
import decimal
import io
import json
import struct
from collections.abc import Callable, Mapping
from typing import Any

from compat import avro as A
from compat.errors import SourceError
from compat.registry import RegistryClient, RegistryError

MAGIC = 0
HEADER = struct.Struct(">bI")
_SCHEMA_ID = struct.Struct(">I").unpack_from


def frame(schema_id: int, body: bytes) -> bytes:
    """A value in the wire format."""
    return HEADER.pack(MAGIC, schema_id) + body


def unframe(value: bytes) -> tuple[int, memoryview]:
    """``(schema id, body)`` of a value; ValueError when it is not in the wire format."""
    if len(value) < HEADER.size or value[0] != MAGIC:
        raise ValueError("no magic byte" if not value or value[0] != MAGIC
                         else "shorter than the 5-byte header")
    return HEADER.unpack_from(value)[1], memoryview(value)[HEADER.size:]


class AvroDecoder:
    """Decodes a topic's values into dicts of the reader schema's fields."""

    def __init__(self, topic: str, reader_schema: str | None, registry: RegistryClient):
        """``reader_schema`` None: each record as its writer schema says (record keys,
        whose fields are taken by name)."""
        # fastavro loads with the first Avro source (start-up time of other queries)
        import fastavro

        self.fastavro = fastavro
        self.topic = topic
        self.reader = fastavro.parse_schema(json.loads(reader_schema)) \
            if reader_schema is not None else None
        self.registry = registry
        #: schema id -> (writer schema, the reader schema to resolve it with or None)
        self.writers: dict[int, tuple[Any, Any]] = {}

    def writer(self, schema_id: int, partition: int, offset: int) -> tuple[Any, Any]:
        w = self.writers.get(schema_id)
        if w is None:
            try:
                text = self.registry.schema(schema_id)
            except RegistryError as e:
                if e.status == 404:
                    raise SourceError(f"the record's schema id {schema_id} is unknown to the "
                                      f"schema registry at {self.registry.url}",
                                      topic=self.topic, partition=partition,
                                      expected="an id the registry knows",
                                      found=f"offset {offset}: id {schema_id}") from None
                raise SourceError(f"cannot fetch the writer schema of offset {offset}: "
                                  f"{e.render()}", topic=self.topic,
                                  partition=partition) from None
            parsed = self.fastavro.parse_schema(json.loads(text))
            # the plan's reader schema itself (the common case): no resolution to do, and
            # fastavro reads about twice as fast without one
            w = (parsed, None if parsed == self.reader else self.reader)
            self.writers[schema_id] = w
        return w

    def decode(self, value: bytes, partition: int, offset: int) -> dict:
        if len(value) < HEADER.size or value[0] != MAGIC:
            try:
                unframe(value)
            except ValueError as e:
                raise SourceError("the record is not in the schema registry's wire format",
                                  topic=self.topic, partition=partition,
                                  expected="a zero byte, a 4-byte schema id, the Avro body",
                                  found=f"offset {offset}: {e} "
                                  f"(first bytes {bytes(value[:5]).hex() or 'none'})") from None
        # read in place, past the header: no slice of the body, no second call per record
        # (a quarter of the decoding time of a record of a few fields)
        sid = _SCHEMA_ID(value, 1)[0]
        w = self.writers.get(sid)
        writer, reader = w if w is not None else self.writer(sid, partition, offset)
        buf = io.BytesIO(value)
        buf.seek(HEADER.size)
        try:
            doc = self.fastavro.schemaless_reader(buf, writer, reader)
        except Exception as e:  # fastavro raises whatever its decoder meets
            raise SourceError(f"the record's Avro body does not decode with schema id {sid}",
                              topic=self.topic, partition=partition,
                              expected="an Avro body of the writer schema, resolvable by "
                              "the plan's reader schema",
                              found=f"offset {offset}: {type(e).__name__}: {e}") from None
        if buf.tell() != len(value):
            raise SourceError(f"the record's Avro body is longer than schema id {sid} says",
                              topic=self.topic, partition=partition,
                              expected=f"{buf.tell() - HEADER.size} bytes",
                              found=f"offset {offset}: {len(value) - HEADER.size} bytes")
        return doc


class AvroEncoder:
    """Encodes dicts under one writer schema, registered under ``subject`` at first use."""

    def __init__(self, subject: str, writer_schema: str, registry: RegistryClient):
        import fastavro

        self.fastavro = fastavro
        self.subject = subject
        self.text = writer_schema
        self.writer = fastavro.parse_schema(json.loads(writer_schema))
        self.registry = registry
        self.schema_id: int | None = None

    def register(self) -> int:
        if self.schema_id is None:
            self.schema_id = self.registry.register(self.subject, self.text)
        return self.schema_id

    def encode(self, doc: Mapping[str, Any]) -> bytes:
        buf = io.BytesIO()
        self.fastavro.schemaless_writer(buf, self.writer, doc)
        return frame(self.register(), buf.getvalue())


def datum(s: Any, v: Any) -> Any:
    """A value of the gated sink's JSON (Spark's ``to_json``: timestamps and dates as ISO
    text, binary as base64, decimals as numbers) as fastavro writes it for schema ``s``
    (a ``compat.avro`` schema)."""
    if v is None:
        return None
    k = A.kind(s)
    if k == "union":
        branches = [b for b in s if A.kind(b) != "null"]
        for b in branches[:-1]:
            try:
                return datum(b, v)
            except (TypeError, ValueError, KeyError, decimal.InvalidOperation):
                continue
        return datum(branches[-1], v)
    logical = s.get("logicalType") if isinstance(s, dict) else None
    if logical in ("timestamp-micros", "timestamp-millis"):
        d = _dt.datetime.fromisoformat(str(v).replace("Z", "+00:00"))
        return d if d.tzinfo else d.replace(tzinfo=_dt.UTC)
    if logical in ("local-timestamp-micros", "local-timestamp-millis"):
        return _dt.datetime.fromisoformat(str(v))
    if logical == "date":
        return _dt.date.fromisoformat(str(v)[:10])
    if logical == "decimal":
        return decimal.Decimal(str(v))
    if k in ("int", "long"):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{v!r} is not an integer")
        return v
    if k in ("float", "double"):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{v!r} is not a number")
        return float(v)
    if k in ("bytes", "fixed"):
        return base64.b64decode(v) if isinstance(v, str) else bytes(v)
    if k == "string" and not isinstance(v, str):
        raise TypeError(f"{v!r} is not a string")
    if k == "array":
        return [datum(s["items"], x) for x in v]
    if k == "map":
        return {key: datum(s["values"], x) for key, x in v.items()}
    if k == "record":
        return {f["name"]: datum(f["type"], v[f["name"]]) for f in s["fields"]
                if f["name"] in v}
    return v


def converter(s: Any) -> Any:
    """:func:`datum` for schema ``s`` made once: a function of a JSON value, or None where
    the JSON value is already what fastavro writes (strings, numbers, booleans, nulls, and
    records and collections of only those). A sink's rows are mostly such values: its
    records are then encoded without a walk of each value (twice as fast)."""
    k = A.kind(s)
    if k == "union":
        branches = [b for b in s if A.kind(b) != "null"]
        if len(branches) != 1:
            return lambda v: datum(s, v)  # which branch: tried in turn, as datum does
        inner = converter(branches[0])
        return None if inner is None else (lambda v: None if v is None else inner(v))
    logical = s.get("logicalType") if isinstance(s, dict) else None
    if logical is not None or k in ("bytes", "fixed"):
        return lambda v: datum(s, v)
    if k == "array":
        item = converter(s["items"])
        return None if item is None else (
            lambda v: None if v is None else [item(x) for x in v])
    if k == "map":
        val = converter(s["values"])
        return None if val is None else (
            lambda v: None if v is None else {key: val(x) for key, x in v.items()})
    if k == "record":
        fields = [(f["name"], converter(f["type"])) for f in s["fields"]]
        if all(c is None for _, c in fields):
            return None
        return lambda v: None if v is None else {
            n: (c(v[n]) if c is not None else v[n]) for n, c in fields if n in v}
    return None


class JsonToAvro:
    """The gated sink's JSON values (text) as wire-format Avro values of one writer schema,
    registered under its subject when this is made: before the query writes anything."""

    def __init__(self, subject: str, writer_schema: str, registry: RegistryClient):
        self.schema = A.parse(writer_schema)
        self.encoder = AvroEncoder(subject, writer_schema, registry)
        self.schema_id = self.encoder.register()
        self.convert = converter(self.schema)

    def __call__(self, value: str | bytes | None) -> bytes | None:
        if value is None:
            return None  # a tombstone stays one
        if isinstance(value, bytes) and value[:1] == b"\x00":
            # a migration's corrections are records read back from Kafka, already in the
            # wire format (JSON text never starts with a zero byte)
            return value
        doc = json.loads(value)
        return self.encoder.encode(doc if self.convert is None else self.convert(doc))

    def arrow(self, columns: Mapping[str, str]) -> ArrowRows | None:
        """The encoder of a batch's Arrow rows with these columns (names and Spark types),
        or None where the batch must take the JSON path (a pair of types ArrowRows does
        not write)."""
        try:
            return ArrowRows(self.schema_id, self.schema, columns)
        except ValueError:
            return None


# ---------------------------------------------------------------- from Arrow, column at a time
#
# The gated sink's batch comes out of Spark as Arrow.  Going through Spark's ``to_json`` and
# ``json.loads`` to feed fastavro a dict per row cost most of the sink's time
# (bench/results/avro.md).  A record's Avro body is its fields' encodings one after the other,
# so each column is encoded on its own, in one pass over its values, and each row's body is
# the join of its columns' pieces.  Only the pairs of Spark type and Avro type below are
# encoded so; for those the bytes are the ones fastavro writes from the JSON walk
# (tests/test_avro_arrow.py compares them), any other schema keeps the JSON path.

_ZZ_SMALL = 1 << 13
_VARINTS: list[bytes] = []


def _varint(z: int) -> bytes:
    """Avro's variable-length encoding of a zigzagged (non-negative) integer."""
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_VARINTS.extend(_varint(z) for z in range(2 * _ZZ_SMALL))


def _long(n: int) -> bytes:
    """An Avro int or long."""
    if 0 <= n < _ZZ_SMALL:
        return _VARINTS[n << 1]
    return _varint((n << 1) ^ (n >> 63))


def _string(v: str) -> bytes:
    b = v.encode()
    n = len(b)
    return (_VARINTS[n << 1] if n < _ZZ_SMALL else _long(n)) + b


def _bytes(v: bytes) -> bytes:
    n = len(v)
    return (_VARINTS[n << 1] if n < _ZZ_SMALL else _long(n)) + bytes(v)


def _boolean(v: bool) -> bytes:
    if type(v) is not bool:
        raise TypeError(f"{v!r} is not a boolean")
    return b"\x01" if v else b"\x00"


_FLOAT = struct.Struct("<f").pack
_DOUBLE = struct.Struct("<d").pack
_INT_TYPES = {"tinyint", "smallint", "int"}
_LONG_TYPES = _INT_TYPES | {"bigint"}


def _value_encoder(s: Any, spark: str) -> tuple[Any, Callable[[Any], bytes]] | None:
    """``(arrow type to cast the column to or None, value -> bytes)`` for a non-null Avro
    type ``s`` fed from a Spark column of type ``spark`` (its ``simpleString``), or None
    when the pair is not one this path writes."""
    import pyarrow as pa

    k = A.kind(s)
    logical = s.get("logicalType") if isinstance(s, dict) else None
    if logical is not None:
        if logical == "date" and k == "int" and spark == "date":
            return pa.int32(), _long
        if logical == "timestamp-micros" and k == "long" and spark in ("timestamp",
                                                                     "timestamp_ntz"):
            # microseconds from the epoch: what the walk's aware datetime comes to (a
            # timestamp_ntz is taken as UTC there too)
            return pa.int64(), _long
        if logical == "local-timestamp-micros" and k == "long" and spark == "timestamp_ntz":
            return pa.int64(), _long
        if logical == "decimal" and k == "bytes" and spark.startswith("decimal("):
            from fastavro._logical_writers_py import prepare_bytes_decimal

            # Arrow's Decimal is the column's exact value: the JSON walk went through a
            # float, equal up to 15 significant digits and wrong past them
            return None, lambda v: _bytes(prepare_bytes_decimal(v, s))
        return None
    if k == "string" and spark == "string":
        return None, _string
    if k == "boolean" and spark == "boolean":
        return None, _boolean
    if (k == "int" and spark in _INT_TYPES) or (k == "long" and spark in _LONG_TYPES):
        return None, _long
    if k == "float" and (spark == "float" or spark in _LONG_TYPES):
        return None, _FLOAT
    # a float column as an Avro double is not here: the walk wrote the double of the
    # float's shortest text (Java's), Arrow gives the float's exact value
    if k == "double" and (spark == "double" or spark in _LONG_TYPES):
        return None, _DOUBLE
    if k == "bytes" and spark == "binary":
        return None, _bytes
    return None


def _field_encoder(s: Any, spark: str) -> Callable[[Any], list[bytes]] | None:
    """The encoder of one column (an Arrow array or chunked array) into each row's piece,
    for Avro type ``s`` (a union with null allowed), or None."""
    null_piece = None
    if A.kind(s) == "union":
        branches = [b for b in s if A.kind(b) != "null"]
        if len(branches) != 1 or len(s) != 2:
            return None  # which branch a value takes: the JSON walk tries them in turn
        null_piece = _long(next(i for i, b in enumerate(s) if A.kind(b) == "null"))
        value_piece = _long(s.index(branches[0]))
        s = branches[0]
    found = _value_encoder(s, spark)
    if found is None:
        return None
    cast, enc = found

    def encode(col: Any) -> list[bytes]:
        values = (col.cast(cast) if cast is not None else col).to_pylist()
        if null_piece is None:
            return [enc(v) for v in values]
        return [null_piece if v is None else value_piece + enc(v) for v in values]

    return encode


class ArrowRows:
    """The rows of an Arrow table as wire-format values of one writer schema (see above)."""

    def __init__(self, schema_id: int, schema: Any, columns: Mapping[str, str]):
        """``columns``: the batch's column names and Spark types.  Raises ValueError when
        a field is not of a pair this path writes (the caller keeps the JSON path)."""
        self.header = frame(schema_id, b"")
        self.parts: list[tuple[str | None, Any]] = []
        for f in schema["fields"]:
            name = f["name"]
            if name not in columns:
                if "default" not in f:
                    raise ValueError(f"field {name} is no column and has no default")
                # the record writer writes the field's default: one constant piece
                buf = io.BytesIO()
                import fastavro

                fastavro.schemaless_writer(buf, fastavro.parse_schema(
                    {"type": "record", "name": "D", "fields": [
                        {"name": "d", "type": A.to_doc(f["type"])}]}), {"d": f["default"]})
                self.parts.append((None, buf.getvalue()))
                continue
            enc = _field_encoder(f["type"], columns[name])
            if enc is None:
                raise ValueError(f"field {name}: {A.describe(f['type'])} from a Spark "
                                 f"{columns[name]} column is not written from Arrow")
            self.parts.append((name, enc))

    def __call__(self, table: Any) -> list[bytes]:
        n = table.num_rows
        pieces = [[enc] * n if name is None else enc(table.column(name))
                  for name, enc in self.parts]
        header = self.header
        return [header + b"".join(p) for p in zip(*pieces)]
