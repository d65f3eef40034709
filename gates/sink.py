"""The gated Kafka sink, used through ``foreachBatch``.

    from gates.sink import make_writer
    fn = make_writer(bootstrap, "ship_load", ["ship_id"], "ship_load", "exactly_once")
    df.writeStream.foreachBatch(fn).option("checkpointLocation", ck).start()

Record format:

* key: JSON object of ``key_columns`` in the given order (``{"ship_id":"a"}``), or a null key
  when ``key_columns`` is empty. Keyed records are partitioned with ``murmur2_random`` (the
  Java client's partitioner), so Java/Kafka Streams/ksqlDB writers agree on the partition.
  A windowed output of a version 2 sink step is keyed by its window too: the builder lists
  the ``window`` column last (or the window's bounds the output carries, ``day`` for
  ``window.start AS day``), so the key ends with the window as the value writes it,
  ``{"page":"home","window":{"start":"2026-01-01T10:00:00.000000Z",
  "end":"2026-01-01T10:01:00.000000Z"}}`` (``compat.steps.sink.written_key``).
* value: JSON object of all columns in column order (nulls kept as ``null``), produced by
  Spark's ``to_json`` in the JVM. Timestamps are ISO-8601 in UTC with microseconds and ``Z``
  (``2024-01-01T00:00:00.000000Z``), ``timestamp_ntz`` the same without ``Z``, dates
  ``yyyy-MM-dd``. The gated source reads this format back.
* format avro (``encode``, a :class:`gates.avro.JsonToAvro`): the value is that JSON
  object written in the schema registry's wire format under the sink's writer schema,
  registered under its subject when the writer is made (before any batch); with
  ``avro.key`` (``encode_key``) the key's JSON object too, under the key's subject.
* an optional column ``_theseus_op``: rows where it equals ``'D'`` are written as tombstones
  (null value, same key); the column itself is never written.
* an optional column ``_theseus_sign`` (a changelog: ``+1`` a row enters the output, ``-1``
  it leaves): the batch's rows are summed per key and value, and each key gets one record,
  the value that is left with a positive count (the first seen if several are: the sink key
  is then not a key of the output, which the checker refuses for a changelog:
  ``NodeInfo.keys``), else, when a value of the key was retracted, a tombstone; a key whose
  changes cancel out gets none.  The column itself is never written.

Delivery:

* ``exactly_once``: one Kafka transaction per micro-batch, written from the driver, with
  ``transactional.id = theseus-<query>``. Inside the same transaction the sink commits the
  consumer-group offset of group ``theseus-<query>-sink`` on the output topic's partition 0,
  metadata = the batch id. Before writing a batch the sink reads that metadata and skips the
  batch if its id is <= the committed one (a batch Spark replays after a crash). ``query``
  must therefore be unique per running query instance: a shadow query needs its own id.
* ``at_least_once``: idempotent producer, flushed at the end of every batch.

Start gate: ``start_gate`` is None (open), a callable ``start_gate(batch_id) -> bool`` or an
object with ``is_open(batch_id) -> bool``. When closed, the batch is written to
``shadow_topic`` if one is given, else discarded; under ``exactly_once`` the batch id is
committed either way, so a replay after the gate opens is not written to the output.

Reconciliation (``reconciler``, a :class:`gates.reconcile.Reconciler`): the first batch a
reconciling shadow writes to the output carries, before its own rows and in its own
transaction, the corrections that make the compacted output the new plan over all input
before the cut (see :mod:`gates.reconcile`).

Errors are :class:`~compat.errors.SinkError` (one exception root), naming the query's output
topic and the batch.
"""
from __future__ import annotations

import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from compat.errors import SinkError
from gates.broker import client_conf
from gates.deadline import Deadline
from gates.reconcile import as_pairs, fault
from gates.retry import retry

OP_COLUMN = "_theseus_op"
SIGN_COLUMN = "_theseus_sign"
DELIVERIES = ("exactly_once", "at_least_once")
JSON_OPTIONS = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "dateFormat": "yyyy-MM-dd",
    "timeZone": "UTC",
    "ignoreNullFields": "false",
}


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def encode_batch(df, key_columns: Sequence[str], encode: Any = None,
                 encode_key: Any = None) -> tuple[list, list]:
    """Serialize a DataFrame into (keys, values) lists of str/None, computed in the JVM;
    an Avro sink's (``encode``, ``encode_key``: :class:`gates.avro.JsonToAvro`) as
    wire-format bytes straight from the batch's Arrow columns where its schema allows."""
    # PySpark loads with the first batch, not with the module (start-up time)
    from pyspark.sql import functions as F

    cols = [c for c in df.columns if c not in (OP_COLUMN, SIGN_COLUMN)]
    missing = [k for k in key_columns if k not in cols]
    if missing:
        raise SinkError("the sink's key columns are not all output columns",
                        expected=f"key columns among {cols}", found=f"missing {missing}")
    if encode is not None and hasattr(encode, "arrow"):
        done = _avro_batch(df, cols, key_columns, encode, encode_key)
        if done is not None:
            return done
    value = F.to_json(F.struct(*[F.col(_q(c)) for c in cols]), JSON_OPTIONS)
    if OP_COLUMN in df.columns:
        value = F.when(F.col(_q(OP_COLUMN)) == F.lit("D"), F.lit(None).cast("string")) \
            .otherwise(value)
    if key_columns:
        key = F.to_json(F.struct(*[F.col(_q(k)) for k in key_columns]), JSON_OPTIONS)
    else:
        key = F.lit(None).cast("string")
    if SIGN_COLUMN in df.columns:
        table = df.select(key.alias("k"), value.alias("v"), F.col(SIGN_COLUMN)).toArrow()
        return consolidate(table.column("k").to_pylist(), table.column("v").to_pylist(),
                           table.column(SIGN_COLUMN).to_pylist())
    table = df.select(key.alias("k"), value.alias("v")).toArrow()
    return table.column("k").to_pylist(), table.column("v").to_pylist()


def _avro_batch(df, cols: list[str], key_columns: Sequence[str], encode: Any,
                encode_key: Any) -> tuple[list, list] | None:
    """An Avro sink's batch encoded from its Arrow columns (no ``to_json``, no
    ``json.loads`` per row: bench/results/avro.md), or None where a column's type takes
    the JSON path.  The values, and Avro keys, are the bytes the JSON path writes."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    values_of = encode.arrow({c: types[c] for c in cols})
    keys_of = None
    if key_columns and encode_key is not None:
        keys_of = encode_key.arrow({k: types[k] for k in key_columns})
        if keys_of is None:
            return None
    if values_of is None:
        return None
    picked = [F.col(_q(c)) for c in cols]
    json_key = "__theseus_json_key"
    if key_columns and keys_of is None:
        # JSON keys stay Spark's to_json (the key's format is the JSON sink's)
        picked.append(F.to_json(F.struct(*[F.col(_q(k)) for k in key_columns]),
                                JSON_OPTIONS).alias(json_key))
    for extra in (OP_COLUMN, SIGN_COLUMN):
        if extra in df.columns:
            picked.append(F.col(extra))
    table = df.select(*picked).toArrow()
    deleted = None
    if OP_COLUMN in df.columns:
        deleted = [op == "D" for op in table.column(OP_COLUMN).to_pylist()]
    try:
        if deleted is not None and any(deleted):
            # a deleted row's value is a tombstone: never encoded (its columns may be null)
            import pyarrow as pa

            live = iter(values_of(table.filter(pa.array([not d for d in deleted]))))
            values: list = [None if d else next(live) for d in deleted]
        else:
            values = values_of(table)
        if keys_of is not None:
            keys: list = keys_of(table.select(list(key_columns)))
        elif key_columns:
            keys = table.column(json_key).to_pylist()
        else:
            keys = [None] * len(values)
    except (TypeError, ValueError, AttributeError, OverflowError, struct.error) as e:
        raise SinkError(f"a row of the batch does not fit the sink's Avro schema: "
                        f"{type(e).__name__}: {e}", expected="values of the Avro schema",
                        found="a value that is not") from None
    if SIGN_COLUMN in df.columns:
        return consolidate(keys, values, table.column(SIGN_COLUMN).to_pylist())
    return keys, values


def consolidate(keys: list, values: list, signs: list) -> tuple[list, list]:
    """A batch of signed rows as one record per key: upserts and tombstones (module doc)."""
    net: dict[tuple, int] = {}
    order: dict[Any, None] = {}
    for k, v, s in zip(keys, values, signs):
        net[(k, v)] = net.get((k, v), 0) + s
        order.setdefault(k, None)
    last: dict[Any, Any] = {}
    retracted: set = set()
    for (k, v), n in net.items():
        if n > 0:
            last[k] = v
        elif n < 0:
            retracted.add(k)
    out_k, out_v = [], []
    for k in order:
        if k in last:
            out_k.append(k)
            out_v.append(last[k])
        elif k in retracted:
            out_k.append(k)
            out_v.append(None)
    return out_k, out_v


class KafkaSink:
    """A ``foreachBatch`` function writing micro-batches to a Kafka topic (see module doc)."""

    def __init__(self, bootstrap: str, topic: str, key_columns: Sequence[str], query: str,
                 delivery: str, start_gate: Any = None, *, shadow_topic: str | None = None,
                 producer_config: Mapping[str, Any] | None = None,
                 hooks: Mapping[str, Callable[[int], None]] | None = None,
                 on_done: Callable[[int], None] | None = None,
                 retired: Callable[[], bool] | None = None,
                 reconciler: Any = None,
                 timeout: float = 120.0,
                 encode: Callable[[Any], bytes | None] | None = None,
                 encode_key: Callable[[Any], bytes | None] | None = None):
        if delivery not in DELIVERIES:
            raise SinkError("unknown sink delivery", topic=topic,
                            expected=" | ".join(DELIVERIES), found=repr(delivery))
        self.bootstrap = bootstrap
        self.topic = topic
        self.key_columns = list(key_columns or [])
        self.query = query
        self.delivery = delivery
        self.start_gate = start_gate
        self.shadow_topic = shadow_topic
        self.producer_config = dict(producer_config or {})
        self.hooks = dict(hooks or {})
        self.on_done = on_done  # after a batch is committed (or found already committed)
        # True once the query handed its output over to a migration (gates.state.retired)
        self.retired = retired
        self.reconciler = reconciler
        # format avro: JSON values -> wire-format Avro (gates.avro.JsonToAvro), else None
        self.encode = encode
        # avro.key: the key's JSON object -> a wire-format Avro record, else None
        self.encode_key = encode_key
        if reconciler is not None and hasattr(reconciler, "watch"):
            reconciler.watch()  # reads ahead from the pause on (gates.reconcile)
        self.timeout = timeout
        self.group = f"theseus-{query}-sink"
        self.transactional_id = f"theseus-{query}"
        self._producer = None
        self._consumer = None
        self._errors: list[str] = []
        self._known: tuple[int | None] | None = None  # last committed batch id, once known
        self.last_stats: dict[str, Any] = {}

    # ------------------------------------------------------------------ clients
    def _on_delivery(self, err, msg):  # only called for failures (delivery.report.only.error)
        if err is not None:
            self._errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    def _producer_conf(self) -> dict:
        conf = client_conf(self.bootstrap, **{
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1024 * 1024,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1024 * 1024,
            "partitioner": "murmur2_random",
            "delivery.report.only.error": True,
            "on_delivery": self._on_delivery,
            "message.timeout.ms": int(self.timeout * 1000),
        })
        if self.delivery == "exactly_once":
            conf["transactional.id"] = self.transactional_id
            conf["transaction.timeout.ms"] = int(max(self.timeout * 1000, 60000))
        conf.update(self.producer_config)
        return conf

    def producer(self):
        if self._producer is None:
            # librdkafka loads with the first call that reaches a broker (start-up time)
            from confluent_kafka import KafkaException, Producer

            p = Producer(self._producer_conf())
            if self.delivery == "exactly_once":
                # Fences an older instance and aborts its unfinished transaction.
                try:
                    p.init_transactions(self.timeout)
                except KafkaException as e:
                    raise SinkError(f"sink {self.query}: cannot start the transactional "
                                    f"producer '{self.transactional_id}': {e.args[0].str()}",
                                    topic=self.topic) from e
            self._producer = p
        return self._producer

    def consumer(self):
        if self._consumer is None:
            # librdkafka loads with the first call that reaches a broker (start-up time)
            from confluent_kafka import Consumer

            self._consumer = Consumer(client_conf(self.bootstrap, **{
                "group.id": self.group,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }))
        return self._consumer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.timeout)
            self._producer = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def committed_batch(self, *, cached: bool = False) -> int | None:
        """The last batch id committed by this sink (group metadata), or None.

        With ``cached``, the id this instance committed itself is trusted (its producer
        fences every other instance, so nobody else can have committed since).
        """
        if cached and self._known is not None:
            return self._known[0]
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import KafkaException, TopicPartition

        try:
            tp = retry(lambda timeout: self.consumer().committed(
                [TopicPartition(self.topic, 0)], timeout=timeout)[0],
                Deadline(self.timeout), f"the last committed batch id of group '{self.group}'",
                cap=self.timeout)
        except KafkaException as e:
            tp = SimpleNamespace(error=e.args[0].str() if e.args else e)
        if tp.error is not None:
            raise SinkError(f"sink {self.query}: cannot read the last committed batch id of "
                            f"group '{self.group}': {tp.error}", topic=self.topic,
                            partition=0)
        if tp.offset < 0 or not tp.metadata:
            return None
        try:
            done = int(tp.metadata)
        except ValueError:
            done = None
        self._known = (done,)
        return done

    # ------------------------------------------------------------------ writing
    def _gate_open(self, batch_id: int) -> bool:
        g = self.start_gate
        if g is None:
            return True
        if hasattr(g, "is_open"):
            return bool(g.is_open(batch_id))
        return bool(g(batch_id))

    def _produce(self, topic: str, keys: list, values: list) -> None:
        p = self.producer()
        produce, poll = p.produce, p.poll
        if self.encode is not None:
            values = [self.encode(v) for v in values]
        if self.encode_key is not None:
            keys = [self.encode_key(k) for k in keys]
        for k, v in zip(keys, values):
            while True:
                try:
                    produce(topic, v, k)
                    break
                except BufferError:
                    poll(0.05)

    def _open_now(self, batch_id: int) -> bool:
        """The start gate lets this batch out without waiting."""
        g = self.start_gate
        if g is None:
            return True
        if hasattr(g, "is_open"):
            return bool(g.is_open(batch_id, wait=False))
        return bool(g(batch_id))

    def _at_cut(self) -> bool:
        """The start gate holds this batch at the cut until the old query hands over."""
        g = self.start_gate
        return g is not None and hasattr(g, "at_cut") and bool(g.at_cut())

    def _hook(self, name: str, batch_id: int) -> None:
        fn = self.hooks.get(name)
        if fn is not None:
            fn(batch_id)

    def __call__(self, df, batch_id: int) -> None:
        t0 = time.monotonic()
        batch_id = int(batch_id)
        stats = {"batch_id": batch_id, "rows": 0, "skipped": False, "topic": self.topic}
        if self.delivery == "exactly_once":
            # Initialise the transactional producer first: it aborts a transaction left open
            # by a crashed predecessor, whose pending offset commit would otherwise keep the
            # read below waiting (read_committed offset fetches wait for stable offsets).
            self.producer()
            done = self.committed_batch(cached=True)
            if done is not None and batch_id <= done:
                stats.update(skipped=True, seconds=time.monotonic() - t0)
                self.last_stats = stats
                print(f"theseus sink {self.query}: batch {batch_id} already committed "
                      f"(last {done}), skipped", file=sys.stderr)
                if self.reconciler is not None:
                    self.reconciler.confirm(done)
                if self.on_done is not None:
                    self.on_done(batch_id)
                return
        if self.retired is not None and self.retired():
            # Handed over at a migration's cut: the new query writes the output from there.
            stats.update(skipped=True, retired=True, seconds=time.monotonic() - t0)
            self.last_stats = stats
            return
        early = None
        if self.shadow_topic is not None or self._at_cut():
            # Compute the batch before the start gate's wait: the batch from the cut is
            # then computed while the old query finishes its last batch before the cut,
            # and only written once that is committed. (Written anyway: to the output or
            # to the side topic.)
            early = encode_batch(df, self.key_columns, self.encode, self.encode_key)
        if self.reconciler is not None:
            # Read both topics while the old query finishes its last batch before the cut:
            # the hand-over then reads only the tail of the output.
            spec = self.reconciler.due(self.committed_batch(cached=True)
                                       if self.delivery == "exactly_once" else None)
            if spec is not None and self.reconciler.at_cut() and not self._open_now(batch_id):
                # (when the old query has handed over already, the corrections read the
                # tails at once: reading them here first would only double the work)
                self.reconciler.prefetch(spec)
        target = self.topic
        if not self._gate_open(batch_id):
            target = self.shadow_topic
            stats["gate"] = "closed"
        corrections: list | None = None
        if target == self.topic and self.reconciler is not None:
            committed = (self.committed_batch(cached=True)
                         if self.delivery == "exactly_once" else None)
            spec = self.reconciler.due(committed)
            if spec is not None:
                # Recorded before it is written: a host killed before the commit replays
                # this batch and computes the same corrections (nothing else wrote since).
                corrections, counts = self.reconciler.corrections(spec)
                self.reconciler.pending(spec, batch_id, counts)
                stats["reconciled"] = counts
        keys: list = []
        values: list = []
        if early is not None:
            if target is not None:
                keys, values = early
        elif target is not None:
            keys, values = encode_batch(df, self.key_columns, self.encode, self.encode_key)
        else:
            # Discarded output still has to be computed: a stateful plan's state stores
            # commit only when every partition of the batch runs.
            df.write.format("noop").mode("overwrite").save()
        stats["rows"] = len(values)
        stats["topic"] = target
        t1 = time.monotonic()
        if self.delivery == "exactly_once":
            self._write_transaction(target, keys, values, batch_id, corrections)
        else:
            self._write_plain(target, keys, values, batch_id, corrections)
        if corrections is not None:
            self.reconciler.committed()
        t2 = time.monotonic()
        stats.update(seconds=t2 - t0, encode_seconds=t1 - t0, produce_seconds=t2 - t1)
        self.last_stats = stats
        if self.on_done is not None:
            self.on_done(batch_id)

    def _produce_corrections(self, topic, corrections) -> None:
        """The reconciliation's corrections, before the batch's own rows (which win)."""
        ks, vs = as_pairs(corrections)
        self._produce(topic, ks, vs)
        fault("reconcile")  # tests: the host dies with the corrections written, uncommitted

    def _write_plain(self, topic, keys, values, batch_id, corrections=None) -> None:
        if topic is None or not (values or corrections):
            return
        self._errors.clear()
        p = self.producer()
        if corrections:
            self._produce_corrections(topic, corrections)
        self._produce(topic, keys, values)
        self._hook("before_commit", batch_id)
        left = p.flush(self.timeout)
        if left:
            raise SinkError(f"sink {self.query}: {left} record(s) of batch {batch_id} "
                            f"not delivered within {self.timeout:g} s", topic=topic)
        if self._errors:
            raise SinkError(f"sink {self.query}: batch {batch_id} delivery failed: "
                            + "; ".join(self._errors[:5]), topic=topic)
        self._hook("after_commit", batch_id)

    def _write_transaction(self, topic, keys, values, batch_id, corrections=None) -> None:
        for attempt in range(TXN_ATTEMPTS):
            try:
                return self._transaction(topic, keys, values, batch_id, corrections)
            except SinkError as e:
                if not isinstance(e, HungCall) or attempt == TXN_ATTEMPTS - 1:
                    raise
                # Nothing was committed (the commit comes after the call that hung): a new
                # producer with the same transactional id fences the stuck one and aborts
                # its transaction; the batch is written again, whole.
                print(f"theseus sink {self.query}: batch {batch_id}: {e.message}; "
                      "writing it again with a new producer", file=sys.stderr)

    def _transaction(self, topic, keys, values, batch_id, corrections=None) -> None:
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import TopicPartition

        self._errors.clear()
        p = self.producer()
        try:
            p.begin_transaction()
            if topic is not None and corrections:
                self._produce_corrections(topic, corrections)
            if topic is not None and values:
                self._produce(topic, keys, values)
            self._hook("before_commit", batch_id)
            offsets = [TopicPartition(self.topic, 0, batch_id + 1, str(batch_id))]
            # librdkafka's send_offsets_to_transaction can ignore its timeout and wait
            # forever when the group coordinator died and left the cluster's metadata
            # (confluentinc/librdkafka#5456, #5511; seen on the three-broker cluster):
            # bounded here, the producer is then given up (HungCall).
            bound = min(HUNG_CALL, self.timeout)
            meta = self.consumer().consumer_group_metadata()
            what = "the transaction's offset commit (send_offsets_to_transaction)"
            retry(lambda _: _bounded(
                lambda: p.send_offsets_to_transaction(offsets, meta, bound),
                bound + min(5.0, bound), what), Deadline(self.timeout), what,
                cap=self.timeout)
            retry(p.commit_transaction, Deadline(self.timeout), "the transaction's commit",
                  cap=self.timeout)
        except BaseException as e:
            self._known = None  # re-read from the broker next time
            self._abort(e)
            if isinstance(e, SinkError):
                raise
            raise SinkError(f"sink {self.query}: batch {batch_id} not written: {e}",
                            topic=topic) from e
        self._known = (batch_id,)
        if self._errors:  # cannot happen after a successful commit, but never hide it
            raise SinkError(f"sink {self.query}: batch {batch_id}: " + "; ".join(self._errors[:5]),
                            topic=topic)
        self._hook("after_commit", batch_id)

    def _abort(self, cause: BaseException) -> None:
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import KafkaException

        p = self._producer
        if p is None:
            return
        if isinstance(cause, HungCall):
            # busy in the call that hangs: any other call on it would conflict or hang too
            self._producer = None
            return
        fatal = isinstance(cause, KafkaException) and cause.args and cause.args[0].fatal()
        if not fatal:
            try:
                p.abort_transaction(self.timeout)
                return
            except KafkaException:
                pass
        self._producer = None  # re-created (and re-initialised, fencing) on the next batch


#: seconds a transaction's offset commit may take before its producer is given up
HUNG_CALL = 30.0
#: times one batch's transaction is tried, each with a new producer after a hung call
TXN_ATTEMPTS = 3


class HungCall(SinkError):
    """A librdkafka call that did not return within its bound (and its own timeout)."""


def _bounded(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """``fn()``, in a helper thread that is left behind when it does not return within
    ``seconds`` (raises :class:`HungCall`)."""
    done = threading.Event()
    out: dict[str, Any] = {}

    def call() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
            out["error"] = e
        finally:
            done.set()

    threading.Thread(target=call, daemon=True, name="theseus-sink-call").start()
    if not done.wait(seconds):
        raise HungCall(f"{what} did not return within {seconds:g} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def make_writer(bootstrap: str, topic: str, key_columns: Sequence[str], query: str,
                delivery: str, start_gate: Any = None, **kwargs) -> KafkaSink:
    """A ``foreachBatch`` function ``fn(df, batch_id)`` (a :class:`KafkaSink` instance).

    Keyword arguments: ``shadow_topic``, ``producer_config`` (librdkafka overrides),
    ``hooks`` (``{"before_commit"|"after_commit": fn(batch_id)}``, for tests and metrics),
    ``timeout`` (seconds for every Kafka wait, default 120).
    """
    return KafkaSink(bootstrap, topic, key_columns, query, delivery, start_gate, **kwargs)
