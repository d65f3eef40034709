"""Adopting PySpark jobs: ``theseus plan import FILE.py[:FUNCTION]`` makes a job's
``DataStreamWriter`` a ``theseus.plan/1`` plan, and ``theseus plan export --pyspark`` writes a
plan back as a job.

Steps of an import:
1. import the file and call ``FUNCTION(spark)`` (``migrate.adopt.job``); nothing starts;
2. read the writer: its format must be ``kafka``; topic, output mode, query name;
3. translate Spark's analyzed logical plan, node by node (``migrate.adopt.translate``);
4. the sink: ``value`` = ``to_json(struct(...))`` (or ``to_avro(struct(...), schema)``,
   maybe after the registry's header: ``format: avro``) names the output columns, ``key`` =
   ``to_json(struct(...))`` the key columns;
5. fill what Spark's plan does not say: source partitions (``--partitions``, else the
   broker the job names, else 1) and sink delivery (``--delivery``, else
   ``at_least_once``: what Spark's Kafka sink gives);
6. validate the document as any plan is validated (``compat.serde`` + ``compat.infer``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from compat.errors import JobError, TheseusError
from compat.model import Plan
from compat.origins import with_origins
from migrate.adopt.job import DEFAULT_FUNCTION, Job, call_line, read_source, run_job, split_target
from migrate.adopt.origins import KEY as ORIGIN
from migrate.adopt.translate import TO_AVRO, Out, Translator, _quote, avro_schema_text

#: Spark's OutputMode objects -> the plan's sink mode
MODES = {"append": "append", "update": "update", "complete": "complete"}
DELIVERIES = ("at_least_once", "exactly_once")
#: how long the broker named by a job may take to say how many partitions a topic has
BROKER_TIMEOUT = 5.0


def import_job(target: str, *, partitions: int | None = None, delivery: str | None = None,
               bootstrap: str | None = None, file_name: str | None = None
               ) -> dict[str, Any]:
    """The plan document of the job ``FILE.py[:FUNCTION]`` (validated)."""
    path, function = split_target(target)
    key = None
    if cache_enabled():
        from migrate.adopt import cache

        raw = read_source(path).encode()
        # the file's name is the plan's query name and in its metadata
        key = cache.job_key(raw, function, {"name": Path(path).name, "partitions": partitions,
                                            "delivery": delivery, "bootstrap": bootstrap})
        entry = cache.lookup(path, key)
        if entry is not None:
            doc = cache.resolve_lookups(entry["doc"], entry["lookups"], topic_partitions)
            validate(doc, file_name or path)
            return doc
    job = run_job(path, function)
    doc = translate_job(job, partitions=partitions, delivery=delivery, bootstrap=bootstrap)
    validate(doc, file_name or path)
    if key is not None:
        # stored before anything else sees the document: the caller may change it
        cache.store(path, key, [path, *job.modules], json.loads(json.dumps(doc)),
                    job.lookups)
    return doc


def cache_enabled() -> bool:
    """``THESEUS_IMPORT_CACHE=0`` imports every job afresh (the bench's cold runs)."""
    return os.environ.get("THESEUS_IMPORT_CACHE", "1") != "0"


def _field(obj: Any, name: str) -> Any:
    f = obj.getClass().getDeclaredField(name)
    f.setAccessible(True)
    return f.get(obj)


def writer_settings(job: Job) -> tuple[str, str | None, dict[str, str]]:
    """Step 2: the writer's format, output mode and options (fields of Spark's
    ``DataStreamWriter``, read by reflection)."""
    jw = job.writer._jwrite
    source = str(_field(jw, "source"))
    mode = _field(jw, "outputMode")
    opts_map = _field(jw, "extraOptions")
    keys = opts_map.originalMap().keys().toSeq()
    opts = {str(keys.apply(i)).lower(): str(opts_map.originalMap().apply(keys.apply(i)))
            for i in range(keys.size())}
    return source, (str(mode.toString()).lower() if mode is not None else None), opts


def translate_job(job: Job, *, partitions: int | None = None, delivery: str | None = None,
                  bootstrap: str | None = None) -> dict[str, Any]:
    source, mode, opts = writer_settings(job)
    t = Translator(job)
    if source in ("foreachBatch", "foreach"):
        raise t.err(f"'{source}' cannot be expressed in a plan: it runs arbitrary code on "
                    "each batch", line=call_line(job.source, source),
                    expected="writeStream.format('kafka')", found=source)
    if source.lower() != "kafka":
        raise t.err(f"the sink is not Kafka: writeStream.format('{source}')",
                    line=call_line(job.source, "writeStream"),
                    expected="writeStream.format('kafka')", found=repr(source))
    topic = opts.get("topic")
    if not topic:
        raise t.err("the Kafka sink has no topic option", line=call_line(job.source,
                                                                         "writeStream"),
                    expected="option('topic', 'out') (a topic column cannot be expressed)",
                    found="no topic option")
    if delivery is not None and delivery not in DELIVERIES:
        raise JobError("unknown delivery", expected=" | ".join(DELIVERIES),
                       found=repr(delivery))
    plan = job.writer._df._jdf.queryExecution().analyzed()
    # Step 3, then 4: the top projection makes the sink.
    if t.cls(plan) != "Project":
        raise t.err("the written DataFrame must select the record's key and value",
                    line=call_line(job.source, "writeStream"),
                    expected="select(to_json(struct(...)).alias('key'), "
                    "to_json(struct(...)).alias('value'))", found=str(plan.nodeName()))
    with t.within(plan):
        child = t.translate(plan.child())
    items = {str(it.name()).lower(): it for it in t.items(plan.projectList())}
    extra = sorted(set(items) - {"key", "value"})
    if extra or "value" not in items:
        raise t.err("the written DataFrame must have a value column, and a key column "
                    "at most", line=call_line(job.source, "writeStream"),
                    expected="key, value", found=", ".join(sorted(items)) or "nothing")
    fmt, columns, avro = _value(t, items["value"], child)
    key_columns = _key(t, items.get("key"), child, columns) if "key" in items else []
    inp = child.node
    in_order = [child.names[i] for i in child.order]
    if [c["name"] for c in columns] != in_order or any(
            c["expr"] != _quote(c["name"]) for c in columns):
        inp = t.add("project", {"step": "project", "version": 1, "inputs": [inp],
                                "columns": columns}, origin=t.origin_of(plan))
    sink_mode = MODES.get(mode or "append", "append")
    t.add("out", {"step": "sink", "version": 1, "inputs": [inp], "topic": topic,
                  "format": fmt, "key_columns": key_columns, "mode": sink_mode,
                  "delivery": delivery or "at_least_once", **avro},
          origin=job.origins.sink if job.origins is not None else None)
    # Step 5: what the analyzed plan does not say.
    for nid, sopts in t.sources.items():
        node = t.nodes[nid]
        asked = bootstrap or sopts.get("kafka.bootstrap.servers")
        if not partitions and asked:
            job.lookups.append({"node": nid, "bootstrap": asked, "topic": node["topic"]})
        node["partitions"] = partitions or topic_partitions(asked, node["topic"]) or 1
        if node["role"] == "table" and not node.get("key_columns"):
            raise t.err("a table read (the latest record per key) must be joined right "
                        "after it is parsed, on its key columns",
                        line=call_line(job.source, "join"),
                        expected="stream.join(table, stream.k == table.k)",
                        found=f"topic '{node['topic']}' read as a table, never joined")
        if not node["schema"]:
            raise t.err("a Kafka source's value is never parsed",
                        line=call_line(job.source, "load"),
                        expected="from_json(col('value').cast('string'), schema)",
                        found=f"topic '{node['topic']}' read raw")
    name = opts.get("queryname") or Path(job.file).stem
    query = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "job"
    doc = {"format": "theseus.plan/1", "query": query,
           "config": {"state_partitions": job.shuffle_partitions},
           "metadata": {"imported_from": f"{Path(job.file).name}:{job.function}"},
           "nodes": [_origin_last(n) for n in t.nodes.values()]}
    _window_keyed(doc, job.file)
    return doc


def _window_keyed(doc: dict[str, Any], file: str) -> None:
    """Step 4, the key: a job whose key ends with the window of its windowed output (the
    window, or its bounds under any name: ``struct(page, day)`` with ``day`` =
    ``window.start``) writes what sink version 2 writes from the columns before it, so the
    plan says so as ``plan compile`` does (ksqlDB's windowed keys).  Any other key stays
    version 1 with the job's key as it is: the bytes the job writes decide."""
    from compat.infer import analyze
    from compat.serde import from_doc
    from compat.steps.sink import WINDOWED_KEY_VERSION, written_key

    sink = next(n for n in doc["nodes"] if n["step"] == "sink")
    keys = list(sink["key_columns"])
    try:
        plan = from_doc(json.loads(json.dumps(doc)), file)
        analyze(plan)
    except TheseusError:
        return  # step 6 says what is wrong with the plan
    info = plan.info[plan.sink_id]
    cut = len(keys)
    while cut and keys[cut - 1].lower() in info.windows:
        cut -= 1
    if cut == len(keys):
        return
    v2 = dataclasses.replace(plan.sink, version=WINDOWED_KEY_VERSION,
                             key_columns=tuple(keys[:cut]))
    if list(written_key(v2, info)) == keys:
        sink["version"], sink["key_columns"] = WINDOWED_KEY_VERSION, keys[:cut]


def _origin_last(node: dict[str, Any]) -> dict[str, Any]:
    """The node with its ``x-origin`` last, where the serde writes ``x-`` keys (fields set
    after a node was added would follow it)."""
    if ORIGIN not in node:
        return node
    return {**{k: v for k, v in node.items() if k != ORIGIN}, ORIGIN: node[ORIGIN]}


def _struct_fields(t: Translator, e: Any, child: Out, what: str) -> list[tuple[str, Any]]:
    if t.cls(e) != "StructsToJson":
        return []
    opts = t.scala_map(e.options())
    if opts:
        raise t.err(f"to_json options on the {what} cannot be expressed in a plan",
                    line=call_line(t.job.source, "to_json"),
                    expected="to_json(struct(...))", found=str(opts))
    s = e.child()
    if t.cls(s) != "CreateNamedStruct":
        raise t.err(f"the {what} must be to_json(struct(...))",
                    line=call_line(t.job.source, "to_json"),
                    expected="to_json(struct(col, ...))", found=str(s.sql())[:200])
    names = [str(n.value()) if t.cls(n) == "Literal" else str(n.sql())
             for n in t.items(s.nameExprs())]
    return list(zip(names, t.items(s.valExprs())))


def _value(t: Translator, item: Any, child: Out
           ) -> tuple[str, list[dict[str, str]], dict[str, Any]]:
    """The sink's format, its columns and (Avro) its ``avro`` field."""
    e = item.child() if t.cls(item) == "Alias" else item
    fields = _struct_fields(t, e, child, "value")
    if fields:
        return "json", [{"name": n, "expr": t.sql(v, child.names)} for n, v in fields], {}
    avro = _to_avro(t, e)
    if avro is not None:
        s = avro.children().apply(0)
        if t.cls(s) != "CreateNamedStruct":
            raise t.err("the value must be to_avro(struct(...))",
                        line=call_line(t.job.source, "to_avro"),
                        expected="to_avro(struct(col, ...), schema)",
                        found=str(s.sql())[:200])
        names = [str(n.value()) if t.cls(n) == "Literal" else str(n.sql())
                 for n in t.items(s.nameExprs())]
        schema = avro_schema_text(avro)
        return "avro", [{"name": n, "expr": t.sql(v, child.names)}
                        for n, v in zip(names, t.items(s.valExprs()))], \
            {"avro": {"schema": schema}} if schema else {}
    if t.cls(e) == "Cast" and str(e.dataType().simpleString()) == "string" or \
            str(e.dataType().simpleString()) == "string":
        inner = e.child() if t.cls(e) == "Cast" else e
        name = t.attr_name(inner, child.names) or "value"
        return "string", [{"name": name, "expr": t.sql(inner, child.names)}], {}
    raise t.err("the value must be to_json(struct(...)) or a string",
                line=call_line(t.job.source, "to_json"),
                expected="to_json(struct(col, ...)).alias('value')",
                found=str(item.sql())[:200])


def _to_avro(t: Translator, e: Any) -> Any:
    """The to_avro expression of a value ``to_avro(...)`` or ``concat(header, to_avro(...))``
    (the registry's header put in front by the job: Theseus's sink writes its own), or
    None."""
    if t.cls(e) == "Concat":
        parts = t.children(e)
        e = parts[-1] if len(parts) == 2 else e
    return e if t.cls(e) in TO_AVRO else None


def _key(t: Translator, item: Any, child: Out, columns: list[dict[str, str]]) -> list[str]:
    e = item.child() if t.cls(item) == "Alias" else item
    fields = _struct_fields(t, e, child, "key")
    if not fields:
        raise t.err("the key must be to_json(struct(...)) of output columns: a plan writes "
                    "its key as the JSON object of its key columns",
                    line=call_line(t.job.source, "to_json"),
                    expected="to_json(struct('a', 'b')).alias('key')",
                    found=str(item.sql())[:200])
    by_name = {c["name"].lower(): c for c in columns}
    out = []
    for n, v in fields:
        col = by_name.get(n.lower())
        if col is None or col["expr"] != t.sql(v, child.names):
            raise t.err(f"key field '{n}' is not a column of the value",
                        line=call_line(t.job.source, "to_json"),
                        expected="key fields that the value's struct has too",
                        found=f"{n} = {t.sql(v, child.names)}")
        out.append(col["name"])
    return out


def topic_partitions(bootstrap: str | None, topic: str) -> int | None:
    """How many partitions the broker the job names gives ``topic`` (None when it does
    not answer within ``BROKER_TIMEOUT`` or has no such topic)."""
    if not bootstrap:
        return None
    from gates.kafkaconf import active

    # the process's Kafka settings (--kafka-config): a secured broker answers only them
    conf = {"bootstrap.servers": bootstrap, **active(), "socket.timeout.ms": 3000,
            "log_level": 0}
    key = tuple(sorted((k, str(v)) for k, v in conf.items()))
    # One client per broker and settings for the whole process: a fleet's jobs ask once
    # per source, and a client's start (its connection) is 50 ms of the 52 a question
    # takes.  A broker that did not answer is not asked again by this process: each
    # question would wait BROKER_TIMEOUT for it.
    admin = _ADMINS.get(key)
    if admin is _SILENT:
        return None
    try:
        if admin is None:
            from confluent_kafka.admin import AdminClient

            admin = _ADMINS[key] = AdminClient({**conf, "logger": _Quiet()})
        md = admin.list_topics(topic, timeout=BROKER_TIMEOUT).topics.get(topic)
    except Exception:
        if key in _ADMINS:
            _ADMINS[key] = _SILENT
        return None
    if md is None or md.error is not None or not md.partitions:
        return None
    return len(md.partitions)


#: the admin clients of :func:`topic_partitions` by their settings (``_SILENT``: the
#: broker did not answer)
_ADMINS: dict[tuple[tuple[str, str], ...], Any] = {}
_SILENT = object()


class _Quiet:
    """A logger for librdkafka that says nothing (an absent broker is not an error)."""

    def log(self, *a: Any, **k: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return self.log


def validate(doc: dict[str, Any], file: str) -> Plan:
    from compat.infer import analyze
    from compat.serde import from_doc

    try:
        plan = from_doc(json.loads(json.dumps(doc)), file)
        analyze(plan)
    except TheseusError as e:
        raise JobError(f"the imported plan is not valid: {e.message}", file=file,
                       node=e.node, pointer=e.pointer, expected=e.expected,
                       found=e.found) from None
    return plan


def dumps(doc: dict[str, Any]) -> str:
    """A plan document as the project writes them: one node per block."""
    return json.dumps(doc, indent=2) + "\n"


def load_job_plan(path: str, raw: bytes | None = None) -> Plan:
    """A job file as a plan, for ``theseus check`` (``compat.check.load_plan`` calls this
    for ``.py`` files).  ``raw`` (a file at a git ref) is refused: a job imports its
    sibling modules, so ``--against`` imports the ref from a worktree instead."""
    if raw is not None:
        raise JobError("a job file is imported from a checked-out tree", file=path)
    file, function = split_target(path)
    doc = import_job(path, file_name=file)
    plan = validate(doc, file)
    return with_origins(plan)  # findings point at the job's DataFrame calls


__all__ = ["DEFAULT_FUNCTION", "dumps", "import_job", "load_job_plan", "topic_partitions",
           "translate_job", "validate"]
