"""A Spark Structured Streaming checkpoint, read in plain Python (no Spark, no JVM).

What a checkpoint directory holds (Spark 4.x, the formats of its own readers):

    metadata                         {"id": "<query id>"}
    offsets/<batch>                  "v1", then OffsetSeqMetadata JSON (batchWatermarkMs,
                                     batchTimestampMs, conf: the SQL confs a restart keeps,
                                     spark.sql.shuffle.partitions among them), then one line
                                     per source, in the query's source order ("-" = none)
    commits/<batch>                  "v1", then {"nextBatchWatermarkMs": ...}: the batch is done
    sources/<i>/0                    Spark's Kafka connector only (KafkaSourceInitialOffsetWriter):
                                     a NUL byte, "v1", then source i's starting offsets; the
                                     gated source (a Python data source) writes none
    state/<op>/_metadata/metadata    OperatorStateMetadataV1: "v1", then {"operatorInfo":
                                     {"operatorId", "operatorName"}, "stateStoreInfo":
                                     [{"storeName", "numColsPrefixKey", "numPartitions"}]}
    state/<op>/_metadata/v2/<batch>  OperatorStateMetadataV2 (transformWithState): the same
                                     plus "operatorPropertiesJson" and each store's
                                     "stateSchemaFilePaths" (Spark 4.3; a single
                                     "stateSchemaFilePath" before)
    state/<op>/0/[<store>/]_metadata/schema
                                     the state schema, as StateSchemaCompatibilityChecker
                                     writes it: Java ``writeUTF("v1"|"v2")``; v1 = two UTF
                                     strings (key, value schema JSON); v2 = for key then value
                                     an int count of chunks and that many UTF strings
    state/<op>/_stateSchema/<store>/<batch>_<uuid>
                                     the v3 schema (transformWithState), as SchemaV3Writer
                                     writes it: ``writeUTF("v3")``, an int count of column
                                     families, each its name (UTF) and four chunked JSON
                                     texts (key schema, value schema, key encoder spec,
                                     user key encoder schema; Spark 4.3 puts a short
                                     schema id before the first two); StateSchemaV3File's text
                                     form ("v3" line, one JSON column family a line) too

Only batches with a commit count: an offsets file without its commit is a batch Spark will
run again at restart.  What the files do not hold (the source topics of a source that is not
the gated Kafka source, the sink, window sizes) is never guessed: ``Checkpoint.not_verified``
says it.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat.errors import TheseusError
from compat.recursive_state import read_loop_states
from compat.types import type_string


class CheckpointError(TheseusError):
    """A checkpoint directory cannot be read, or holds nothing that can be checked."""


@dataclass(frozen=True)
class StateStore:
    name: str
    partitions: int
    prefix_key_columns: int = 0
    #: Spark's StructType JSON (``{"type": "struct", "fields": [...]}``); None: not recorded
    key_schema: dict[str, Any] | None = None
    value_schema: dict[str, Any] | None = None
    schema_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "partitions": self.partitions,
                "key_schema": type_string(self.key_schema) if self.key_schema else None,
                "value_schema": type_string(self.value_schema) if self.value_schema
                else None}


@dataclass(frozen=True)
class Operator:
    id: int
    name: str
    stores: tuple[StateStore, ...]
    metadata_version: int = 1

    @property
    def partitions(self) -> int | None:
        return self.stores[0].partitions if self.stores else None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "metadata_version": self.metadata_version,
                "partitions": self.partitions, "stores": [s.to_json() for s in self.stores]}


@dataclass
class Checkpoint:
    path: str
    query_id: str | None
    #: the last batch whose commit is written (None: no batch was ever committed)
    last_committed: int | None
    #: the offsets of that batch, one entry per source in the query's source order
    offsets: list[Any]
    conf: dict[str, str]
    watermark_ms: int | None
    operators: list[Operator]
    not_verified: list[str] = field(default_factory=list)
    #: the loop state of each recursive step, by step id (compat.recursive_state)
    loops: dict[str, Any] = field(default_factory=dict)
    #: which source wrote the offsets (:func:`written_by`): "kafka-connector", "gated" or
    #: "other"; the restart's dry run plans the matching form of the new plan
    written_by: str = "gated"

    @property
    def shuffle_partitions(self) -> int | None:
        v = self.conf.get("spark.sql.shuffle.partitions")
        return int(v) if v is not None and str(v).isdigit() else None

    def source_offsets(self) -> dict[str, dict[str, int]]:
        """Offsets per topic and partition, for the sources whose offsets are the gated Kafka
        source's (``{topic: {partition: offset}}``) or Spark's Kafka source's (the same)."""
        out: dict[str, dict[str, int]] = {}
        for doc in self.offsets:
            for topic, parts in kafka_offsets(doc).items():
                out.setdefault(topic, {}).update(parts)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "query_id": self.query_id,
                "last_committed_batch": self.last_committed,
                "shuffle_partitions": self.shuffle_partitions,
                "watermark_ms": self.watermark_ms, "written_by": self.written_by,
                "sources": [{"index": i, "offsets": kafka_offsets(doc) or None,
                             "raw": None if kafka_offsets(doc) else doc}
                            for i, doc in enumerate(self.offsets)],
                "operators": [op.to_json() for op in self.operators],
                "not_verified": list(self.not_verified)} | (
                    {"recursion": [lp.to_json() for _, lp in sorted(self.loops.items())]}
                    if self.loops else {})


def kafka_offsets(doc: Any) -> dict[str, dict[str, int]]:
    """``{topic: {partition: offset}}`` when ``doc`` has that shape, else {}."""
    if not isinstance(doc, dict) or not doc:
        return {}
    out: dict[str, dict[str, int]] = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict) or not all(
                isinstance(p, str) and p.lstrip("-").isdigit() and isinstance(o, int)
                and not isinstance(o, bool) for p, o in parts.items()):
            return {}
        out[str(topic)] = {p: o for p, o in sorted(parts.items(), key=lambda x: int(x[0]))}
    return out


def compatible(stored: Any, new: Any) -> bool:
    """Spark's ``DataType.equalsIgnoreNameAndCompatibleNullability(new, stored)``, the rule
    of ``StateStoreSchemaCompatibilityChecker``: the same shape and the same types field by
    field, names ignored; a field stored as NOT NULL may not become nullable."""
    if isinstance(stored, dict) and isinstance(new, dict):
        kind = stored.get("type")
        if kind != new.get("type"):
            return False
        if kind == "struct":
            a, b = stored.get("fields", []), new.get("fields", [])
            return len(a) == len(b) and all(
                (fs.get("nullable", True) or not fn.get("nullable", True))
                and compatible(fs.get("type"), fn.get("type")) for fs, fn in zip(a, b))
        if kind == "array":
            return (stored.get("containsNull", True) or not new.get("containsNull", True)) \
                and compatible(stored.get("elementType"), new.get("elementType"))
        if kind == "map":
            return (stored.get("valueContainsNull", True)
                    or not new.get("valueContainsNull", True)) \
                and compatible(stored.get("keyType"), new.get("keyType")) \
                and compatible(stored.get("valueType"), new.get("valueType"))
        return stored == new
    return stored == new


def field_names(schema: dict[str, Any] | None) -> list[str]:
    return [str(f.get("name")) for f in (schema or {}).get("fields", [])]


# -- reading ------------------------------------------------------------------------------

def _batches(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir()
                  if p.name.isdigit() and p.is_file())


def _read_text(path: Path, root: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CheckpointError("a checkpoint file is not text", file=str(path),
                              expected="UTF-8 text written by Spark",
                              found="binary data") from None
    except OSError as e:
        raise CheckpointError(f"cannot read a checkpoint file: {e.strerror or e}",
                              file=str(path)) from None


def _version_and_json(path: Path, root: str, what: str, max_version: int) -> tuple[int, list]:
    """A Spark log file: a ``v<N>`` line then JSON lines (``-`` for none)."""
    lines = _read_text(path, root).split("\n")
    head = lines[0].strip() if lines else ""
    m = re.fullmatch(r"v(\d+)", head)
    if not m:
        raise CheckpointError(f"corrupted {what}", file=str(path), pointer=None,
                              expected="a first line 'v1' as Spark writes it",
                              found=repr(head[:40]) if head else "an empty file",
                              hint="restore the file from a backup, or start the query on "
                                   "a fresh checkpoint (a live migration)")
    version = int(m.group(1))
    if version > max_version:
        raise CheckpointError(f"{what} of a newer Spark", file=str(path),
                              expected=f"version <= v{max_version}", found=head)
    docs = []
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        if line.strip() == "-":
            docs.append(None)
            continue
        try:
            docs.append(json.loads(line))
        except ValueError as e:
            raise CheckpointError(f"corrupted {what}", file=str(path),
                                  expected=f"JSON on line {i}",
                                  found=f"{line[:60]!r} ({e})",
                                  hint="restore the file from a backup, or start the query "
                                       "on a fresh checkpoint (a live migration)") from None
    return version, docs


def _read_utf(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">H", buf, pos)
    pos += 2
    # Java's modified UTF-8 differs from UTF-8 only for NUL and supplementary characters,
    # which a schema's JSON holds only inside names: surrogatepass reads both
    return buf[pos:pos + n].decode("utf-8", "surrogatepass"), pos + n


def read_schema_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]] | list[dict]:
    """The (key, value) schemas of a v1/v2 schema file, or the column families of a v3
    file (a list of dicts with ``keySchema`` and ``valueSchema``)."""
    try:
        buf = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read a state schema file: {e.strerror or e}",
                              file=str(path), expected="a schema file",
                              found="a directory" if path.is_dir() else "no readable file"
                              ) from None
    if buf.startswith(b"v3\n"):
        # StateSchemaV3File's own serialisation: a text line "v3", then one JSON
        # ColumnFamilySchemaV1 per line
        return _json_objects(buf[3:].decode("utf-8", "replace"))
    try:
        version, pos = _read_utf(buf, 0)
        if version == "v1":
            key, pos = _read_utf(buf, pos)
            value, pos = _read_utf(buf, pos)
            return json.loads(key), json.loads(value)
        if version == "v2":
            key, pos = _read_chunked(buf, pos)
            value, pos = _read_chunked(buf, pos)
            return json.loads(key), json.loads(value)
        if version == "v3":
            return _read_v3(buf, pos)
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        # What is wrong with the file, not the reader's words for it ("unpack_from
        # requires a buffer of at least 2 bytes" says nothing to a user)
        found = "an empty file" if not buf else \
            f"a file cut short ({len(buf)} bytes)" if isinstance(e, struct.error) else \
            f"bytes that are not UTF-8 text ({len(buf)} bytes)" \
            if isinstance(e, UnicodeDecodeError) else \
            f"a schema that is not JSON ({str(e)[:80]})" \
            if isinstance(e, json.JSONDecodeError) else f"{str(e)[:80]}"
        raise CheckpointError("corrupted state schema file", file=str(path),
                              expected="a schema file as StateSchemaCompatibilityChecker "
                                       "writes it (a version, then the key and value "
                                       "schemas)", found=found,
                              hint="restore the file from a backup, or start the query on "
                                   "a fresh checkpoint (a live migration)") from None
    raise CheckpointError("unknown state schema file version", file=str(path),
                          expected="v1, v2 or v3", found=repr(version[:20]))


def _read_chunked(buf: bytes, pos: int) -> tuple[str, int]:
    """A string SchemaWriter.writeJsonSchema wrote: an int count, then that many UTF
    chunks."""
    (chunks,) = struct.unpack_from(">i", buf, pos)
    pos += 4
    if chunks < 0 or chunks > len(buf):
        raise ValueError(f"{chunks} chunks")
    text = []
    for _ in range(chunks):
        s, pos = _read_utf(buf, pos)
        text.append(s)
    return "".join(text), pos


def _read_v3(buf: bytes, pos: int) -> list[dict]:
    """SchemaHelper.SchemaV3Writer (what Spark 4 writes for transformWithState, measured
    on PySpark 4.3): after ``writeUTF("v3")`` an int count of column families, then for
    each its name (UTF) and four chunked JSON texts: key schema, value schema, key
    encoder spec, user key encoder schema (``{    }`` when none)."""
    (n,) = struct.unpack_from(">i", buf, pos)
    pos += 4
    if n < 0 or n > len(buf):
        raise ValueError(f"{n} column families")
    out = []
    for _ in range(n):
        name, pos = _read_utf(buf, pos)
        try:
            texts, pos = _v3_family(buf, pos, ids=True)
        except (struct.error, ValueError):
            texts, pos = _v3_family(buf, pos, ids=False)
        doc: dict[str, Any] = {"colFamilyName": name, "keySchema": json.loads(texts[0]),
                               "valueSchema": json.loads(texts[1]),
                               "keyStateEncoderSpec": json.loads(texts[2])}
        user = json.loads(texts[3]) if texts[3].strip() else {}
        if user:
            doc["userKeyEncoderSchema"] = user
        out.append(doc)
    return out


def _v3_family(buf: bytes, pos: int, ids: bool) -> tuple[list[str], int]:
    """A column family's four JSON texts.  Spark 4.3 writes a short schema id before the
    key and before the value schema (``ids``; measured on a real checkpoint), the
    SchemaV3Writer of earlier 4.x none."""
    texts = []
    for i in range(4):
        if ids and i < 2:
            pos += 2
        t, pos = _read_chunked(buf, pos)
        texts.append(t)
    for t in texts[:3]:
        json.loads(t)
    return texts, pos


def _json_objects(text: str) -> list[dict]:
    """Every top-level JSON object with a ``keySchema`` in ``text`` (v3 files frame their
    JSON documents in ways that changed between Spark releases; the documents did not)."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return out
        try:
            doc, end = dec.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        if isinstance(doc, dict) and "keySchema" in doc:
            for k in ("keySchema", "valueSchema"):
                if isinstance(doc.get(k), str):
                    doc[k] = json.loads(doc[k])
            out.append(doc)
        i = end


def written_by(root: Path, offsets: list[Any]) -> str:
    """``kafka-connector`` when Spark's Kafka source wrote the offsets (it alone leaves its
    starting offsets under ``sources/<i>/0``), ``gated`` when they are Kafka offsets without
    that file (the gated source, a Python data source), ``other`` for any other source.

    The two Kafka kinds hold the same offsets but not the same state: a PySpark job parses
    the value with ``from_json`` and joins on its columns, the gated builder joins on key
    columns of its own (``__theseus_lk0``), so a join's state rows differ."""
    kafka = [i for i, doc in enumerate(offsets) if kafka_offsets(doc)]
    if not kafka:
        return "other"
    if any((root / "sources" / str(i) / "0").is_file() for i in kafka):
        return "kafka-connector"
    return "gated"


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint directory; CheckpointError (exit 2) when it is not one, has no
    committed batch, or a file Spark would need is corrupted."""
    root = Path(path)
    shown = str(path)
    if not root.is_dir():
        raise CheckpointError("not a checkpoint directory", file=shown,
                              expected="a Spark checkpoint directory (metadata, offsets/, "
                                       "commits/)",
                              found="no such directory" if not root.exists() else "a file")
    has = {n: (root / n).exists() for n in ("metadata", "offsets", "commits")}
    if not has["offsets"] and not has["metadata"]:
        found = sorted(p.name for p in root.iterdir())[:6]
        raise CheckpointError("not a checkpoint directory", file=shown,
                              expected="a Spark checkpoint directory (metadata, offsets/, "
                                       "commits/)",
                              found=("an empty directory" if not found else
                                     "entries " + ", ".join(found)),
                              hint="pass the directory given as checkpointLocation (theseus "
                                   "run records it in the store's queries/<query>/status.json)")
    query_id = None
    if has["metadata"]:
        try:
            meta = json.loads(_read_text(root / "metadata", shown))
            query_id = meta.get("id") if isinstance(meta, dict) else None
        except ValueError:
            raise CheckpointError("corrupted checkpoint metadata", file=str(root / "metadata"),
                                  expected='{"id": "<query id>"}', found="not JSON") from None
    commits = _batches(root / "commits")
    offsets = _batches(root / "offsets")
    if not commits:
        raise CheckpointError("the checkpoint has no committed batch", file=shown,
                              expected="at least one file under commits/",
                              found=(f"{len(offsets)} batch(es) planned in offsets/, none "
                                     "committed" if offsets else "no batch at all"),
                              hint="nothing in it can be checked: the query never finished "
                                   "a batch; starting the new plan on it is starting afresh")
    last = commits[-1]
    # The commit file must be readable too: Spark reads it at restart.
    _version_and_json(root / "commits" / str(last), shown, "commit log file", 1)
    opath = root / "offsets" / str(last)
    if not opath.exists():
        raise CheckpointError("the last committed batch has no offsets file", file=str(opath),
                              expected=f"offsets/{last}", found="no such file")
    _v, docs = _version_and_json(opath, shown, "offsets file", 1)
    if not docs or not isinstance(docs[0], dict):
        raise CheckpointError("corrupted offsets file", file=str(opath),
                              expected="OffsetSeqMetadata JSON on line 2",
                              found="nothing" if not docs else type(docs[0]).__name__)
    if offsets and offsets[-1] > last:
        # A batch planned but not committed: Spark reads its offsets first at restart and
        # runs it again, so a corrupted one fails the restart as well.
        _version_and_json(root / "offsets" / str(offsets[-1]), shown, "offsets file", 1)
    conf, watermark = _offset_metadata(docs[0], opath)
    ck = Checkpoint(path=shown, query_id=query_id, last_committed=last, offsets=docs[1:],
                    conf=conf, watermark_ms=watermark,
                    operators=_operators(root, last))
    ck.written_by = written_by(root, ck.offsets)
    if (root / "recursive").is_dir():  # a plan with recursive steps: their loops' state
        ck.loops = read_loop_states(root, list(ck.source_offsets()))
    for i, doc in enumerate(ck.offsets):
        if doc is not None and not kafka_offsets(doc):
            ck.not_verified.append(f"source {i}: its offsets are not Kafka offsets "
                                   "(topic -> partition -> offset); its topics and "
                                   "partitions are not compared")
    return ck


def _offset_metadata(meta: dict[str, Any], path: Path) -> tuple[dict[str, str], int | None]:
    """The confs and the watermark of an offsets file's OffsetSeqMetadata (line 2), in the
    shapes Spark writes them: ``conf`` an object of strings, ``batchWatermarkMs`` a number,
    the pinned shuffle partitions a count.  Anything else is a corrupted file, said as one,
    never read as something it is not."""
    def bad(pointer: str, expected: str, value: Any) -> CheckpointError:
        return CheckpointError("corrupted offsets file (OffsetSeqMetadata on line 2)",
                               file=str(path), pointer=pointer, expected=expected,
                               found=f"{type(value).__name__} {json.dumps(value)[:60]}",
                               hint="restore the file from a backup, or start the query on "
                                    "a fresh checkpoint (a live migration)")

    raw = meta.get("conf")
    if raw is None:
        raw = {}  # a Spark that pinned no conf
    if not isinstance(raw, dict):
        raise bad("/conf", "an object of SQL confs", raw)
    for k, v in raw.items():
        if isinstance(v, (dict, list)):
            raise bad(f"/conf/{k}", "a string", v)
    conf = {str(k): str(v) for k, v in raw.items()}
    parts = raw.get("spark.sql.shuffle.partitions")
    if parts is not None and (isinstance(parts, bool) or not (
            isinstance(parts, int) or (isinstance(parts, str) and parts.isdigit()))):
        raise bad("/conf/spark.sql.shuffle.partitions", "a partition count (digits)", parts)
    watermark = meta.get("batchWatermarkMs")
    if watermark is not None and (isinstance(watermark, bool)
                                  or not isinstance(watermark, int)):
        raise bad("/batchWatermarkMs", "a number of milliseconds", watermark)
    return conf, watermark


def _operators(root: Path, last: int) -> list[Operator]:
    state = root / "state"
    if not state.is_dir():
        return []
    ops = []
    for d in sorted((p for p in state.iterdir() if p.name.isdigit() and p.is_dir()),
                    key=lambda p: int(p.name)):
        ops.append(_operator(d, last))
    return ops


def _operator(d: Path, last: int) -> Operator:
    meta_dir = d / "_metadata"
    v2 = [b for b in _batches(meta_dir / "v2") if b <= last] if (meta_dir / "v2").is_dir() \
        else []
    stores: list[StateStore] = []
    if v2:
        path = meta_dir / "v2" / str(v2[-1])
        _ver, docs = _version_and_json(path, str(d), "operator metadata (v2)", 2)
        op_id, op_name, infos = _operator_metadata(docs, path, d, 2)
        families = []
        for s in infos:
            # Spark 4.3 writes "stateSchemaFilePaths" (a list, every schema version of the
            # store; the last is the current one), earlier 4.x "stateSchemaFilePath"
            paths = s.get("stateSchemaFilePaths") or [s.get("stateSchemaFilePath")]
            sp = paths[-1] if isinstance(paths, list) and paths else None
            if sp:
                local = _schema_v3(d, str(sp))
                if local is not None:
                    got = read_schema_file(local)
                    families += got if isinstance(got, list) else []
            stores.append(StateStore(str(s.get("storeName")), int(s.get("numPartitions", 0)),
                                     int(s.get("numColsPrefixKey", 0)),
                                     schema_file=str(sp) if sp else None))
        # One state store, many column families: each family is a store of its own here.
        if families:
            n = stores[0].partitions if stores else 0
            stores = [StateStore(str(f.get("colFamilyName") or f.get("columnFamilyName")
                                     or "default"), n, 0,
                                 f.get("keySchema"), f.get("valueSchema"))
                      for f in families]
        return Operator(op_id, op_name, tuple(stores), 2)
    path = meta_dir / "metadata"
    if not path.exists():
        # A Spark before 3.5 wrote no operator metadata: the id is the directory's name,
        # the operator's name is unknown.
        return Operator(int(d.name), "unknown", tuple(_stores_from_schemas(d, None)), 0)
    _ver, docs = _version_and_json(path, str(d), "operator metadata", 2)
    op_id, op_name, infos = _operator_metadata(docs, path, d, 1)
    stores = _stores_from_schemas(d, infos)
    return Operator(op_id, op_name, tuple(stores), 1)


def _operator_metadata(docs: list, path: Path, d: Path,
                       version: int) -> tuple[int, str, list[dict[str, Any]]]:
    """The operator id, name and state store infos of an OperatorStateMetadataV1/V2 document,
    in the shapes Spark writes them (``operatorInfo.operatorId`` the number of the operator's
    directory, ``operatorName`` a name, ``stateStoreInfo`` a list of stores, each a
    ``storeName``, ``numPartitions`` and ``numColsPrefixKey``; V2 each store's schema file
    path(s)).  Anything else is corrupted operator metadata, said as such: an operator named
    'None' matched against the new plan would predict a failure Spark would not have."""
    def bad(pointer: str, expected: str, value: Any = ..., found: str | None = None) \
            -> CheckpointError:
        if found is None:
            found = "nothing" if value is ... else \
                f"{type(value).__name__} {json.dumps(value)[:60]}"
        return CheckpointError(f"corrupted operator metadata (v{version})", file=str(path),
                               pointer=pointer, expected=expected, found=found,
                               hint="restore the file from a backup, or start the query on "
                                    "a fresh checkpoint (a live migration)")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not docs or not isinstance(docs[0], dict):
        raise bad("", f"OperatorStateMetadataV{version} JSON on line 2",
                  found="nothing" if not docs else f"{type(docs[0]).__name__} "
                  f"{json.dumps(docs[0])[:60]}")
    doc = docs[0]
    info = doc.get("operatorInfo", ...)
    if not isinstance(info, dict):
        raise bad("/operatorInfo", "an object with operatorId and operatorName", info)
    op_id = info.get("operatorId", ...)
    if not is_int(op_id) or str(op_id) != d.name:
        raise bad("/operatorInfo/operatorId",
                  f"the operator's number {d.name} (its directory state/{d.name})", op_id)
    name = info.get("operatorName", ...)
    if not isinstance(name, str) or not name:
        raise bad("/operatorInfo/operatorName", "the operator's name (a string)", name)
    stores = doc.get("stateStoreInfo", ...)
    if not isinstance(stores, list) or not stores:
        raise bad("/stateStoreInfo", "a list of state stores", stores)
    for i, st in enumerate(stores):
        at = f"/stateStoreInfo/{i}"
        if not isinstance(st, dict):
            raise bad(at, "a state store object", st)
        if not isinstance(st.get("storeName", ...), str) or not st["storeName"]:
            raise bad(f"{at}/storeName", "the store's name (a string)",
                      st.get("storeName", ...))
        for k in ("numPartitions", "numColsPrefixKey"):
            v = st.get(k, ...)
            if not is_int(v) or v < 0 or (k == "numPartitions" and v == 0):
                raise bad(f"{at}/{k}", "a positive count" if k == "numPartitions" else
                          "a count", v)
        if version == 2:
            paths = st.get("stateSchemaFilePaths", ...)
            one = st.get("stateSchemaFilePath", ...)
            if paths is not ... and not (isinstance(paths, list) and all(
                    isinstance(x, str) for x in paths)):
                raise bad(f"{at}/stateSchemaFilePaths", "a list of paths", paths)
            if one is not ... and one is not None and not isinstance(one, str):
                raise bad(f"{at}/stateSchemaFilePath", "a path", one)
    return op_id, name, stores


def _schema_v3(d: Path, recorded: str) -> Path | None:
    """The v3 schema file a v2 operator metadata names: by its recorded (absolute) path, or,
    in a checkpoint copied or moved since, by its name under ``<op>/_stateSchema/``."""
    local = Path(re.sub(r"^file:(//)?", "", recorded))
    if local.is_file():
        return local
    found = sorted((d / "_stateSchema").rglob(local.name)) if (d / "_stateSchema").is_dir() \
        else []
    return found[0] if found else None


def _stores_from_schemas(d: Path, infos: list[dict] | None) -> list[StateStore]:
    """The stores of an operator, each with the schema written under partition 0 (the
    default store's at ``0/_metadata/schema``, another store's at
    ``0/<store>/_metadata/schema``)."""
    names = [str(s.get("storeName", "default")) for s in infos] if infos is not None else \
        ["default"] + sorted(p.name for p in (d / "0").iterdir()
                             if p.is_dir() and (p / "_metadata" / "schema").exists()) \
        if (d / "0").is_dir() else ["default"]
    out = []
    for i, name in enumerate(names):
        schema = d / "0" / ("_metadata" if name == "default" else f"{name}/_metadata") / \
            "schema"
        key = value = None
        if schema.exists():
            got = read_schema_file(schema)
            if isinstance(got, tuple):
                key, value = got
        elif infos is None and name == "default":
            continue
        info = infos[i] if infos is not None else {}
        out.append(StateStore(name, int(info.get("numPartitions", 0) or 0),
                              int(info.get("numColsPrefixKey", 0) or 0), key, value,
                              str(schema) if schema.exists() else None))
    return out
