"""Plan -> Spark: builds the Structured Streaming query a plan describes.

The same plan always builds the same query: nodes are built once each (a node feeding two
consumers is one DataFrame), in the plan's topological order, and Spark numbers stateful
operators by the shape of the logical plan, which only the graph decides.  Expressions reach
Spark only after ``compat`` validated them (syntax, columns, types, no Java-calling
functions); ``F.expr`` is then given the user's text, never anything built from it by string
formatting except qualified column names.

Each step type registers how it is built with ``build_step`` (``functools.singledispatch``
on the step class) in its module of this package.

Retractions (Flink's changelog modes): a filter over an upsert stream does not drop a row
that stops matching; it marks it ``_theseus_op = 'D'`` so the sink writes a tombstone for its
key.  ``top_n`` emits the same marker for rows that fall out of the top.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import singledispatch
from typing import Any

from compat.errors import RuntimeFailure
from compat.infer import NodeInfo
from compat.model import Node, Plan
from compat.steps import Recursive, Sink
from compat.steps.sink import written_key

OP = "_theseus_op"  # 'U' (insert or update) or 'D' (retract the row's key)
SOURCE_FORMAT = "theseus_kafka"
#: the state store transformWithState (a changelog's operators) needs
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Spark 4's check that every state store of a stateful query committed in each batch of a
#: foreachBatch sink.  The gated sink skips a batch's DataFrame on purpose: a batch replayed
#: after a crash whose output the sink had committed (its state stores committed before the
#: sink wrote), and each batch after a migration's cut once the query handed its output over.
#: With the check on, either fails the query with STATE_STORE_COMMIT_VALIDATION_FAILED (a
#: cascade test's old query did, at its cut, once in two runs); the sink itself reads every
#: partition of every batch it writes.
COMMIT_VALIDATION = "spark.sql.streaming.stateStore.commitValidation.enabled"

#: how a plan with recursive steps starts: a chain of queries, which
#: ``migrate.build.recursive`` (built on this module) registers
_CHAIN_STARTS: list[Callable[[Builder], Any]] = []


def register_chain_start(start: Callable[[Builder], Any]) -> None:
    """Make ``start(builder)`` how :meth:`Builder.start` starts a plan with recursion."""
    _CHAIN_STARTS.append(start)


def sink_key(b: Builder) -> list[str]:
    """The columns of the record key the gated sink writes, in order: ``key_columns``, and
    for a version 2 sink over a windowed output the window last (the ``window`` column, its
    JSON object ``{"start": ..., "end": ...}``, or the bounds of it the output carries).  A
    version 1 sink keeps its bytes: ``key_columns`` alone."""
    sink = b.plan.sink
    assert isinstance(sink, Sink)
    return list(written_key(sink, b.plan.info[sink.id]))


@dataclass
class BuildOptions:
    bootstrap: str
    store: str | None = None
    query: str | None = None  # name used for gate state and transactional ids
    max_records_per_batch: int = 100_000
    #: a migration's shadow reads its history in about this many batches
    #: (``gates.source``'s ``backfillBatches``); 0: as fast as maxRecordsPerBatch allows
    backfill_batches: int = 0
    available_now: bool = False
    trigger_interval: str = "1 second"
    checkpoint: str | None = None
    start_gate: Any = None  # passed to the sink writer (a later issue opens and closes it)
    output_topic: str | None = None  # override (comparison runs write elsewhere)
    shadow_topic: str | None = None  # where a closed start gate sends output (--compare)
    on_retire: Any = None  # called once the query handed its output over to a migration
    reconciler: Any = None  # a reconciling shadow's (gates.reconcile.Reconciler)
    # librdkafka settings of every client (``--kafka-config``); None: the process's
    kafka_conf: dict[str, str] | None = None

    def kafka(self) -> dict[str, str]:
        from gates.kafkaconf import active

        return dict(active() if self.kafka_conf is None else self.kafka_conf)

    def registry(self) -> dict[str, str]:
        """The schema registry client's ``schema.registry.*`` settings (``--kafka-config``)."""
        from gates.kafkaconf import registry_settings

        return registry_settings()


def q(name: str) -> str:
    """A column name quoted for Spark."""
    return "`" + name.replace("`", "``") + "`"


def ddl(columns: tuple[tuple[str, str], ...], names: tuple[str, ...]) -> str:
    return ", ".join(f"{q(n)} {t.upper() if '<' not in t else t}"
                     for n, (_, t) in zip(names, columns))


@singledispatch
def build_step(node: Node, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    """The DataFrame of ``node`` from its inputs' DataFrames.  Every step type registers its
    own (``@build_step.register``)."""
    raise RuntimeFailure(f"no Spark builder is registered for step '{node.step}'",
                         file=b.plan.file, node=node.id, pointer=b.plan.pointer(node.id))


class Builder:
    def __init__(self, spark: Any, plan: Plan, opts: BuildOptions) -> None:
        if not plan.info:
            from compat.infer import analyze
            analyze(plan)
        self.spark = spark
        self.plan = plan
        self.opts = opts
        self.frames: dict[str, Any] = {}
        self._legacy_state: bool | None = None
        from pyspark.sql import functions as F  # noqa: N812

        self.F = F
        from gates.source import register

        register(spark)

    # -- entry points -------------------------------------------------------------------
    def dataframe(self, node_id: str | None = None) -> Any:
        """The DataFrame of a node (the rows the sink writes when ``node_id`` is None)."""
        target = node_id or self.plan.sink_id
        for nid, node in self.plan.nodes.items():
            if nid in self.frames:
                continue
            self.frames[nid] = self._build(node)
            if nid == target:
                break
        return self.frames[target]

    def _on_done(self) -> Any:
        """After each committed batch: acknowledge a cap the batch reached (gates.state);
        when that hands the output over to a migration, tell the host (``on_retire``)."""
        store, query, on_retire = self.opts.store, self.opts.query, self.opts.on_retire
        if not (store and query):
            return None
        from gates.state import promote_pending, retired

        def done(batch_id: int) -> None:
            # only a batch that reached a cap can have handed the output over
            if promote_pending(store, query) and on_retire is not None and \
                    retired(store, query):
                on_retire()

        return done

    def _retired(self) -> Any:
        store, query = self.opts.store, self.opts.query
        if not (store and query):
            return None
        from gates.state import retired

        return lambda: retired(store, query)

    def _avro_encode(self, key: bool = False) -> Any:
        """An Avro sink's encoder of its values (``key``: of its record keys, with
        ``avro.key``): its schema registered (or found) under its subject now, before the
        query writes (None for JSON and string sinks, and for JSON keys)."""
        sink = self.plan.sink
        if sink.format != "avro" or (key and not (sink.avro and sink.avro.key)):
            return None
        from compat import avro as A
        from compat.registry import RegistryClient, RegistryError
        from compat.steps.sink import (
            avro_key_schema,
            avro_key_subject,
            avro_schema,
            avro_subject,
        )
        from gates.avro import JsonToAvro

        info = self.plan.info[sink.id]
        if key and self.opts.reconciler is not None:
            # the reconciliation matches the output's keys read back against the new
            # plan's JSON keys: Avro keys would never match
            raise RuntimeFailure("a reconciling migration cannot yet correct an output "
                                 "whose record keys are Avro", file=self.plan.file,
                                 node=sink.id, pointer=self.plan.pointer(sink.id, "avro/key"),
                                 expected="avro.key false, or a migration without "
                                 "reconciliation", found="avro.key true")
        client = RegistryClient.configured(None, self.opts.registry())
        if client is None:
            raise RuntimeFailure(f"sink '{sink.id}' writes Avro, and no schema registry is "
                                 "named", file=self.plan.file, node=sink.id,
                                 pointer=self.plan.pointer(sink.id, "format"),
                                 expected="SCHEMA_REGISTRY_URL, or schema.registry.url in "
                                 "--kafka-config", found="neither")
        # the subject of the topic really written: a comparison run (theseus prove) must
        # not register the new plan's schema under the production topic's subject
        subject = (avro_key_subject if key else avro_subject)(
            sink, info, self.opts.output_topic or sink.topic)
        schema = (avro_key_schema if key else avro_schema)(sink, info)
        try:
            return JsonToAvro(subject, A.canonical(schema), client)
        except RegistryError as e:
            raise RuntimeFailure(f"cannot register the output's schema under subject "
                                 f"'{subject}': {e.message}", file=self.plan.file,
                                 node=sink.id, pointer=self.plan.pointer(sink.id, "format"),
                                 expected=e.expected, found=e.found) from None

    def start(self) -> Any:
        """Start the streaming query writing to the sink; returns the StreamingQuery (a
        plan with recursive steps: a chain of queries that behaves as one)."""
        if any(isinstance(n, Recursive) for n in self.plan.nodes.values()):
            return _CHAIN_STARTS[-1](self)
        sink = self.plan.sink
        df = self.dataframe()
        from gates.sink import make_writer

        writer = make_writer(self.opts.bootstrap, self.opts.output_topic or sink.topic,
                             sink_key(self), self.opts.query or self.plan.query,
                             sink.delivery, start_gate=self.opts.start_gate,
                             shadow_topic=self.opts.shadow_topic, on_done=self._on_done(),
                             retired=self._retired(), reconciler=self.opts.reconciler,
                             producer_config=self.opts.kafka(), encode=self._avro_encode(),
                             encode_key=self._avro_encode(key=True))
        # A changelog's rows are all appended (signed: migrate.build.changelog); Spark
        # chains its stateful operators only in append mode.
        mode = "append" if self.plan.info[sink.id].changelog else sink.mode
        w = df.writeStream.queryName(self.opts.query or self.plan.query) \
            .outputMode(mode).foreachBatch(writer)
        if self.opts.checkpoint:
            w = w.option("checkpointLocation", self.opts.checkpoint)
        if self.opts.available_now:
            w = w.trigger(availableNow=True)
        else:
            w = w.trigger(processingTime=self.opts.trigger_interval)
        # Spark reads this one from the session at each batch, not from the query's copy
        # of the settings: it stays set (it only concerns foreachBatch sinks).
        self.spark.conf.set(COMMIT_VALIDATION, "false")
        if not self.plan.info[sink.id].changelog:
            return w.start()
        # A changelog's operators are transformWithState's, which need RocksDB; the query
        # takes its own copy of the session's settings when it starts.
        key = "spark.sql.streaming.stateStore.providerClass"
        before = self.spark.conf.get(key, None)
        self.spark.conf.set(key, ROCKSDB)
        try:
            return w.start()
        finally:
            if before is None:
                self.spark.conf.unset(key)
            elif before != ROCKSDB:
                self.spark.conf.set(key, before)

    def _build(self, node: Node) -> Any:
        try:
            return build_step(node, self, [self.frames[i] for i in node.inputs],
                              self.plan.info[node.id])
        except RuntimeFailure:
            raise
        except Exception as e:  # Spark's analysis errors, with the node they belong to
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RuntimeFailure(f"Spark cannot build this step: {msg}",
                                 file=self.plan.file, node=node.id,
                                 pointer=self.plan.pointer(node.id)) from None

    def state_name(self, node_id: str) -> str:
        """The state variable of ``node_id``'s changelog operator: named after what its
        state means (``compat.tws_state``), so that the checkpoint tells it.  A checkpoint
        that already holds changelog state under the old single name keeps that name: a
        running query restarts on its own state, never silently on empty state."""
        from compat import tws_state

        if self._legacy_state is None:
            self._legacy_state = tws_state.legacy_checkpoint(self.opts.checkpoint)
        return tws_state.LEGACY if self._legacy_state else \
            tws_state.state_name(self.plan, node_id)

    def watermarks_read(self) -> bool:
        """Whether a stateful step of the plan reads an event-time watermark: a window, a
        grouping key on a watermarked column, a stream-stream join, a deduplication, a
        top-N (any stateful step but a plain aggregate counts, to be safe). When none does,
        the sources' watermarks are left out: they would change no output, only make Spark
        run an empty batch each time a watermark advances with no new input (state
        eviction that has nothing to evict), taking CPU from the batches that carry data."""
        for nid, node in self.plan.nodes.items():
            if not self.plan.info[nid].stateful:
                continue
            if node.step != "aggregate" or node.window is not None:  # type: ignore[attr-defined]
                return True
            marks = self.plan.info[node.inputs[0]].watermarks
            if any(m in g.expr.lower() for g in node.group_by  # type: ignore[attr-defined]
                   for m in marks):
                return True
        return False
