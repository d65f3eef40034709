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

import io
import json
import struct
from collections.abc import Mapping
from typing import Any

from compat.errors import SourceError
from compat.registry import RegistryClient, RegistryError

MAGIC = 0
HEADER = struct.Struct(">bI")


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

    def __init__(self, topic: str, reader_schema: str, registry: RegistryClient):
        # fastavro loads with the first Avro source (start-up time of other queries)
        import fastavro

        self.fastavro = fastavro
        self.topic = topic
        self.reader = fastavro.parse_schema(json.loads(reader_schema))
        self.registry = registry
        self.writers: dict[int, Any] = {}

    def writer(self, schema_id: int, partition: int, offset: int) -> Any:
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
            w = self.fastavro.parse_schema(json.loads(text))
            self.writers[schema_id] = w
        return w

    def decode(self, value: bytes, partition: int, offset: int) -> dict:
        try:
            sid, body = unframe(value)
        except ValueError as e:
            raise SourceError("the record is not in the schema registry's wire format",
                              topic=self.topic, partition=partition,
                              expected="a zero byte, a 4-byte schema id, the Avro body",
                              found=f"offset {offset}: {e} "
                              f"(first bytes {bytes(value[:5]).hex() or 'none'})") from None
        writer = self.writer(sid, partition, offset)
        try:
            buf = io.BytesIO(body)
            doc = self.fastavro.schemaless_reader(buf, writer, self.reader)
        except Exception as e:  # fastavro raises whatever its decoder meets
            raise SourceError(f"the record's Avro body does not decode with schema id {sid}",
                              topic=self.topic, partition=partition,
                              expected="an Avro body of the writer schema, resolvable by "
                              "the plan's reader schema",
                              found=f"offset {offset}: {type(e).__name__}: {e}") from None
        if buf.tell() != len(body):
            raise SourceError(f"the record's Avro body is longer than schema id {sid} says",
                              topic=self.topic, partition=partition,
                              expected=f"{buf.tell()} bytes",
                              found=f"offset {offset}: {len(body)} bytes")
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
