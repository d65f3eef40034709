"""``source``: the gated Kafka source (``gates.source``), a stream or, for a table, a
batch read in full at every micro-batch (a snapshot), or a stream of its changes normalised
into retractions (a changelog, ``migrate.build.changelog``)."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.steps import Source
from compat.steps.source import CHANGELOG, ROWS_VERSION, state_buckets, table_read
from migrate.build import changelog
from migrate.build.core import SOURCE_FORMAT, Builder, build_step, ddl


def _avro_options(node: Source, b: Builder) -> dict[str, str]:
    """The reader schema and the registry (URL and settings, shipped as options like the
    Kafka ones: an executor reads no file or environment of its host)."""
    from compat import avro as A
    from compat.errors import RuntimeFailure
    from compat.registry import PREFIX, RegistryClient
    from compat.steps.source import avro_schema, avro_spec

    settings = b.opts.registry()
    client = RegistryClient.configured(None, settings)
    if client is None:
        raise RuntimeFailure(f"source '{node.id}' reads Avro, and no schema registry is "
                             "named", file=b.plan.file, node=node.id,
                             pointer=b.plan.pointer(node.id, "format"),
                             expected="SCHEMA_REGISTRY_URL, or schema.registry.url in "
                             "--kafka-config", found="neither")
    out = {"avroSchema": A.canonical(avro_schema(node)), "registry": client.url}
    if avro_spec(node).key:
        out["avroKey"] = "true"
    out.update({f"registry.{k[len(PREFIX):]}": v for k, v in settings.items()
                if k != PREFIX + "url"})
    return out


@build_step.register
def _build(node: Source, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    opts = {
        "bootstrap": b.opts.bootstrap, "topic": node.topic,
        "partitions": str(node.partitions), "format": node.format,
        "schema": ddl(info.columns, info.names), "role": node.role,
        "startingOffsets": node.starting_offsets,
        "maxRecordsPerBatch": str(b.opts.max_records_per_batch),
        "backfillBatches": str(b.opts.backfill_batches),
        "node": node.id,  # names the source's acknowledgements (two may read one topic)
    }
    # The executors read Kafka with the same settings as the driver: they get them as
    # options (shipped with the source), never from a file or the environment of their host.
    opts.update({f"kafka.{k}": v for k, v in b.opts.kafka().items()})
    if node.format == "avro":
        opts.update(_avro_options(node, b))
    if node.key_columns:
        opts["key_columns"] = ",".join(node.key_columns)
    if b.opts.store:
        opts["store"] = b.opts.store
        opts["query"] = b.opts.query or b.plan.query
    if table_read(node) == CHANGELOG:
        from gates.source import DELETED_COLUMN, OFFSET_COLUMN

        opts["role"] = "changelog"
        opts["schema"] += f", {DELETED_COLUMN} BOOLEAN, {OFFSET_COLUMN} BIGINT"
        df = b.spark.readStream.format(SOURCE_FORMAT).options(**opts).load()
        return changelog.normalise(b, df, node.key_columns, info.names, info.columns,
                                   b.state_name(node.id), node.version >= ROWS_VERSION,
                                   buckets=state_buckets(node))
    if node.role == "table":
        # A table is read in full (latest value per key) at every micro-batch: Spark
        # re-plans the static side of a stream-static join each time.
        return b.spark.read.format(SOURCE_FORMAT).options(**opts).load()
    df = b.spark.readStream.format(SOURCE_FORMAT).options(**opts).load()
    if node.event_time and b.watermarks_read():
        df = df.withWatermark(node.event_time.column, node.event_time.watermark)
    return df
