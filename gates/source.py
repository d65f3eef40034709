"""The gated Kafka source: a PySpark Python data source named ``theseus_kafka``.

    from gates.source import register
    register(spark)
    df = (spark.readStream.format("theseus_kafka")
          .option("bootstrap", "127.0.0.1:19092").option("topic", "packages")
          .option("partitions", 3).option("format", "json")
          .option("schema", "ship_id STRING, weight DOUBLE, ts TIMESTAMP")
          .option("store", "/var/theseus").option("query", "ship_load")
          .load())

Options (names are case-insensitive, values strings):

``bootstrap`` (required), ``topic`` (required), ``partitions`` (expected partition count; the
    broker's metadata wins, a topic with fewer partitions is an error), ``format`` (``json``
    default | ``string`` | ``avro``: the schema registry's wire format, read with the reader
    schema ``avroSchema`` (Avro JSON), writer schemas fetched by id from the registry at
    ``registry`` (its Confluent-compatible API; ``registry.<setting>``: the client's
    ``schema.registry.*`` settings), see :mod:`gates.avro`; ``avroKey`` ``true``: the
    record keys are Avro too), ``schema`` (Spark DDL of the
    output columns; for ``string`` default ``value STRING``: the value decoded as UTF-8 goes
    into the first column),
``maxRecordsPerBatch`` (admission control, default 100000 offsets per micro-batch over all
    partitions, spread fairly; ``0`` = unlimited), ``backfillBatches`` (a migration's shadow:
    read the history up to the head found at the first batch in about this many batches,
    each of at least ``BACKFILL_FLOOR`` offsets, so that the acknowledgements, and the
    migration's progress bar with them, move while it reads; ``0``, the default: off),
``store`` + ``query`` (gate state, see
    :mod:`gates.state`; both optional), ``startingOffsets`` (``earliest`` default | ``latest``),
``role`` (``stream`` default | ``table`` | ``changelog``), ``key_columns`` (comma list;
    required for ``table`` and ``changelog``), ``readTimeoutSeconds`` (a task fails if it
    makes no progress for this long, default 120), ``isolationLevel`` (``read_committed``
    default | ``read_uncommitted``),
``kafka.<conf>`` (passed to the librdkafka clients, e.g. ``kafka.security.protocol``),
``node`` (the plan's source node id: names this reader in the acknowledgements, see
    :func:`_reader_name`).

Errors are :class:`~compat.errors.SourceError` (one exception root, picklable), naming the
topic and partition and saying expected versus found.

Offsets are ``{"<topic>": {"<partition>": next offset}}``. Records whose headers carry
``theseus.control`` are never emitted but count as consumed offsets (as do transaction markers
and aborted records: admission control counts offsets, not rows). JSON values are parsed by
field name (exact, case-sensitive, like Spark's JSON reader): a missing field is null, a value
that does not fit the column's type is null, a value that is not a JSON object gives an
all-null row; stream-role tombstones (null value) are skipped. Timestamps are read from
ISO-8601 strings (no offset = UTC) or from epoch milliseconds.

A ``stream`` source is read with ``spark.readStream``; ``spark.read`` of it returns every
record. A ``table`` source is read with ``spark.read`` and returns the latest value per key
(``key_columns`` taken from the record key, a JSON object (with ``avroKey``: a wire-format
Avro record, read with its writer schema), else from the value; a tombstone
deletes the key). Each read takes the partitions' ends when the task runs, so a stream-static
join sees the table as of each micro-batch.

A ``changelog`` source is a table read with ``spark.readStream``: every record, a tombstone
too, is a row, its key columns taken from the record key as for ``table``; two more columns
(which the schema must end with) say ``_theseus_deleted`` (a null value: the key is deleted)
and ``_theseus_offset`` (the record's offset, the order of a key's changes: a key lives in
one partition).  ``migrate.build.changelog`` turns these upserts into retractions.
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import io
import json
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

try:  # PySpark >= 4.2
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older pyspark: no admission control
    ReadAllAvailable = ReadLimit = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

from compat.errors import BrokerError, DeadlineExceeded, GateStateError, SourceError
from gates.broker import LEADER_WAIT, partitions
from gates.cascade import read_switch
from gates.control import CONTROL_HEADER
from gates.deadline import Deadline
from gates.lease import lifted
from gates.retry import Unanswered, retry_each, retryable
from gates.state import (
    OPEN,
    GateState,
    drop_pending,
    is_acked,
    read_gate,
    write_ack,
    write_pending,
)

NAME = "theseus_kafka"
_CONTROL_KEY = CONTROL_HEADER
_CHUNK = 16384  # rows per yielded RecordBatch
_CHUNK_BYTES = 32 * 1024 * 1024  # or fewer rows when their values are this large
#: the fewest offsets a batch of a shadow's backfill reads (``backfillBatches``): a batch
#: costs a fixed part whatever it reads (bench/results/profile_backfill.md), and below a
#: few thousand records that part is all there is; a smaller backfill is read in fewer
#: batches
BACKFILL_FLOOR = 2000


# --------------------------------------------------------------------------- options

@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    topic: str
    partitions: int | None
    format: str
    schema: str
    max_records: int
    store: str | None
    query: str | None
    starting: str
    role: str
    key_columns: tuple[str, ...]
    read_timeout: float
    isolation: str
    # librdkafka settings (``kafka.<name>`` options: security settings among them, so
    # never in the repr, which error messages and logs could show)
    kafka_conf: tuple[tuple[str, str], ...] = field(repr=False)
    node: str | None = None
    backfill_batches: int = 0
    avro_schema: str | None = None
    #: the record keys are Avro too (``avroKey``): read with their writer schema
    avro_key: bool = False
    registry: str | None = None
    # the registry client's settings (credentials among them: never in the repr)
    registry_conf: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        def get(name, default=None):
            v = options.get(name)
            return default if v is None or v == "" else v

        bootstrap = get("bootstrap")
        topic = get("topic")
        if not bootstrap or not topic:
            missing = " and ".join(repr(n) for n, v in (("bootstrap", bootstrap),
                                                         ("topic", topic)) if not v)
            raise SourceError(f"{NAME}: option {missing} is required", topic=topic,
                              expected="options 'bootstrap' and 'topic'", found="none")

        def choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
            v = get(name, default).lower()
            if v not in allowed:
                raise SourceError(f"{NAME}: unknown value of option '{name}'", topic=topic,
                                  expected=" | ".join(allowed), found=repr(v))
            return v

        fmt = choice("format", "json", ("json", "string", "avro"))
        role = choice("role", "stream", ("stream", "table", "changelog"))
        starting = choice("startingOffsets", "earliest", ("earliest", "latest"))
        schema = get("schema")
        if schema is None:
            if fmt == "json":
                raise SourceError(f"{NAME}: option 'schema' (Spark DDL) is required for "
                                  "format json", topic=topic)
            schema = "value STRING"
        if fmt == "avro" and not (get("avroSchema") and get("registry")):
            raise SourceError(f"{NAME}: format avro needs options 'avroSchema' (the reader "
                              "schema) and 'registry' (the schema registry's URL)",
                              topic=topic, expected="both options",
                              found=", ".join(n for n in ("avroSchema", "registry")
                                              if get(n)) or "neither")
        keys = tuple(k.strip() for k in (get("key_columns", "") or "").split(",") if k.strip())
        if role in ("table", "changelog") and not keys:
            raise SourceError(f"{NAME}: role '{role}' needs option 'key_columns'", topic=topic)
        iso = choice("isolationLevel", "read_committed", ("read_committed", "read_uncommitted"))
        numbers = (("partitions", int, None), ("maxRecordsPerBatch", int, 100000),
                   ("readTimeoutSeconds", float, 120), ("backfillBatches", int, 0))
        values = {}
        for name, kind, default in numbers:
            v = get(name, default)
            try:
                values[name] = kind(v) if v is not None else None
            except ValueError:
                raise SourceError(f"{NAME}: option '{name}' is not a number", topic=topic,
                                  expected=f"{'an integer' if kind is int else 'a number'}",
                                  found=repr(v)) from None
        parts, max_records = values["partitions"], values["maxRecordsPerBatch"]
        read_timeout = values["readTimeoutSeconds"]
        kafka_conf = tuple(sorted((k[6:], str(v)) for k, v in options.items()
                                  if k.lower().startswith("kafka.") and v is not None))
        return cls(bootstrap=bootstrap, topic=topic, partitions=parts, format=fmt, schema=schema,
                   max_records=max_records, store=get("store"), query=get("query"),
                   starting=starting, role=role, key_columns=keys, read_timeout=read_timeout,
                   isolation=iso, kafka_conf=kafka_conf, node=get("node"),
                   backfill_batches=max(0, values["backfillBatches"]),
                   avro_schema=get("avroSchema"), registry=get("registry"),
                   avro_key=fmt == "avro" and get("avroKey", "false").lower() == "true",
                   registry_conf=tuple(sorted(
                       (k[9:], str(v)) for k, v in options.items()
                       if k.lower().startswith("registry.") and v is not None)))

    def consumer_conf(self) -> dict:
        conf = {
            "bootstrap.servers": self.bootstrap,
            "group.id": f"theseus-source-{self.topic}",  # never committed to
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "isolation.level": self.isolation,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "queued.max.messages.kbytes": 256 * 1024,
            "fetch.wait.max.ms": 100,
        }
        conf.update(dict(self.kafka_conf))
        return conf

    def admin_conf(self) -> dict:
        conf = {"bootstrap.servers": self.bootstrap}
        skip = ("fetch.", "max.partition", "queued.", "group.", "enable.", "auto.", "isolation.")
        conf.update({k: v for k, v in self.kafka_conf if not k.startswith(skip)})
        return conf


# --------------------------------------------------------------------------- offsets

_ADMINS: dict[tuple, Any] = {}


def _admin(opts: SourceOptions):
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka.admin import AdminClient

    key = (opts.bootstrap, opts.kafka_conf)
    a = _ADMINS.get(key)
    if a is None:
        a = _ADMINS[key] = AdminClient(opts.admin_conf())
    return a


def _kafka_partitions(opts: SourceOptions, timeout: float = 15.0) -> list[int]:
    try:
        parts = partitions(_admin(opts), opts.topic, timeout)
    except BrokerError as e:
        raise SourceError(f"{NAME}: {e.message}", topic=opts.topic, expected=e.expected,
                          found=e.found) from e
    except DeadlineExceeded as e:  # the metadata call timed out
        raise SourceError(f"{NAME}: the broker did not answer within {timeout:g} s",
                          topic=opts.topic, found=opts.bootstrap) from e
    if opts.partitions is not None and len(parts) < opts.partitions:
        raise SourceError(f"{NAME}: the topic has fewer partitions than the plan says",
                          topic=opts.topic, expected=f"{opts.partitions} partitions",
                          found=f"{len(parts)}")
    return parts


def _list_offsets(opts: SourceOptions, parts: list[int], which: str,
                  timeout: float = 15.0) -> dict[int, int]:
    """Earliest or latest (last stable, under read_committed) offsets of the partitions."""
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()
    iso = (IsolationLevel.READ_COMMITTED if opts.isolation == "read_committed"
           else IsolationLevel.READ_UNCOMMITTED)

    def ask(todo: list[int], cap: float) -> dict[int, Any]:
        req = {TopicPartition(opts.topic, p): spec for p in todo}
        futs = _admin(opts).list_offsets(req, isolation_level=iso, request_timeout=cap)
        out: dict[int, Any] = {}
        for tp, fut in futs.items():
            try:
                out[tp.partition] = int(fut.result(timeout=cap + 5).offset)
            except Exception as e:  # KafkaException, or the future's own TimeoutError
                out[tp.partition] = e
        return out

    # A partition whose leader just died answers NOT_LEADER / LEADER_NOT_AVAILABLE until the
    # controller has elected another (up to broker.session.timeout.ms, 9 s by default):
    # asked again for up to LEADER_WAIT seconds, so one broker of three may die under a query.
    try:
        out = retry_each(ask, parts, Deadline(max(timeout, LEADER_WAIT)),
                         f"the {which} offsets", cap=timeout)
    except Unanswered as e:
        raise SourceError(f"{NAME}: cannot list the {which} offset: {e.error}",
                          topic=opts.topic, partition=e.key) from e.error
    return dict(sorted(out.items()))


def _to_offset(topic: str, offs: Mapping[int, int]) -> dict:
    return {topic: {str(p): int(o) for p, o in sorted(offs.items())}}


def _from_offset(topic: str, doc: Mapping | None) -> dict[int, int]:
    if not doc:
        return {}
    parts = doc.get(topic)
    if parts is None:
        raise SourceError(f"{NAME}: the checkpoint's offset has no entry for the topic (was "
                          "the checkpoint written for another topic?)", topic=topic,
                          expected=f"an entry for '{topic}'", found=json.dumps(doc))
    return {int(p): int(o) for p, o in parts.items()}


def spread_limit(available: Mapping[int, int], budget: int) -> dict[int, int]:
    """Split ``budget`` offsets fairly over partitions with ``available`` offsets each."""
    take = {p: 0 for p in available}
    left = {p: n for p, n in sorted(available.items()) if n > 0}
    while budget > 0 and left:
        share = max(1, budget // len(left))
        for p in list(left):
            t = min(share, left[p], budget)
            take[p] += t
            budget -= t
            left[p] -= t
            if not left[p]:
                del left[p]
            if budget == 0:
                break
    return take


class KafkaRange(InputPartition):
    """One Kafka partition's offsets [start, end); None = from earliest / to latest at read."""

    def __init__(self, topic: str, partition: int, start: int | None, end: int | None):
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


# --------------------------------------------------------------------------- JSON -> Arrow

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_EPOCH_DATE = _dt.date(1970, 1, 1)


def _ts_micros(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return int(v * 1000)  # epoch millis
    if isinstance(v, str):
        s = v.strip()
        try:
            d = _dt.datetime.fromisoformat(s)
        except ValueError:
            try:
                d = _dt.datetime.fromisoformat(s.replace(" ", "T", 1))
            except ValueError:
                return None
        if d.tzinfo is None:
            d = d.replace(tzinfo=_dt.UTC)
        delta = d - _EPOCH
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return None


def _ts_ntz_micros(v: Any) -> int | None:
    if isinstance(v, str):
        try:
            d = _dt.datetime.fromisoformat(v.strip())
        except ValueError:
            return None
        if d.tzinfo is not None:
            d = d.astimezone(_dt.UTC).replace(tzinfo=None)
        delta = d - _EPOCH.replace(tzinfo=None)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return _ts_micros(v)


def _converter(dt: DataType):
    """A function JSON value -> Python value that pyarrow accepts for the column type."""
    if isinstance(dt, StringType):
        def conv(v):
            if v is None or isinstance(v, str):
                return v
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, (int, float)):
                return json.dumps(v)
            return json.dumps(v, separators=(",", ":"))
        return conv
    if isinstance(dt, (LongType, IntegerType, ShortType, ByteType)):
        bits = {LongType: 63, IntegerType: 31, ShortType: 15, ByteType: 7}[type(dt)]
        lo, hi = -(1 << bits), (1 << bits) - 1

        def conv(v):
            if v is None or isinstance(v, bool):
                return None
            if isinstance(v, float):
                if not v.is_integer():
                    return None
                v = int(v)
            elif isinstance(v, str):
                try:
                    v = int(v.strip())
                except ValueError:
                    return None
            elif not isinstance(v, int):
                return None
            return v if lo <= v <= hi else None
        return conv
    if isinstance(dt, (DoubleType, FloatType)):
        def conv(v):
            if v is None or isinstance(v, bool):
                return None
            if isinstance(v, (int, float)):
                return float(v)
            if isinstance(v, str):
                try:
                    return float(v)
                except ValueError:
                    return None
            return None
        return conv
    if isinstance(dt, BooleanType):
        def conv(v):
            if isinstance(v, bool):
                return v
            if isinstance(v, str) and v.lower() in ("true", "false"):
                return v.lower() == "true"
            return None
        return conv
    if isinstance(dt, TimestampType):
        return _ts_micros
    if isinstance(dt, TimestampNTZType):
        return _ts_ntz_micros
    if isinstance(dt, DateType):
        def conv(v):
            if isinstance(v, str):
                try:
                    return _dt.date.fromisoformat(v.strip()[:10])
                except ValueError:
                    return None
            return None
        return conv
    if isinstance(dt, DecimalType):
        q = decimal.Decimal(1).scaleb(-dt.scale)
        limit = decimal.Decimal(10) ** (dt.precision - dt.scale)

        def conv(v):
            if v is None or isinstance(v, bool) or not isinstance(v, (int, float, str)):
                return None
            try:
                d = decimal.Decimal(str(v)).quantize(q, rounding=decimal.ROUND_HALF_UP)
            except (decimal.InvalidOperation, ValueError):
                return None
            return d if abs(d) < limit else None
        return conv
    if isinstance(dt, BinaryType):
        def conv(v):
            if isinstance(v, str):
                try:
                    return base64.b64decode(v, validate=True)
                except ValueError:
                    return None
            return None
        return conv
    if isinstance(dt, ArrayType):
        elem = _converter(dt.elementType)

        def conv(v):
            return [elem(x) for x in v] if isinstance(v, list) else None
        return conv
    if isinstance(dt, MapType):
        kc, vc = _converter(dt.keyType), _converter(dt.valueType)

        def conv(v):
            if not isinstance(v, dict):
                return None
            out = [(kc(k), vc(x)) for k, x in v.items()]
            return [kv for kv in out if kv[0] is not None]
        return conv
    if isinstance(dt, StructType):
        fields = [(f.name, _converter(f.dataType)) for f in dt.fields]

        def conv(v):
            if not isinstance(v, dict):
                return None
            return {n: c(v.get(n)) for n, c in fields}
        return conv
    raise SourceError(f"{NAME}: unsupported column type", expected="a type the gated source "
                      "reads (numbers, strings, booleans, dates, timestamps, binary, decimal, "
                      "arrays, maps, structs)", found=dt.simpleString())


# Types whose raw JSON values pyarrow can take directly (a mismatch raises, then we convert).
_FAST = (StringType, LongType, IntegerType, DoubleType, BooleanType)
# Types Arrow's JSON reader parses exactly as the Python path does (or rejects, so the
# chunk falls back to the Python path). Dates (Arrow wants day numbers), binary (Arrow keeps
# the base64 text) and maps (unsupported) always take the Python path.
_ARROW_JSON_OK = (StringType, LongType, IntegerType, ShortType, ByteType, DoubleType, FloatType,
                  BooleanType, TimestampType, DecimalType)


def _arrow_json_ok(dt: DataType) -> bool:
    if isinstance(dt, _ARROW_JSON_OK):
        return True
    if isinstance(dt, ArrayType):
        return _arrow_json_ok(dt.elementType)
    if isinstance(dt, StructType):
        return all(_arrow_json_ok(f.dataType) for f in dt.fields)
    return False


class _ArrowBuilder:
    """Turns record values (bytes) into pyarrow RecordBatches of the source schema."""

    def __init__(self, schema: StructType, fmt: str, opts: SourceOptions | None = None):
        # pyarrow loads with the first batch read as Arrow (start-up time)
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        self.pa = pa
        self.schema = schema
        self.fmt = fmt
        # Exactly what PySpark's records_to_arrow_batches validates against.
        self.pa_schema = to_arrow_schema(schema, timezone="UTC")
        self.pa_struct = pa.struct(list(self.pa_schema))
        self.names = schema.fieldNames()
        self.convs = [_converter(f.dataType) for f in schema.fields]
        self.fast = [isinstance(f.dataType, _FAST) for f in schema.fields]
        self.arrow_json = fmt == "json" and _arrow_json_ok(schema)
        self.arrow_json_hits = 0  # chunks parsed by Arrow (for tests and tuning)
        self.decoder = None
        if fmt == "avro" and opts is not None:
            from compat.registry import PREFIX, RegistryClient
            from gates.avro import AvroDecoder

            client = RegistryClient.configured(opts.registry, {
                PREFIX + k: v for k, v in opts.registry_conf})
            assert client is not None  # options parsing requires the URL
            self.decoder = AvroDecoder(opts.topic, opts.avro_schema or "", client)

    def column(self, i: int, raw: list):
        pa = self.pa
        typ = self.pa_schema.field(i).type
        if self.fast[i]:
            try:
                return pa.array(raw, type=typ)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
                pass
        conv = self.convs[i]
        return pa.array([conv(v) for v in raw], type=typ)

    def from_avro(self, docs: list) -> Any:
        """Rows Avro decoded: their values are the columns' Python types already (Avro's
        resolution made them the reader schema's), so only maps need Arrow's form."""
        pa = self.pa
        try:
            # the rows as one struct array: Arrow reads the dicts in C++, where a list per
            # column built in Python cost more than fastavro's decoding (make bench-avro)
            rows = pa.array(docs, type=self.pa_struct)
            return pa.RecordBatch.from_arrays(rows.flatten(), schema=self.pa_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            pass  # maps (Arrow wants pairs), or a value Arrow does not take as it is
        cols = []
        for i, n in enumerate(self.names):
            raw = [d.get(n) for d in docs]
            try:
                cols.append(pa.array(raw, type=self.pa_schema.field(i).type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                conv = _avro_items(self.schema.fields[i].dataType)
                cols.append(pa.array([conv(v) for v in raw],
                                     type=self.pa_schema.field(i).type))
        return pa.RecordBatch.from_arrays(cols, schema=self.pa_schema)

    def from_dicts(self, docs: list) -> Any:
        if self.decoder is not None:
            # rows of a table or changelog read from Avro: typed already, not JSON values
            return self.from_avro(docs)
        cols = [self.column(i, [d.get(n) for d in docs]) for i, n in enumerate(self.names)]
        return self.pa.RecordBatch.from_arrays(cols, schema=self.pa_schema)

    @staticmethod
    def parse(value: bytes) -> dict:
        try:
            d = json.loads(value)
        except ValueError:
            return {}
        return d if type(d) is dict else {}

    def from_values(self, values: list[bytes]):
        if self.fmt == "string":
            pa = self.pa
            text = [v.decode("utf-8", "replace") for v in values]
            cols = [pa.array(text, type=self.pa_schema.field(0).type)]
            cols += [pa.nulls(len(values), type=self.pa_schema.field(i).type)
                     for i in range(1, len(self.names))]
            return pa.RecordBatch.from_arrays(cols, schema=self.pa_schema)
        if self.arrow_json:
            batch = self._arrow_parse(values)
            if batch is not None:
                return batch
        parse = self.parse
        return self.from_dicts([parse(v) for v in values])

    def _arrow_parse(self, values: list[bytes]):
        """Parse a chunk with Arrow's JSON reader (C++, ~10x faster than json.loads).

        Only when every value looks like one JSON object; any parse or type error, or a row
        count that differs from the number of values, returns None (use the Python path).
        """
        if not values or not all(v[:1] == b"{" and v[-1:] == b"}" for v in values):
            return None
        # pyarrow loads with the first batch read as Arrow (start-up time)
        import pyarrow.json as pj

        pa = self.pa
        data = b"\n".join(values)
        try:
            table = pj.read_json(
                io.BytesIO(data),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1),
                parse_options=pj.ParseOptions(explicit_schema=self.pa_schema,
                                              unexpected_field_behavior="ignore"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        if table.num_rows != len(values):
            return None
        table = table.combine_chunks()
        cols = []
        for i, name in enumerate(self.names):
            col = table.column(name)
            arr = col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)
            want = self.pa_schema.field(i).type
            if arr.type != want:
                arr = arr.cast(want)
            cols.append(arr)
        self.arrow_json_hits += 1
        return pa.RecordBatch.from_arrays(cols, schema=self.pa_schema)


# --------------------------------------------------------------------------- reading

def _consume(opts: SourceOptions, rng: KafkaRange, start: int, end: int) -> Iterator[list]:
    """Yield lists of confluent-kafka Messages of one partition in [start, end).

    Control records, tombstones excepted here: the caller filters. Stops at ``end`` even when
    the last offsets are transaction markers or aborted records (partition EOF tells).
    """
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    if start >= end:
        return
    c = Consumer(opts.consumer_conf())
    try:
        c.assign([TopicPartition(rng.topic, rng.partition, start)])
        pos = start
        last_progress = time.monotonic()
        while pos < end:
            # Returns as soon as the rest of the range (or a chunk) is in, or an EOF event.
            try:
                msgs = c.consume(num_messages=max(1, min(_CHUNK, end - pos)), timeout=0.5)
            except KafkaException as e:
                raise SourceError(f"{NAME}: cannot read the partition: {e}", topic=rng.topic,
                                  partition=rng.partition, expected=f"records [{start}, {end})",
                                  found=f"an error at offset {pos}") from e
            out = []
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if m.offset() is not None and m.offset() >= 0:
                            pos = max(pos, m.offset())
                        continue
                    if retryable(err):
                        continue
                    raise SourceError(f"{NAME}: cannot read the partition: {err.str()}",
                                      topic=rng.topic, partition=rng.partition,
                                      expected=f"records [{start}, {end})",
                                      found=f"an error at offset {pos}")
                off = m.offset()
                if off >= end:
                    pos = end
                    break
                pos = off + 1
                out.append(m)
            if out:
                yield out
            if msgs:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > opts.read_timeout:
                raise SourceError(
                    f"{NAME}: no progress for {opts.read_timeout:.0f} s (readTimeoutSeconds)",
                    topic=rng.topic, partition=rng.partition,
                    expected=f"records [{start}, {end})", found=f"nothing from offset {pos}")
    finally:
        c.close()


def _is_control(m) -> bool:
    h = m.headers()
    if not h:
        return False
    return any(k == _CONTROL_KEY for k, _ in h)


def _avro_items(dt: DataType):
    """A decoded Avro value -> what pyarrow takes for ``dt``: maps as (key, value) pairs."""
    if isinstance(dt, MapType):
        vc = _avro_items(dt.valueType)
        return lambda v: None if v is None else [(k, vc(x)) for k, x in v.items()]
    if isinstance(dt, ArrayType):
        ec = _avro_items(dt.elementType)
        return lambda v: None if v is None else [ec(x) for x in v]
    if isinstance(dt, StructType):
        fs = [(f.name, _avro_items(f.dataType)) for f in dt.fields]
        return lambda v: None if v is None else {n: c(v.get(n)) for n, c in fs}
    return lambda v: v


def _read_avro_range(builder: _ArrowBuilder, rng: KafkaRange, opts: SourceOptions,
                     start: int, end: int):
    decode = builder.decoder.decode
    docs: list[dict] = []
    for msgs in _consume(opts, rng, start, end):
        for m in msgs:
            if _is_control(m):
                continue
            v = m.value()
            if v is None:
                continue
            docs.append(decode(v, rng.partition, m.offset()))
        if len(docs) >= _CHUNK:
            yield builder.from_avro(docs)
            docs = []
    if docs:
        yield builder.from_avro(docs)


def _read_stream_range(opts: SourceOptions, builder: _ArrowBuilder, rng: KafkaRange,
                       start: int, end: int):
    if builder.decoder is not None:
        yield from _read_avro_range(builder, rng, opts, start, end)
        return
    buf: list[bytes] = []
    size = 0
    for msgs in _consume(opts, rng, start, end):
        for m in msgs:
            if _is_control(m):
                continue
            v = m.value()
            if v is None:
                continue
            buf.append(v)
            size += len(v)
        if len(buf) >= _CHUNK or size >= _CHUNK_BYTES:
            yield builder.from_values(buf)
            buf = []
            size = 0
    if buf:
        yield builder.from_values(buf)


#: the columns a ``changelog`` source adds last to its rows
DELETED_COLUMN = "_theseus_deleted"
OFFSET_COLUMN = "_theseus_offset"


def _read_changelog_range(opts: SourceOptions, builder: _ArrowBuilder, rng: KafkaRange,
                          start: int, end: int):
    """Every record of [start, end) as an upsert of its key (a tombstone: a deletion)."""
    docs: list[dict] = []
    for msgs in _consume(opts, rng, start, end):
        for m in msgs:
            if _is_control(m):
                continue
            doc = _record_doc(builder, m)
            res = _key_of(opts, m, doc)
            if res is None:
                continue  # neither a key nor a value says which row this is
            _ident, kd = res
            row = dict(doc) if doc is not None else {}
            for k in opts.key_columns:
                if k not in row and k in kd:
                    row[k] = kd[k]
            row[DELETED_COLUMN] = doc is None
            row[OFFSET_COLUMN] = m.offset()
            docs.append(row)
        if len(docs) >= _CHUNK:
            yield builder.from_dicts(docs)
            docs = []
    if docs:
        yield builder.from_dicts(docs)


def _record_doc(builder: _ArrowBuilder, m) -> dict | None:
    """A record's value as a row (None: a tombstone)."""
    v = m.value()
    if v is None:
        return None
    if builder.decoder is not None:
        return builder.decoder.decode(v, m.partition(), m.offset())
    return builder.parse(v) if builder.fmt == "json" else \
        {builder.names[0]: v.decode("utf-8", "replace")}


def _key_of(opts: SourceOptions, m, doc: dict | None) -> tuple | None:
    """Identity of a record's key for table role: values of key_columns as JSON text."""
    raw = m.key()
    kd = None
    if raw is not None and opts.avro_key:
        kd = _key_decoder(opts).decode(raw, m.partition(), m.offset())
    elif raw is not None:
        try:
            kd = json.loads(raw)
        except ValueError:
            kd = None
        if not isinstance(kd, dict):
            if len(opts.key_columns) == 1:
                kd = {opts.key_columns[0]: kd if kd is not None else raw.decode("utf-8", "replace")}
            else:
                kd = None
    if kd is None:
        kd = doc
    if kd is None:
        return None
    return tuple(json.dumps(kd.get(k), sort_keys=True, separators=(",", ":"))
                 for k in opts.key_columns), kd


_KEY_DECODERS: dict[tuple, Any] = {}


def _key_decoder(opts: SourceOptions) -> Any:
    """The decoder of an ``avroKey`` source's record keys (one per topic and registry in a
    worker): each key read with its own writer schema, whatever its record's name; the
    key columns are then its fields by name."""
    k = (opts.topic, opts.registry, opts.registry_conf)
    dec = _KEY_DECODERS.get(k)
    if dec is None:
        from compat.registry import PREFIX, RegistryClient
        from gates.avro import AvroDecoder

        client = RegistryClient.configured(opts.registry, {
            PREFIX + n: v for n, v in opts.registry_conf})
        assert client is not None  # options parsing requires the URL
        dec = _KEY_DECODERS[k] = AvroDecoder(opts.topic, None, client)
    return dec


def _read_table_partition(opts: SourceOptions, builder: _ArrowBuilder, rng: KafkaRange):
    parts = [rng.partition]
    start = _list_offsets(opts, parts, "earliest")[rng.partition]
    end = _list_offsets(opts, parts, "latest")[rng.partition]
    latest: dict[tuple, dict] = {}
    for msgs in _consume(opts, rng, start, end):
        for m in msgs:
            if _is_control(m):
                continue
            doc = _record_doc(builder, m)
            res = _key_of(opts, m, doc)
            if res is None:
                continue
            ident, kd = res
            if doc is None:
                latest.pop(ident, None)
                continue
            for k in opts.key_columns:
                if k not in doc and k in kd:
                    doc[k] = kd[k]
            latest.pop(ident, None)  # re-insert: output in order of last update
            latest[ident] = doc
    docs = list(latest.values())
    for i in range(0, len(docs), _CHUNK):
        yield builder.from_dicts(docs[i:i + _CHUNK])


# --------------------------------------------------------------------------- readers

def _reader_name(opts: SourceOptions) -> str:
    """This source's name in its query's acknowledgements (:func:`gates.state.write_ack`
    refuses an acknowledgement that goes back against the same name, which must therefore
    be stable across restarts and differ between two sources of one plan reading the same
    topic, as a self-join does): the ``node`` option, else the topic when the query's plan
    (``<store>/queries/<query>/plan.json``, as ``theseus run`` records it) reads the topic
    through one stream source only, else a name of this reader alone (its acknowledgements
    are then checked against its own only)."""
    if opts.node:
        return opts.node
    if opts.store and opts.query:
        try:
            doc = json.loads((Path(opts.store) / "queries" / opts.query / "plan.json")
                             .read_text(encoding="utf-8"))
            readers = [n for n in doc.get("nodes", []) if isinstance(n, dict) and
                       n.get("step") == "source" and n.get("topic") == opts.topic and
                       n.get("role", "stream") == "stream"]
            if len(readers) == 1:
                return opts.topic
        except (OSError, ValueError, AttributeError):
            pass
    return f"{opts.topic}#{uuid.uuid4().hex[:12]}"


class TheseusKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions, schema: StructType):
        self.opts = opts
        self.schema = schema
        self._target: dict[int, int] | None = None  # availableNow end
        self._last_ack: tuple | None = None
        self._reader = _reader_name(opts)
        # ``backfillBatches``: the head found at the first batch, and the offsets per batch
        # until it is reached
        self._backfill: tuple[dict[int, int], int] | None = None
        self._lifted: int | None = None  # the gate epoch last said to be lifted

    # -- driver side
    def initialOffset(self) -> dict:
        parts = _kafka_partitions(self.opts)
        which = "latest" if self.opts.starting == "latest" else "earliest"
        return _to_offset(self.opts.topic, _list_offsets(self.opts, parts, which))

    def getDefaultReadLimit(self):
        if self.opts.max_records > 0 and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_records)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        parts = _kafka_partitions(self.opts)
        self._target = _list_offsets(self.opts, parts, "latest")

    def _gate(self) -> GateState | None:
        if not (self.opts.store and self.opts.query):
            return None
        try:
            return read_gate(self.opts.store, self.opts.query)
        except (GateStateError, OSError) as e:
            print(f"{NAME}: unreadable gate state, treating as paused: {e}", file=sys.stderr)
            return GateState(mode="paused", epoch=-1)

    def _ack(self, state: GateState | None, start: dict[int, int]) -> None:
        if state is None:
            return
        key = (tuple(sorted(start.items())), state.mode, state.epoch,
               tuple(sorted(state.cap.get(self.opts.topic, {}).items())))
        if key == self._last_ack:
            return
        write_ack(self.opts.store, self.opts.query, self.opts.topic, start, state,
                  reader=self._reader)
        self._last_ack = key

    def _unless_lifted(self, state: GateState) -> GateState:
        """A pause or cap held by a migration's lease holds only while the lease does
        (:mod:`gates.lease`): a dead or hung migrator never stalls the output for longer
        than its lease's TTL.  Said once per gate epoch, in the query's log."""
        why = lifted(self.opts.store, state)
        if why is None:
            return state
        if self._lifted != state.epoch:
            self._lifted = state.epoch
            print(f"{NAME}: '{self.opts.query}' reads {self.opts.topic} on: its gate "
                  f"({state.mode}, epoch {state.epoch}) is lifted, {why}", file=sys.stderr)
        return OPEN

    def _pass_cut(self, state: GateState, begin: dict[int, int]) -> GateState:
        """Under a cap with ``follow`` (a shadow at the cut): once every topic of this query
        stands at the cap, read on past it. The start gate holds the output of the batch
        that starts at the cut until the followed (old) query has finished the input before
        it; computing that batch meanwhile is what makes the switch quick."""
        topic = self.opts.topic
        if any(begin.get(p, 0) < o for p, o in state.cap.get(topic, {}).items()):
            return state
        others = {t: c for t, c in state.cap.items() if t != topic}
        if others and not is_acked(self.opts.store, self.opts.query, others):
            return state
        return OPEN

    def latestOffset(self, start: dict, limit) -> dict:
        topic = self.opts.topic
        begin = _from_offset(topic, start)
        state = self._gate()
        # Spark asks for a new batch only after the previous one is committed (sink included):
        # everything below `start` is done. Acknowledge it before deciding what to admit.
        self._ack(state, begin)
        if state is not None and state.lease:
            state = self._unless_lifted(state)
        if state is not None and state.mode == "capped" and state.follow:
            state = self._pass_cut(state, begin)
        parts = _kafka_partitions(self.opts)
        newp = [p for p in parts if p not in begin]
        if newp:  # partitions added since the checkpoint: from their earliest offset
            begin.update(_list_offsets(self.opts, newp, "earliest"))
        if self._target is not None:
            latest = dict(self._target)
            for p in parts:
                latest.setdefault(p, begin[p])
        else:
            latest = _list_offsets(self.opts, parts, "latest")
        end = {}
        for p in sorted(begin):
            bound = latest.get(p, begin[p])
            if state is not None:
                cap = state.limit(topic, p)
                if cap is not None:
                    bound = min(bound, cap)
            end[p] = max(begin[p], bound)
        budget = int(limit.max_rows) if ReadMaxRows is not None and \
            isinstance(limit, ReadMaxRows) else None
        step = self._backfill_step(begin, latest)
        if step is not None:
            budget = step if budget is None else min(budget, step)
        if budget is not None:
            take = spread_limit({p: end[p] - begin[p] for p in end}, budget)
            end = {p: begin[p] + take[p] for p in end}
        unchanged = end == begin and not newp
        if state is not None and not unchanged and state.mode == "capped" and \
                topic in state.cap and all(end.get(p, 0) >= c
                                           for p, c in state.cap[topic].items()):
            write_pending(self.opts.store, self.opts.query, topic, end, state,
                          reader=self._reader)
        elif state is not None:
            drop_pending(self.opts.store, self.opts.query, topic)
        if unchanged:
            return start  # same JSON as Spark's start
        return _to_offset(topic, end)

    def _backfill_step(self, begin: Mapping[int, int], latest: Mapping[int, int]
                       ) -> int | None:
        """The offsets this batch may read while a shadow reads its history
        (``backfillBatches``), None once it reached the head it found at its first batch
        (or when off): one batch of the whole history would leave its acknowledgements, and
        the progress a migration shows from them, at 0% until it ends."""
        n = self.opts.backfill_batches
        if n <= 0:
            return None
        if self._backfill is None:
            backlog = sum(max(0, latest.get(p, b) - b) for p, b in begin.items())
            self._backfill = (dict(latest), max(BACKFILL_FLOOR, -(-backlog // n)))
        head, step = self._backfill
        if all(begin.get(p, 0) >= o for p, o in head.items()):
            return None
        return step

    def reportLatestOffset(self):
        try:
            parts = _kafka_partitions(self.opts)
            return _to_offset(self.opts.topic, _list_offsets(self.opts, parts, "latest"))
        except Exception:  # status reporting only
            return None

    def partitions(self, start: dict, end: dict):
        topic = self.opts.topic
        s, e = _from_offset(topic, start), _from_offset(topic, end)
        return [KafkaRange(topic, p, s.get(p, 0), e[p]) for p in sorted(e)
                if e[p] > s.get(p, 0)]

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        _ADMINS.clear()

    # -- executor side
    def read(self, partition: KafkaRange):
        builder = _ArrowBuilder(self.schema, self.opts.format, self.opts)
        if self.opts.role == "changelog":
            yield from _read_changelog_range(self.opts, builder, partition,
                                             partition.start, partition.end)
            return
        yield from _read_stream_range(self.opts, builder, partition,
                                      partition.start, partition.end)


class BackfillStreamReader(TheseusKafkaStreamReader):
    """The downstream shadow's source of a cascade (:mod:`gates.cascade`): the upstream
    shadow's side topic first, up to where its output before the upstream's cut ends; then
    the real topic from the propagated cut (the control events of the upstream's hand-over).

    Offsets name both topics (side first).  The real topic enters them with a batch that
    reads the side topic's tail and an empty range of the real topic, so every batch of the
    real topic starts at or beyond the cut.  Before the switch the side topic's position is
    acknowledged under its own name; the gate's cap, which is about the real topic, does not
    bound the side topic."""

    def __init__(self, opts: SourceOptions, schema: StructType, switch: dict):
        super().__init__(opts, schema)
        self.side = str(switch["side"])
        self.side_opts = dataclasses.replace(opts, topic=self.side, partitions=None)
        self._side_reader = f"{self._reader}@{self.side}"

    def _backfill_step(self, begin: Mapping[int, int], latest: Mapping[int, int]
                       ) -> int | None:
        # its history is the side topic, read as before; the real topic from the cut must
        # not be split: each batch of the hand-over adds to the chain's stall
        return None

    def _switch(self) -> dict:
        try:
            return read_switch(self.opts.store, self.opts.query, self.opts.topic) or {}
        except GateStateError as e:  # read again at the next trigger
            print(f"{NAME}: {e.render()}", file=sys.stderr)
            return {}

    def initialOffset(self) -> dict:
        parts = _kafka_partitions(self.side_opts)
        first = _list_offsets(self.side_opts, parts, "earliest")
        first.update({p: o for p, o in self._switch().get("side_from", {}).items()
                      if p in first})
        return _to_offset(self.side, first)

    def latestOffset(self, start: dict, limit) -> dict:
        topic, side = self.opts.topic, self.side
        if topic in start:  # switched: the real topic, read as the plain reader reads it
            res = super().latestOffset({topic: start[topic]}, limit)
            if res == {topic: start[topic]}:
                return start
            return {side: start[side], topic: res[topic]}
        begin = _from_offset(side, start)
        state = self._gate()
        if state is not None:
            write_ack(self.opts.store, self.opts.query, side, begin, state,
                      reader=self._side_reader)
        sw = self._switch()
        until, at = sw.get("side_end"), sw.get("at")
        if until is not None and at is not None and \
                all(begin.get(p, 0) >= o for p, o in until.items()):
            # The side topic is done: the real topic enters at the propagated cut, with
            # nothing read of it in this batch.
            return {side: start[side], topic: _to_offset(topic, at)[topic]}
        parts = _kafka_partitions(self.side_opts)
        latest = _list_offsets(self.side_opts, parts, "latest")
        end = {}
        for p in sorted(set(begin) | set(parts)):
            b = begin.get(p, 0)
            bound = latest.get(p, b)
            if until is not None:
                bound = min(bound, until.get(p, b))
            end[p] = max(b, bound)
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            take = spread_limit({p: end[p] - begin.get(p, 0) for p in end},
                                int(limit.max_rows))
            end = {p: begin.get(p, 0) + take[p] for p in end}
        if until is not None and at is not None and \
                all(end.get(p, begin.get(p, 0)) >= o for p, o in until.items()):
            # This batch reads the side topic's tail: the real topic enters with it, at the
            # cut, so the next batch already reads the new upstream's output (a batch of its
            # own for the entry would cost the chain's stall a trigger)
            return {side: _to_offset(side, end)[side], topic: _to_offset(topic, at)[topic]}
        if end == begin:
            return start
        return _to_offset(side, end)

    def reportLatestOffset(self):
        return None

    def partitions(self, start: dict, end: dict):
        out = []
        for t in (self.side, self.opts.topic):
            e = _from_offset(t, end) if t in end else {}
            # the real topic enters at the cut: nothing before it is read
            s = _from_offset(t, start) if t in start else e
            out += [KafkaRange(t, p, s.get(p, 0), o) for p, o in sorted(e.items())
                    if o > s.get(p, 0)]
        return out


class TheseusKafkaBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType):
        self.opts = opts
        self.schema = schema

    def partitions(self):
        return [KafkaRange(self.opts.topic, p, None, None) for p in _kafka_partitions(self.opts)]

    def read(self, partition: KafkaRange):
        builder = _ArrowBuilder(self.schema, self.opts.format, self.opts)
        if self.opts.role in ("table", "changelog"):
            yield from _read_table_partition(self.opts, builder, partition)
            return
        parts = [partition.partition]
        start = _list_offsets(self.opts, parts, "earliest")[partition.partition]
        end = _list_offsets(self.opts, parts, "latest")[partition.partition]
        yield from _read_stream_range(self.opts, builder, partition, start, end)


class TheseusKafkaSource(DataSource):
    """``spark.readStream.format("theseus_kafka")`` (role stream) /
    ``spark.read.format("theseus_kafka")`` (role table, or a one-off read of a stream topic)."""

    def __init__(self, options):
        super().__init__(options)
        self.opts = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return self.opts.schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return TheseusKafkaBatchReader(self.opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.opts.role == "table":
            raise SourceError(f"{NAME}: a 'table' source is read with spark.read (latest "
                              "value per key), not spark.readStream", topic=self.opts.topic)
        if self.opts.store and self.opts.query and self.opts.role == "stream":
            switch = read_switch(self.opts.store, self.opts.query, self.opts.topic)
            if switch is not None:  # a downstream shadow of a cascade
                return BackfillStreamReader(self.opts, schema, switch)
        return TheseusKafkaStreamReader(self.opts, schema)


def register(spark) -> None:
    """Register the ``theseus_kafka`` data source with a SparkSession (idempotent)."""
    spark.dataSource.register(TheseusKafkaSource)
