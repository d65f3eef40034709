"""A Spark session as a PySpark job's ``build(spark)`` sees it, its Kafka reads redirected.

A job file (or the job ``plan export --pyspark`` writes) reads fixed topics from a fixed
broker.  Two callers need the same job to read something else, unchanged otherwise:

* the restart's dry run on a checkpoint written by Spark's Kafka connector
  (``migrate.stateops``): every Kafka read becomes an empty source of Kafka's schema, so
  Spark plans the job's own operators and state (its ``from_json`` columns, its join keys);
* ``theseus prove --runtime spark`` on job files: the job reads the proof's topics.

Only ``readStream`` and ``read`` are wrapped; every other attribute is the session's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Spark's Kafka source's columns (KafkaRecordToRowConverter.kafkaSchema)
KAFKA_SCHEMA = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
                "timestamp TIMESTAMP, timestampType INT")

#: (the session's reader, format, options) -> the loaded DataFrame
Load = Callable[[Any, str | None, dict[str, str]], Any]


class _Reader:
    """``spark.readStream`` / ``spark.read``: collects format and options, and hands them
    to the hook when the job loads."""

    def __init__(self, reader: Any, load: Load) -> None:
        self._reader, self._load = reader, load
        self._format: str | None = None
        self._options: dict[str, str] = {}

    def format(self, source: str) -> _Reader:
        self._format = source
        return self

    def option(self, key: str, value: Any) -> _Reader:
        self._options[key] = str(value)
        return self

    def options(self, **opts: Any) -> _Reader:
        self._options.update({k: str(v) for k, v in opts.items()})
        return self

    def schema(self, schema: Any) -> _Reader:
        self._reader = self._reader.schema(schema)
        return self

    def load(self, path: str | None = None) -> Any:
        if path is not None:
            self._options["path"] = path
        return self._load(self._reader, self._format, dict(self._options))


class JobSession:
    """``spark`` with ``readStream`` and ``read`` going through ``load``."""

    def __init__(self, spark: Any, load: Load) -> None:
        self._spark, self._load = spark, load

    @property
    def readStream(self) -> _Reader:  # noqa: N802 - the session's own name
        return _Reader(self._spark.readStream, self._load)

    @property
    def read(self) -> _Reader:
        return _Reader(self._spark.read, self._load)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)


def plain(reader: Any, fmt: str | None, options: dict[str, str]) -> Any:
    """Load as the job asked."""
    if fmt is not None:
        reader = reader.format(fmt)
    return reader.options(**options).load()


def redirected(bootstrap: str, topics: dict[str, str]) -> Load:
    """Kafka reads from ``bootstrap``, each subscribed topic renamed through ``topics``."""

    def load(reader: Any, fmt: str | None, options: dict[str, str]) -> Any:
        if fmt == "kafka":
            options["kafka.bootstrap.servers"] = bootstrap
            if "subscribe" in options:
                options["subscribe"] = ",".join(topics.get(t, t) for t in
                                                options["subscribe"].split(","))
        return plain(reader, fmt, options)

    return load


def writer_of(job: dict[str, Any], spark: Any, load: Load) -> Any:
    """The DataStreamWriter a job module's ``build(spark)`` returns, its reads through
    ``load``."""
    return job["build"](JobSession(spark, load))
