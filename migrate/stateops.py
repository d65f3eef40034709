"""The stateful operators a plan's Spark query would have, as Spark itself plans them.

A streaming DataFrame has no physical plan until it runs: Spark numbers its stateful
operators, computes their state schemas and partition counts only when it plans a
micro-batch (``IncrementalExecution``).  So the closest faithful way to learn them without
touching Kafka is a **dry run**: the plan is built by the same builders as ``theseus run``
(``migrate.build``), except that every source reads ``theseus_empty`` — a Python data
source with the source's exact schema and no rows — and the sink is Spark's ``noop``; one empty
micro-batch runs into a scratch checkpoint.  Planning that batch makes Spark write the
operator metadata and state schema files, which are then read back with the same reader as
the real checkpoint (``compat.checkpoint``).  No input is read, nothing is written to Kafka.

Its offsets also give the order in which Spark lists the plan's sources in the offset log:
each empty source's offset names its plan node.

A checkpoint written by Spark's own Kafka connector (a PySpark job's, ``compat.checkpoint.
written_by``) holds the job's state, not the builders': the dry run then plans the job
``plan export --pyspark`` writes (``form="job"``), each Kafka read an empty source of
Kafka's columns (``migrate.jobsession``).
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from compat.checkpoint import Checkpoint, read_checkpoint
from compat.errors import RuntimeFailure
from compat.model import Node, Plan
from compat.steps import Source

EMPTY_FORMAT = "theseus_empty"
_REGISTERED: set[int] = set()


def _register(spark: Any) -> None:
    if id(spark) in _REGISTERED:
        return
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )

    class EmptyStreamReader(DataSourceStreamReader):
        def __init__(self, options: dict) -> None:
            self.offset = {"theseus_empty": options.get("node", ""),
                           "topic": options.get("topic", ""),
                           "partitions": int(options.get("partitions", "0") or 0)}

        def initialOffset(self) -> dict:
            return self.offset

        def latestOffset(self) -> dict:
            return self.offset

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(0)]

        def read(self, partition: Any):
            return iter(())

        def commit(self, end: dict) -> None:
            pass

    class EmptyBatchReader(DataSourceReader):
        def read(self, partition: Any):
            return iter(())

    class EmptySource(DataSource):
        @classmethod
        def name(cls) -> str:
            return EMPTY_FORMAT

        def schema(self) -> str:
            return self.options["schema"]

        def reader(self, schema: Any) -> DataSourceReader:
            return EmptyBatchReader()

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return EmptyStreamReader(dict(self.options))

    spark.dataSource.register(EmptySource)
    _REGISTERED.add(id(spark))


def _empty_builder(spark: Any, plan: Plan) -> Any:
    from compat.steps.source import CHANGELOG, ROWS_VERSION, state_buckets, table_read
    from migrate.build import Builder, BuildOptions
    from migrate.build.core import ddl

    class DryBuilder(Builder):
        def _build(self, node: Node) -> Any:
            if not isinstance(node, Source):
                return super()._build(node)
            info = self.plan.info[node.id]
            opts = {"schema": ddl(info.columns, info.names), "node": node.id,
                    "topic": node.topic, "partitions": str(node.partitions)}
            if table_read(node) == CHANGELOG:
                # A table read as a changelog is a stream of its changes, normalised by a
                # stateful operator of its own (migrate.build.source does the same).
                from gates.source import DELETED_COLUMN, OFFSET_COLUMN
                from migrate.build import changelog

                opts["schema"] += f", {DELETED_COLUMN} BOOLEAN, {OFFSET_COLUMN} BIGINT"
                df = self.spark.readStream.format(EMPTY_FORMAT).options(**opts).load()
                return changelog.normalise(self, df, node.key_columns, info.names,
                                           info.columns, self.state_name(node.id),
                                           node.version >= ROWS_VERSION,
                                           buckets=state_buckets(node))
            if node.role == "table":
                return self.spark.read.format(EMPTY_FORMAT).options(**opts).load()
            df = self.spark.readStream.format(EMPTY_FORMAT).options(**opts).load()
            if node.event_time and self.watermarks_read():
                df = df.withWatermark(node.event_time.column, node.event_time.watermark)
            return df

    return DryBuilder(spark, plan, BuildOptions(bootstrap="unused:0"))


def _empty_job(spark: Any, plan: Plan) -> Any:
    """The writer of the PySpark job of ``plan``, every Kafka read an empty source."""
    from compat.export import to_pyspark
    from migrate.jobsession import KAFKA_SCHEMA, plain, writer_of

    # the job subscribes by topic; sources of one topic are loaded in the plan's order
    nodes: dict[str, list[Source]] = {}
    for node in plan.nodes.values():
        if isinstance(node, Source):
            nodes.setdefault(node.topic, []).append(node)

    def load(reader: Any, fmt: str | None, options: dict[str, str]) -> Any:
        if fmt != "kafka":
            return plain(reader, fmt, options)
        topic = options.get("subscribe", "")
        node = nodes[topic].pop(0) if nodes.get(topic) else None
        return reader.format(EMPTY_FORMAT).options(
            schema=KAFKA_SCHEMA, node=node.id if node else "", topic=topic,
            partitions=str(node.partitions if node else 0)).load()

    job: dict[str, Any] = {"__name__": f"theseus_dryrun_{plan.query}"}
    exec(compile(to_pyspark(plan), f"{plan.file} as a PySpark job", "exec"), job)
    return writer_of(job, spark, load)


def plan_operators(plan: Plan, spark: Any = None, shuffle_partitions: int | None = None,
                   timeout: float = 300.0, conf: dict[str, str] | None = None,
                   form: str = "theseus") -> Checkpoint:
    """A checkpoint of one empty micro-batch of ``plan``: its operators (ids, names, state
    stores, partition counts, key and value schemas) as Spark plans them, and its sources
    in Spark's order (``offsets[i]["theseus_empty"]`` is the node id of source ``i``).

    ``shuffle_partitions``: the count the query would run with (a restart on a checkpoint
    keeps the checkpoint's, whatever the plan says).  ``conf``: the SQL confs a checkpoint's
    offset log pins (state format versions, the state store provider...), which a restart
    restores over the session's: the dry run plans with them too.  ``form``: ``theseus``
    (the builders of ``theseus run``) or ``job`` (the PySpark job of the plan, on Spark's
    Kafka connector's columns)."""
    from migrate.run import DEFAULT_STATE_PARTITIONS, spark_session

    parts = shuffle_partitions or plan.state_partitions or DEFAULT_STATE_PARTITIONS
    if spark is None:
        spark = spark_session("local[2]", parts)
    _register(spark)
    # the job sets the session's shuffle partitions when it is built: restored below
    before: dict[str, str | None] = {
        "spark.sql.shuffle.partitions": spark.conf.get("spark.sql.shuffle.partitions", None)}
    if form == "job":
        writer = _empty_job(spark, plan)
    else:
        writer = _empty_builder(spark, plan).dataframe().writeStream.outputMode(
            "append" if plan.info[plan.sink_id].changelog else plan.sink.mode)
    scratch = tempfile.mkdtemp(prefix="theseus-dryrun-")
    pinned = {**(conf or {}), "spark.sql.shuffle.partitions": str(parts)}
    if plan.info[plan.sink_id].changelog:
        # transformWithState operators need RocksDB (Builder.start sets it for a changelog
        # query); a checkpoint's offset log pins it too.
        from migrate.build.core import ROCKSDB

        pinned.setdefault("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    for k, v in pinned.items():
        try:
            before.setdefault(k, spark.conf.get(k, None))
            spark.conf.set(k, v)
        except Exception:  # a conf this Spark does not know, or a static one: Spark's own
            before.pop(k, None)
    try:
        # The noop sink consumes every partition (a foreachBatch that drops its DataFrame
        # fails Spark 4's state store commit validation); the sink holds no state.
        q = (writer.queryName(f"theseus_dryrun_{plan.query}")
             .format("noop")
             .option("checkpointLocation", scratch).trigger(availableNow=True).start())
        error = None
        try:
            q.awaitTermination(timeout)
        except Exception as e:  # noqa: BLE001 - Spark's StreamingQueryException
            error = str(e)
        finally:
            if q.isActive:
                q.stop()
        if error is None and q.exception() is not None:
            error = str(q.exception())
        if error is not None:
            raise RuntimeFailure(f"Spark cannot plan this query: "
                                 f"{error.strip().splitlines()[0][:300]}", file=plan.file)
        return read_checkpoint(scratch)
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
        shutil.rmtree(scratch, ignore_errors=True)
