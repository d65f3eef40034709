"""Spark's analyzed logical plan of a job -> a ``theseus.plan/1`` document.

What is read (through py4j, nothing is started):

* the writer's DataFrame: ``df._jdf.queryExecution().analyzed()``, the plan Spark's
  analyzer resolved (the same tree Spark plans the query from).  Operators are matched by
  their class names (``Project``, ``Filter``, ``Aggregate``, ``Join``, ``Union``,
  ``Deduplicate``, ``DeduplicateWithinWatermark``, ``Generate``, ``EventTimeWatermark``,
  ``StreamingRelationV2``, ``SubqueryAlias``) and read through their public accessors;
* expressions through Catalyst's own ``Expression.sql`` (its SQL text, which Theseus
  expressions are), after two rewrites done with the generic ``withNewChildren``: columns
  take their plan names (qualified by the input node's id in a join), and casts the analyzer
  added (without Spark's ``Cast.USER_SPECIFIED_CAST`` tag) are dropped: Spark adds them
  again when it builds the plan;
* the writer's fields (``source``, ``outputMode``, ``extraOptions``) by reflection.

Anything else is refused with the operator's name: a plan never guesses.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from compat.errors import JobError
from migrate.adopt.job import Job, call_line, def_line
from migrate.adopt.origins import KEY as ORIGIN
from migrate.adopt.origins import Origin

#: Spark's join types -> the plan's
JOIN_TYPES = {"Inner": "inner", "LeftOuter": "left", "RightOuter": "right",
              "FullOuter": "full", "LeftSemi": "left_semi", "LeftAnti": "left_anti"}

#: Spark's from_avro and to_avro: the DataFrame API's expressions (spark-avro) and the SQL
#: functions' (Spark 4, replaced by the former when the query is planned)
FROM_AVRO = ("AvroDataToCatalyst", "FromAvro")
TO_AVRO = ("CatalystDataToAvro", "ToAvro")

#: the one batch read a plan expresses: a compacted topic's latest record per key
LATEST_IDIOM = ("spark.read.format('kafka')...load().withColumn('rn', row_number().over("
                "Window.partitionBy('key').orderBy(col('offset').desc())))"
                ".where('rn = 1 AND value IS NOT NULL').select(from_json(...))")

#: operators a plan cannot express -> what users call to get them
REFUSED_OPERATORS = {
    "FlatMapGroupsWithState": "mapGroupsWithState/flatMapGroupsWithState",
    "FlatMapGroupsInPandasWithState": "applyInPandasWithState",
    "TransformWithState": "transformWithState",
    "TransformWithStateInPySpark": "transformWithStateInPandas",
    "TransformWithStateInPandas": "transformWithStateInPandas",
    "FlatMapGroupsInPandas": "applyInPandas",
    "FlatMapCoGroupsInPandas": "cogroup().applyInPandas",
    "FlatMapGroupsInArrow": "applyInArrow",
    "MapInPandas": "mapInPandas",
    "MapInArrow": "mapInArrow",
    "MapElements": "map",
    "MapPartitions": "mapPartitions",
    "AppendColumns": "groupByKey",
    "DeserializeToObject": "a typed Dataset operation",
    "SerializeFromObject": "a typed Dataset operation",
}

#: expressions a plan cannot express: user code or arbitrary Java
REFUSED_EXPRESSIONS = {
    "PythonUDF": "a Python UDF", "PythonUDAF": "a Python UDAF", "PythonUDTF": "a Python UDTF",
    "ScalaUDF": "a Scala/Java UDF", "ScalaUDAF": "a Scala/Java UDAF",
    "ScalaAggregator": "a Scala/Java aggregator", "JavaUDF": "a Java UDF",
    "CallMethodViaReflection": "arbitrary Java (reflect/java_method)",
    "Invoke": "arbitrary Java", "StaticInvoke": "arbitrary Java",
    "NewInstance": "arbitrary Java",
}
_LINE_NAMES = {
    "mapGroupsWithState/flatMapGroupsWithState": ("mapGroupsWithState",
                                                  "flatMapGroupsWithState"),
    "cogroup().applyInPandas": ("applyInPandas",),
}


@dataclass
class Out:
    """A translated subtree: its top node's id and what each Spark column is called there
    (by expression id), in output order."""

    node: str
    names: dict[int, str]
    order: list[int]
    #: the Spark struct column holding a source's parsed value (``from_json(...) AS d``)
    parsed: int | None = None
    watermark_ms: int | None = None


@dataclass
class Translator:
    job: Job
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the Kafka options of every source node, by node id
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    #: (left key id, right key id) -> the plan column that is their coalesce (an outer
    #: join's paired key)
    coalesced: dict[tuple[int, int], str] = field(default_factory=dict)
    #: the source nodes read as tables (the latest record per key)
    tables: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.spark = self.job.spark
        self.folder = os.path.dirname(os.path.realpath(self.job.file))
        #: the origins of the operators being translated, innermost last
        self._origins: list[Origin | None] = []
        self.jvm = self.spark._jvm
        self.cast_tag = self.jvm.org.apache.spark.sql.catalyst.expressions.Cast \
            .USER_SPECIFIED_CAST()

    # ---------------------------------------------------------------- errors, helpers

    def err(self, message: str, *, line: int | None = None, **kw: Any) -> JobError:
        return JobError(message, file=self.job.file,
                        line=line if line is not None else def_line(self.job.source,
                                                                    self.job.function),
                        **kw)

    def refuse(self, what: str, operator: str, call: tuple[str, ...] = ()) -> JobError:
        line = call_line(self.job.source, *call) if call else None
        return self.err(f"{what} cannot be expressed in a plan: {operator}", line=line,
                        expected="Kafka sources, select/selectExpr/withColumn/filter, "
                        "groupBy().agg() with window/session_window, dropDuplicates, "
                        "join, union, explode and a Kafka sink",
                        found=operator)

    def fresh(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("_") or "node"
        name, i = base, 2
        while name in self.nodes:
            name, i = f"{base}{i}", i + 1
        return name

    def add(self, base: str, doc: dict[str, Any], origin: Origin | None = None) -> str:
        """A new node; its ``x-origin`` is ``origin``, else the call that made the Spark
        operator being translated."""
        nid = self.fresh(base)
        self.nodes[nid] = {"id": nid, **doc}
        origin = origin or (self._origins[-1] if self._origins else None)
        if origin is not None:
            self.nodes[nid][ORIGIN] = origin.doc(self.folder)
        return nid

    def origin_of(self, plan: Any) -> Origin | None:
        """The user's call that made the operator ``plan``, else the nearest one above it
        being translated."""
        own = self.job.origins.at(plan) if self.job.origins is not None else None
        return own or (self._origins[-1] if self._origins else None)

    @contextlib.contextmanager
    def within(self, plan: Any) -> Iterator[None]:
        """Nodes added in the block come from ``plan``'s call."""
        self._origins.append(self.origin_of(plan))
        try:
            yield
        finally:
            self._origins.pop()

    def rename(self, old: str, new: str) -> str:
        """A subtree's top node takes the name the job gave it (``df.alias("o")``); only
        its parents, built later, will refer to it."""
        new = re.sub(r"[^A-Za-z0-9_.-]+", "_", new)
        if not new or new == old or new in self.nodes:
            return old
        doc = self.nodes.pop(old)
        doc["id"] = new
        self.nodes[new] = doc
        if old in self.sources:
            self.sources[new] = self.sources.pop(old)
        if old in self.tables:
            self.tables.discard(old)
            self.tables.add(new)
        return new

    @staticmethod
    def cls(x: Any) -> str:
        return x.getClass().getSimpleName()

    def seq(self, items: list[Any]) -> Any:
        lst = self.jvm.java.util.ArrayList()
        for it in items:
            lst.add(it)
        return self.jvm.PythonUtils.toSeq(lst)

    def scala_map(self, m: Any) -> dict[str, str]:
        """A Scala ``Map[String, String]`` as a dict."""
        keys = m.keys().toSeq()
        return {str(keys.apply(i)): str(m.apply(keys.apply(i))) for i in range(keys.size())}

    @staticmethod
    def items(seq: Any) -> list[Any]:
        return [seq.apply(i) for i in range(seq.size())]

    def children(self, x: Any) -> list[Any]:
        return self.items(x.children())

    @staticmethod
    def eid(attr: Any) -> int:
        return int(attr.exprId().id())

    def output(self, plan: Any) -> list[Any]:
        return self.items(plan.output())

    # ---------------------------------------------------------------- expressions

    def check_expr(self, e: Any) -> None:
        """Refuse user code and arbitrary Java anywhere in an expression."""
        stack = [e]
        while stack:
            x = stack.pop()
            c = self.cls(x)
            if c in REFUSED_EXPRESSIONS:
                what = REFUSED_EXPRESSIONS[c]
                line = None
                if c.startswith("Python"):
                    name = str(x.name())
                    line = def_line(self.job.source, name) or \
                        call_line(self.job.source, "udf", "pandas_udf", "udtf")
                    what = f"{what} '{name}'"
                elif c in ("ScalaUDF", "JavaUDF"):
                    line = call_line(self.job.source, "registerJavaFunction", "call_udf",
                                     "callUDF")
                raise self.err(f"{what} cannot be expressed in a plan: Theseus plans are "
                               "Spark SQL expressions only", line=line,
                               expected="built-in Spark functions", found=c)
            stack.extend(self.children(x))

    def sql(self, e: Any, names: dict[int, str], qualify: dict[int, str] | None = None) -> str:
        """Spark's SQL text of ``e`` with columns renamed to their plan names (qualified by
        node id through ``qualify``) and the analyzer's implicit casts left out."""
        self.check_expr(e)
        if self.cls(e) == "Between":
            # Spark writes between(a, b, c); the plan's canonical form is the operator.
            return " ".join([self.sql(e.input(), names, qualify), "BETWEEN",
                             _paren_op(self.sql(e.lower(), names, qualify)), "AND",
                             _paren_op(self.sql(e.upper(), names, qualify))])
        text = str(self._rewrite(e, names, qualify or {}).sql())
        return _unparen(text)

    def _rewrite(self, e: Any, names: dict[int, str], qualify: dict[int, str]) -> Any:
        c = self.cls(e)
        if c == "AttributeReference":
            i = self.eid(e)
            if i not in names:
                raise self.err(f"column '{e.name()}' is not available to a plan here",
                               expected="a column of the query's input",
                               found=f"{e.name()} (Spark id {i})")
            q = [qualify[i]] if i in qualify else []
            return e.withName(names[i]).withQualifier(self.seq(q))
        if c == "Cast" and e.getTagValue(self.cast_tag).isEmpty():
            return self._rewrite(e.child(), names, qualify)
        pair = self._coalesced(e)
        if pair is not None:
            return e.children().apply(0).withName(pair).withQualifier(self.seq([]))
        kids = self.children(e)
        if not kids:
            return e
        return e.withNewChildren(self.seq([self._rewrite(k, names, qualify) for k in kids]))

    def attr_name(self, e: Any, names: dict[int, str]) -> str | None:
        """The plan name of ``e`` when it is a bare column (or an outer join's key)."""
        if self.cls(e) == "AttributeReference" and self.eid(e) in names:
            return names[self.eid(e)]
        return self._coalesced(e)

    def _coalesced(self, e: Any) -> str | None:
        if not self.coalesced or self.cls(e) != "Coalesce":
            return None
        kids = self.children(e)
        if len(kids) == 2 and all(self.cls(k) == "AttributeReference" for k in kids):
            return self.coalesced.get((self.eid(kids[0]), self.eid(kids[1])))
        return None

    # ---------------------------------------------------------------- the plan

    def translate(self, plan: Any) -> Out:
        c = self.cls(plan)
        method = getattr(self, f"_t_{c}", None)
        if method is None:
            if c in REFUSED_OPERATORS:
                op = REFUSED_OPERATORS[c]
                raise self.refuse(f"'{op}'", c, _LINE_NAMES.get(op, (op.split("/")[0],)))
            raise self.refuse(f"Spark operator {plan.nodeName()}", c)
        with self.within(plan):
            return method(plan)

    def _batch(self, plan: Any) -> Out:
        raise self.err("a batch read (spark.read) cannot be expressed in a plan but as a "
                       "table: the latest record per key (a plan's table source) where a "
                       "batch read of Kafka joins every record",
                       line=call_line(self.job.source, "read"),
                       expected=LATEST_IDIOM, found=str(plan.nodeName()))

    def _t_Window(self, plan: Any) -> Out:
        raise self.err("a window function cannot be expressed in a plan but as the latest "
                       "record per key of a table read",
                       line=call_line(self.job.source, "over"),
                       expected=LATEST_IDIOM, found="Window " + "; ".join(
                           str(e.sql()) for e in self.items(plan.windowExpressions()))[:200])

    # ---------------------------------------------------------------- table reads

    def _table(self, top: Any, conds: list[Any], below: Any) -> Out | None:
        """The latest-record-per-key idiom over a batch Kafka read (``LATEST_IDIOM``): a
        plan's table source (latest value per record key, a tombstone deleting its key),
        as a ``_Raw`` whose value is parsed as a stream's is.  None when ``below`` (the
        plan under the filters ``conds``) has no window over a batch read."""
        node = below
        while self.cls(node) == "Project":
            node = node.child()
        if self.cls(node) != "Window":
            return None
        window = node
        rel = window.child()
        while self.cls(rel) in ("Project", "SubqueryAlias"):
            rel = rel.child()
        if self.cls(rel) not in ("LogicalRelation", "DataSourceV2Relation"):
            return None
        line = call_line(self.job.source, "over")

        def bad(what: str, found: str) -> JobError:
            return self.err(f"a table read must keep the latest record per key as a plan's "
                            f"table does: {what}", line=line, expected=LATEST_IDIOM,
                            found=found[:200])

        for p in (below, window.child()):
            while self.cls(p) in ("Project", "SubqueryAlias"):
                if self.cls(p) == "Project" and not all(
                        self.cls(it) == "AttributeReference"
                        for it in self.items(p.projectList())):
                    raise bad("only the window's row number may be added to the record",
                              "; ".join(str(it.sql()) for it in
                                        self.items(p.projectList()))[:200])
                p = p.child()
        raw = {str(a.name()): self.eid(a) for a in self.output(rel)}
        wexprs = self.items(window.windowExpressions())
        fn = None
        if len(wexprs) == 1 and self.cls(wexprs[0]) == "Alias" and \
                self.cls(wexprs[0].child()) == "WindowExpression":
            fn = wexprs[0].child().windowFunction()
        if fn is None or self.cls(fn) != "RowNumber":
            raise bad("one row_number() over the window", "; ".join(
                str(e.sql()) for e in wexprs))
        rn = self.eid(wexprs[0].toAttribute())
        part = self.items(window.partitionSpec())
        order = self.items(window.orderSpec())
        if len(part) != 1 or self.cls(part[0]) != "AttributeReference" or \
                self.eid(part[0]) != raw.get("key"):
            raise bad("partitionBy the record's key (a tombstone names its key there only)",
                      "partitionBy(" + ", ".join(str(p.sql()) for p in part) + ")")
        if len(order) != 1 or self.cls(order[0].child()) != "AttributeReference" or \
                self.eid(order[0].child()) != raw.get("offset") or \
                str(order[0].direction().sql()) != "DESC":
            raise bad("orderBy the record's offset, descending (timestamps may go back)",
                      "orderBy(" + ", ".join(str(o.sql()) for o in order) + ")")
        first = not_null = False
        for e in conds:
            c = self.cls(e)
            if c == "EqualTo":
                sides = [e.left(), e.right()]
                attr = [s for s in sides if self.cls(s) == "AttributeReference"
                        and self.eid(s) == rn]
                lit = [s for s in sides if self.cls(s) == "Literal"]
                if attr and lit and str(lit[0].value()) == "1":
                    first = True
                    continue
            if c == "IsNotNull" and self.cls(e.child()) == "AttributeReference" and \
                    self.eid(e.child()) == raw.get("value"):
                not_null = True
                continue
            raise bad("only the first row and non-null values are kept", str(e.sql()))
        if not first:
            raise bad("the first row per key only", "no filter on the row number")
        if not not_null:
            raise bad("a tombstone (null value) deletes its key: filter value IS NOT NULL "
                      "after the row number", "no value IS NOT NULL filter")
        opts = self._relation_options(rel)
        if opts is None:
            raise self.err("a batch read Theseus cannot read the options of",
                           line=call_line(self.job.source, "read"),
                           expected="spark.read.format('kafka')", found=str(rel.nodeName()))
        with self.within(rel):  # the source is the batch read's load(), not the filter
            out = self._kafka_source(opts, "read", {"startingoffsets": "earliest",
                                                    "endingoffsets": "latest"}, raw)
        self.nodes[out.node]["role"] = "table"
        self.nodes[out.node]["starting_offsets"] = "earliest"
        self.tables.add(out.node)
        return out

    def _relation_options(self, rel: Any) -> dict[str, str] | None:
        """A batch Kafka read's options: a DSv2 relation's own, or the options map of
        the V1 ``KafkaRelation`` (by reflection, as the writer's fields are read)."""
        if self.cls(rel) == "DataSourceV2Relation":
            return {str(k).lower(): str(v) for k, v in dict(rel.options()).items()}
        r = rel.relation()
        if "kafka" not in self.cls(r).lower():
            return None
        for f in r.getClass().getDeclaredFields():
            f.setAccessible(True)
            v = f.get(r)
            if v is None or "Map" not in self.cls(v):
                continue
            try:
                m = self.scala_map(v)
            except Exception:  # noqa: BLE001 - not a Scala map of strings
                continue
            m = {k.lower(): x for k, x in m.items()}
            if "subscribe" in m or "assign" in m or "subscribepattern" in m:
                return m
        return None

    _t_DataSourceV2Relation = _batch
    _t_LogicalRelation = _batch
    _t_LocalRelation = _batch
    _t_Range = _batch

    def _t_SubqueryAlias(self, plan: Any) -> Out:
        out = self.translate(plan.child())
        out.node = self.rename(out.node, str(plan.alias()))
        return out

    def _t_StreamingRelationV2(self, plan: Any) -> Out:
        fmt = str(plan.sourceName())
        if fmt.lower() != "kafka":
            raise self.err(f"the source is not Kafka: readStream.format('{fmt}')",
                           line=call_line(self.job.source, "readStream"),
                           expected="spark.readStream.format('kafka')", found=repr(fmt))
        opts = {str(k).lower(): str(v) for k, v in
                dict(plan.extraOptions().asCaseSensitiveMap()).items()}
        raw = {str(a.name()): self.eid(a) for a in self.output(plan)}
        return self._kafka_source(opts, "readStream", {}, raw)

    def _kafka_source(self, opts: dict[str, str], call: str, batch: dict[str, str],
                      raw: dict[str, int]) -> _Raw:
        for k, want in batch.items():
            if opts.get(k, want).strip().lower() != want:
                raise self.err(f"a table read from {k} other than {want} cannot be "
                               "expressed in a plan (a table is the whole topic)",
                               line=call_line(self.job.source, call),
                               expected=want, found=opts[k])
        for bad in ("subscribepattern", "assign"):
            if bad in opts:
                raise self.err(f"a Kafka source with option '{bad}' cannot be expressed "
                               "in a plan", line=call_line(self.job.source, call),
                               expected="option('subscribe', 'one-topic')",
                               found=f"{bad}={opts[bad]}")
        topics = [t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()]
        if len(topics) != 1:
            raise self.err("a Kafka source reads one topic in a plan",
                           line=call_line(self.job.source, call),
                           expected="option('subscribe', 'one-topic') (union two sources "
                           "for two topics)", found=repr(opts.get("subscribe", "")))
        starting = opts.get("startingoffsets", "latest").strip().lower()
        if starting not in ("earliest", "latest"):
            raise self.err("startingOffsets per partition cannot be expressed in a plan",
                           expected="earliest or latest", found=starting)
        doc = {"step": "source", "version": 1, "topic": topics[0], "partitions": None,
               "format": "json", "role": "stream", "schema": [],
               "starting_offsets": starting}
        nid = self.add(topics[0], doc)
        self.sources[nid] = opts
        return _Raw(nid, raw)

    def _t_Project(self, plan: Any) -> Out:
        child = self.translate(plan.child())
        items = self.items(plan.projectList())
        if isinstance(child, _Raw):
            return self._parse_value(plan, child, items)
        if child.parsed is not None:
            return self._unnest(plan, child, items)
        node = self.nodes[child.node]
        if node["step"] == "source" and node["format"] == "string" and len(items) == 1 \
                and self.cls(items[0]) == "Alias" and \
                self.cls(items[0].child()) == "JsonToStructs" and \
                self.attr_name(items[0].child().child(), child.names) == \
                node["schema"][0]["name"]:
            # selectExpr("CAST(value AS STRING) AS json") then from_json(col("json"), s)
            return self._json(items[0], _Raw(child.node, {}))
        names, order, cols = {}, [], []
        in_order = [child.names[i] for i in child.order]
        identity = len(items) == len(in_order)
        for k, it in enumerate(items):
            if self.cls(it) == "Alias" and self.attr_name(it.child(), child.names) == \
                    str(it.name()):
                # col("orders.ts").alias("ts"): a column under the name it has in the plan
                name = str(it.name())
                expr = _quote(name)
                identity = identity and name == in_order[k]
            elif self.cls(it) == "Alias":
                name = str(it.name())
                expr = self.sql(it.child(), child.names)
                identity = False
            else:
                name = self.attr_name(it, child.names) or str(it.name())
                expr = _quote(name)
                identity = identity and name == in_order[k]
            cols.append({"name": name, "expr": expr})
            names[self.eid(it.toAttribute())] = name
            order.append(self.eid(it.toAttribute()))
        if identity:
            return Out(child.node, {**child.names, **names}, order,
                       watermark_ms=child.watermark_ms)
        nid = self.add("project", {"step": "project", "version": 1, "inputs": [child.node],
                                   "columns": cols})
        return Out(nid, names, order, watermark_ms=child.watermark_ms)

    def _parse_value(self, plan: Any, raw: _Raw, items: list[Any]) -> Out:
        """``select(from_json(col('value').cast('string'), schema).alias('d'))`` over a
        Kafka source: the source reads JSON values of that schema."""
        node = self.nodes[raw.node]
        if len(items) != 1 or self.cls(items[0]) != "Alias":
            raise self._raw_columns(items, raw)
        e = items[0].child()
        c = self.cls(e)
        if c == "JsonToStructs":
            if not self._is_value_string(e.child(), raw):
                raise self._raw_columns(items, raw)
            return self._json(items[0], raw)
        if c in FROM_AVRO:
            return self._avro(items[0], raw)
        if self._is_value_string(e, raw):
            name = str(items[0].name())
            node["format"] = "string"
            node["schema"] = [{"name": name, "type": "string"}]
            i = self.eid(items[0].toAttribute())
            return Out(raw.node, {i: name}, [i])
        raise self._raw_columns(items, raw)

    def _json(self, item: Any, raw: _Raw) -> Out:
        """The source reads JSON values of the schema ``from_json`` parses them with."""
        node = self.nodes[raw.node]
        e = item.child()
        opts = self.scala_map(e.options())
        if opts:
            raise self.err("from_json options cannot be expressed in a plan (it reads "
                           "JSON as Spark's defaults do)",
                           line=call_line(self.job.source, "from_json"),
                           expected="from_json(value, schema)", found=str(opts))
        schema = e.schema()
        if self.cls(schema) != "StructType":
            raise self.err("from_json must parse a struct", expected="a StructType",
                           found=str(schema.simpleString()))
        fields = list(schema.fields())
        node["schema"] = [{"name": str(f.name()), "type": str(f.dataType().simpleString())}
                          for f in fields]
        node["format"] = "json"
        return Out(raw.node, {}, [], parsed=self.eid(item.toAttribute()))

    def _avro(self, item: Any, raw: _Raw) -> Out:
        """``from_avro(value, schema)``, or over ``substring(value, 6, ...)`` (the registry's
        5-byte header cut off, as users must: Spark's from_avro reads bare bodies): the
        source reads Avro in the registry's wire format with ``schema`` as its reader
        schema."""
        node = self.nodes[raw.node]
        e = item.child()
        line = call_line(self.job.source, "from_avro")
        body = e.children().apply(0)
        if not self._is_value(body, raw):
            raise self.err("from_avro must read the record value, whole or without the "
                           "registry's 5-byte header", line=line,
                           expected="from_avro(col('value'), schema) or from_avro("
                           "expr('substring(value, 6, length(value) - 5)'), schema)",
                           found=str(body.sql())[:200])
        opts = avro_options(self, e)
        if opts:
            raise self.err("from_avro options cannot be expressed in a plan (a record that "
                           "does not decode fails the query)", line=line,
                           expected="from_avro(value, schema)", found=str(opts))
        schema = avro_schema_text(e)
        if schema is None:
            raise self.err("from_avro needs the reader schema as a string", line=line,
                           expected="from_avro(value, schema_json)", found=str(e.sql())[:200])
        dt = e.dataType()
        if self.cls(dt) != "StructType":
            raise self.err("from_avro must read an Avro record", line=line,
                           expected="a record schema", found=str(dt.simpleString()))
        node["schema"] = [{"name": str(f.name()), "type": str(f.dataType().simpleString())}
                          for f in dt.fields()]
        node["format"] = "avro"
        node["avro"] = {"schema": schema}
        return Out(raw.node, {}, [], parsed=self.eid(item.toAttribute()))

    def _is_value(self, e: Any, raw: _Raw) -> bool:
        """``value``, or ``substring(value, 6[, n])``: the wire format's body."""
        if self.cls(e) == "Substring":
            pos = e.children().apply(1)
            if self.cls(pos) != "Literal" or str(pos.value()) != "6":
                return False
            e = e.children().apply(0)
        return self.cls(e) == "AttributeReference" and self.eid(e) == raw.cols.get("value")

    def _is_value_string(self, e: Any, raw: _Raw) -> bool:
        if self.cls(e) != "Cast" or str(e.dataType().simpleString()) != "string":
            return False
        a = e.child()
        return self.cls(a) == "AttributeReference" and self.eid(a) == raw.cols.get("value")

    def _raw_columns(self, items: list[Any], raw: _Raw) -> JobError:
        used = sorted({str(k) for k, i in raw.cols.items() for it in items
                       if self._uses(it, i)} - {"value"})
        found = ("the Kafka record's " + ", ".join(used)) if used else \
            "; ".join(str(it.sql()) for it in items)[:200]
        return self.err("a plan's source reads the record value only, parsed by from_json "
                        "right after the source", line=call_line(self.job.source, "load"),
                        expected="select(from_json(col('value').cast('string'), schema)"
                        ".alias('d')).select('d.*')", found=found)

    def _uses(self, e: Any, i: int) -> bool:
        stack = [e]
        while stack:
            x = stack.pop()
            if self.cls(x) == "AttributeReference" and self.eid(x) == i:
                return True
            stack.extend(self.children(x))
        return False

    def _unnest(self, plan: Any, child: Out, items: list[Any]) -> Out:
        """``select('d.*')`` (or ``d.a AS a``...) over the parsed value."""
        node = self.nodes[child.node]
        schema = {f["name"]: f for f in node["schema"]}
        names, order, picked = {}, [], []
        for it in items:
            e = it.child() if self.cls(it) == "Alias" else it
            if self.cls(e) != "GetStructField" or self.cls(e.child()) != \
                    "AttributeReference" or self.eid(e.child()) != child.parsed:
                raise self.err("after from_json a plan's source takes the parsed fields "
                               "as they are", line=call_line(self.job.source, "from_json"),
                               expected="select('d.*') or select('d.a', 'd.b')",
                               found=str(it.sql())[:200])
            field_name = str(e.extractFieldName())
            alias = str(it.name())
            if alias != field_name:
                raise self.err("a parsed field cannot be renamed while it is unnested",
                               expected=f"d.{field_name} AS {field_name}",
                               found=f"{field_name} AS {alias}")
            picked.append(field_name)
            i = self.eid(it.toAttribute())
            names[i] = field_name
            order.append(i)
        node["schema"] = [schema[n] for n in picked]
        return Out(child.node, names, order)

    def _t_EventTimeWatermark(self, plan: Any) -> Out:
        child = self.translate(plan.child())
        node = self.nodes[child.node]
        col = plan.eventTime()
        name = self.attr_name(col, child.names)
        if node["step"] != "source" or node.get("event_time") or name is None:
            raise self.err("withWatermark must come right after a source's from_json in a "
                           "plan (the plan's sources carry the event time)",
                           line=call_line(self.job.source, "withWatermark"),
                           expected="readStream...select('d.*').withWatermark(...)",
                           found=f"withWatermark on {node['step']} '{child.node}'")
        micros = _micros(plan.delay())
        if micros is None:
            raise self.err("a watermark delay in months cannot be expressed",
                           expected="days or less", found=str(plan.delay().toString()))
        node["event_time"] = {"column": name, "watermark": duration(micros)}
        return Out(child.node, dict(child.names), list(child.order),
                   watermark_ms=micros // 1000)

    def _t_Filter(self, plan: Any) -> Out:
        conds, below = [], plan
        while self.cls(below) == "Filter":
            conds = self._conjuncts(below.condition()) + conds
            below = below.child()
        table = self._table(plan, conds, below)
        if table is not None:
            return table
        child = self.translate(plan.child())
        nid = self.add("filter", {"step": "filter", "version": 1, "inputs": [child.node],
                                  "predicate": self.sql(plan.condition(), child.names)})
        return Out(nid, dict(child.names), list(child.order), watermark_ms=child.watermark_ms)

    def _t_Deduplicate(self, plan: Any) -> Out:
        return self._dedup(plan, None)

    def _t_DeduplicateWithinWatermark(self, plan: Any) -> Out:
        return self._dedup(plan, "within")

    def _dedup(self, plan: Any, within: str | None) -> Out:
        child = self.translate(plan.child())
        keys = [self.attr_name(k, child.names) for k in self.items(plan.keys())]
        doc: dict[str, Any] = {"step": "deduplicate", "version": 1, "inputs": [child.node],
                               "keys": keys}
        if within:
            if child.watermark_ms is None:
                raise self.err("dropDuplicatesWithinWatermark needs a watermark upstream",
                               expected="withWatermark on the source", found="none")
            doc["within"] = duration(child.watermark_ms * 1000)
        nid = self.add("dedup", doc)
        return Out(nid, dict(child.names), list(child.order), watermark_ms=child.watermark_ms)

    def _t_Union(self, plan: Any) -> Out:
        if bool(plan.byName()) or bool(plan.allowMissingCol()):
            raise self.err("union by name is refused: Spark resolves it into projections",
                           expected="union", found="unionByName")
        outs = [self.translate(c) for c in self.children(plan)]
        first = [outs[0].names[i] for i in outs[0].order]
        for o in outs[1:]:
            names = [o.names[i] for i in o.order]
            if [n.lower() for n in names] != [n.lower() for n in first]:
                raise self.err("union inputs must have the same column names in the same "
                               "order in a plan", line=call_line(self.job.source, "union"),
                               expected=", ".join(first), found=", ".join(names))
        nid = self.add("union", {"step": "union", "version": 1,
                                 "inputs": [o.node for o in outs]})
        names = {self.eid(a): n for a, n in zip(self.output(plan), first)}
        wm = [o.watermark_ms for o in outs if o.watermark_ms is not None]
        return Out(nid, names, [self.eid(a) for a in self.output(plan)],
                   watermark_ms=min(wm) if wm else None)

    def _t_Generate(self, plan: Any) -> Out:
        child = self.translate(plan.child())
        gen = plan.generator()
        c = self.cls(gen)
        if c != "Explode":
            raise self.refuse(f"the generator {gen.prettyName()}", c,
                              (str(gen.prettyName()),))
        outs = self.items(plan.generatorOutput())
        if len(outs) != 1:
            raise self.err("explode of a map cannot be expressed in a plan",
                           expected="explode of an array", found=str(gen.sql()))
        alias = str(outs[0].name())
        expr = self.sql(gen.child(), child.names)
        doc = {"step": "explode", "version": 1, "inputs": [child.node], "expr": expr,
               "as": alias}
        if bool(plan.outer()):
            doc["outer"] = True
        nid = self.add("explode", doc)
        names = dict(child.names)
        names[self.eid(outs[0])] = alias
        return Out(nid, names, list(child.order) + [self.eid(outs[0])],
                   watermark_ms=child.watermark_ms)

    # ---------------------------------------------------------------- aggregate

    def _t_Aggregate(self, plan: Any) -> Out:
        grouping = self.items(plan.groupingExpressions())
        child_plan = plan.child()
        window = None
        wid = None
        for g in grouping:
            if self.cls(g) == "AttributeReference" and (
                    g.metadata().contains("spark.timeWindow") or
                    g.metadata().contains("spark.sessionWindow") or
                    (str(g.name()) in ("window", "session_window") and
                     str(g.dataType().simpleString()) ==
                     "struct<start:timestamp,end:timestamp>")):
                wid = self.eid(g)
        if wid is not None:
            window, child_plan = self._window(child_plan, wid)
        child = self.translate(child_plan)
        group_by, names, order = [], {}, []
        gnames: dict[str, str] = {}
        for g in grouping:
            if self.cls(g) == "AttributeReference" and self.eid(g) == wid:
                continue
            gnames[self.sql(g, child.names)] = ""
        aggs = []
        for it in self.items(plan.aggregateExpressions()):
            i = self.eid(it.toAttribute())
            e = it.child() if self.cls(it) == "Alias" else it
            name = str(it.name())
            if self.cls(e) == "AttributeReference" and self.eid(e) == wid:
                names[i] = "window"
                order.append(i)
                continue
            if self.cls(e) == "AggregateExpression":
                aggs.append(self._agg_call(e, name, child.names))
                names[i] = name
                order.append(i)
                continue
            text = self.sql(e, child.names)
            if text not in gnames:
                raise self.err("an aggregate's output mixes grouping columns and aggregate "
                               "functions in one expression",
                               line=call_line(self.job.source, "agg"),
                               expected="grouping columns and aggregate functions, each on "
                               "its own (compute on them with a select after)",
                               found=str(it.sql())[:200])
            gname = name
            gnames[text] = gname
            group_by.append({"name": gname, "expr": text})
            names[i] = gname
            order.append(i)
        missing = [t for t, n in gnames.items() if not n]
        if missing:
            raise self.err("a grouping column is not among the aggregate's output",
                           expected="groupBy(...).agg(...)", found=", ".join(missing))
        doc: dict[str, Any] = {"step": "aggregate", "version": 1, "inputs": [child.node],
                               "group_by": group_by, "aggregates": aggs}
        if window:
            doc["window"] = window
        nid = self.add("aggregate", doc)
        # The plan's aggregate outputs its window, groups, then aggregates: reorder when the
        # job chose another order, so that positions stay Spark's.
        plan_order = (["window"] if window else []) + [g["name"] for g in group_by] + \
            [a["name"] for a in aggs]
        spark_order = [names[i] for i in order]
        if spark_order != plan_order:
            nid = self.add("project", {"step": "project", "version": 1, "inputs": [nid],
                                       "columns": [{"name": n, "expr": _quote(n)}
                                                   for n in spark_order]})
        return Out(nid, names, order, watermark_ms=child.watermark_ms)

    def _agg_call(self, e: Any, name: str, names: dict[int, str]) -> dict[str, Any]:
        if not e.filter().isEmpty():
            raise self.err("an aggregate FILTER clause cannot be expressed in a plan",
                           expected="an aggregate over a filtered input", found=str(e.sql()))
        fn = e.aggregateFunction()
        self.check_expr(fn)
        fname = str(fn.prettyName()).lower()
        args = [self.sql(a, names) for a in self.children(fn)]
        if fname == "count" and args == ["1"]:
            args = ["*"]
        call: dict[str, Any] = {"name": name, "function": fname, "args": args}
        if bool(e.isDistinct()):
            call["distinct"] = True
        return call

    def _window(self, plan: Any, wid: int) -> tuple[dict[str, Any], Any]:
        """The window Spark's analyzer expanded (``TimeWindowing``: a Project, or an Expand
        for hopping windows, with a ``named_struct(start, end)``; ``SessionWindowing``: a
        Project) read back into the plan's window, and the plan under it."""
        node = plan
        if self.cls(node) == "Filter":
            node = node.child()
        c = self.cls(node)
        if c == "Project":
            exprs = self.items(node.projectList())
        elif c == "Expand":
            exprs = [p for proj in self.items(node.projections()) for p in self.items(proj)]
        else:
            raise self.err("a window Spark built in a way Theseus does not read",
                           expected="window or session_window on an event-time column",
                           found=c)
        struct = None
        for e in exprs:
            if self.cls(e) == "Alias" and self.eid(e.toAttribute()) == wid:
                struct = e.child()
                break
            if c == "Expand" and self.cls(e) == "CreateNamedStruct":
                struct = e
                break
        if struct is None or self.cls(struct) != "CreateNamedStruct":
            raise self.err("a window Spark built in a way Theseus does not read",
                           expected="named_struct(start, end)", found=c)
        under = node.child()
        if self.cls(under) == "Filter" and self.cls(under.condition()) == "IsNotNull":
            under = under.child()  # Spark's own filter of rows without an event time
        start, end = self.items(struct.valExprs())
        col = self._first(start, "AttributeReference")
        if col is None:
            raise self.err("a window over an expression cannot be expressed",
                           expected="window(col('ts'), ...)", found=str(struct.sql())[:200])
        column = str(col.name())
        session = c == "Project" and self._first(start, "Remainder") is None
        if session:
            gap = self._first(end, "Literal", interval=True)
            if gap is None:
                raise self.err("a session window with a dynamic gap cannot be expressed",
                               expected="session_window(col, '5 minutes')",
                               found=str(end.sql())[:200])
            text = _interval_text(gap)
            return {"type": "session", "column": column, "size": text, "gap": text}, under
        rem = self._first(start, "Remainder")
        slide = int(rem.right().value())
        size = None
        add = self._first(end, "Add", literal_right=True)
        if add is not None:
            size = int(add.right().value())
        offsets = [x for x in self._all(start, "Subtract") if self.cls(x.right()) == "Literal"
                   and str(x.right().dataType().simpleString()) == "bigint"
                   and int(x.right().value()) != 0]
        if size is None or offsets:
            raise self.err("a window with a start offset cannot be expressed",
                           expected="window(col, size[, slide])", found=str(start.sql())[:200])
        window: dict[str, Any] = {"type": "tumbling" if size == slide else "hopping",
                                  "column": column, "size": duration(size)}
        if size != slide:
            window["slide"] = duration(slide)
        return window, under

    def _all(self, e: Any, cls: str) -> list[Any]:
        out, stack = [], [e]
        while stack:
            x = stack.pop(0)
            if self.cls(x) == cls:
                out.append(x)
            stack = self.children(x) + stack
        return out

    def _first(self, e: Any, cls: str, *, literal_right: bool = False,
               interval: bool = False) -> Any:
        for x in self._all(e, cls):
            if literal_right and self.cls(x.right()) != "Literal":
                continue
            if interval and "interval" not in str(x.dataType().simpleString()).lower() and \
                    str(x.dataType().simpleString()) != "string":
                continue
            return x
        return None

    # ---------------------------------------------------------------- join

    def _t_Join(self, plan: Any) -> Out:
        left = self.translate(plan.left())
        right = self.translate(plan.right())
        jt = str(plan.joinType().toString()).replace(" ", "")
        kind = JOIN_TYPES.get(jt) or JOIN_TYPES.get(self.cls(plan.joinType()).rstrip("$"))
        if kind is None:
            raise self.refuse(f"the join type {jt}", jt)
        lids = set(left.names)
        qualify = {i: left.node for i in left.names}
        qualify.update({i: right.node for i in right.names})
        names = {**left.names, **right.names}
        lkeys, rkeys, bound, cond = [], [], [], []
        conds = [] if plan.condition().isEmpty() else self._conjuncts(plan.condition().get())
        for e in conds:
            sides = self._sides(e, lids, set(right.names))
            if self.cls(e) == "EqualTo" and sides == {"left", "right"}:
                a, b = e.left(), e.right()
                sa = self._sides(a, lids, set(right.names))
                sb = self._sides(b, lids, set(right.names))
                if sa == {"left"} and sb == {"right"}:
                    lkeys.append(self.sql(a, left.names))
                    rkeys.append(self.sql(b, right.names))
                    continue
                if sa == {"right"} and sb == {"left"}:
                    lkeys.append(self.sql(b, left.names))
                    rkeys.append(self.sql(a, right.names))
                    continue
            text = self.sql(e, names, qualify)
            if sides == {"left", "right"} and self._event_time(e):
                bound.append(text)
            else:
                cond.append(text)
        for side, keys in ((left, lkeys), (right, rkeys)):
            if side.node in self.tables:
                # A table's key is what it is joined on (the record key holds those
                # columns, as a compacted topic's producer writes it).
                if not keys or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)
                                       for k in keys):
                    raise self.err("a table read must be joined on columns equal to its "
                                   "key columns", line=call_line(self.job.source, "join"),
                                   expected="stream.join(table, stream.k == table.k)",
                                   found=" AND ".join(keys) or "no equality on columns")
                self.nodes[side.node]["key_columns"] = list(keys)
        doc: dict[str, Any] = {"step": "join", "version": 1,
                               "inputs": [left.node, right.node], "type": kind,
                               "left_keys": lkeys, "right_keys": rkeys}
        if cond:
            doc["condition"] = " AND ".join(_paren(c, len(cond)) for c in cond)
        if bound:
            doc["time_bound"] = " AND ".join(_paren(b, len(bound)) for b in bound)
        nid = self.add("join", doc)
        from compat.serde import node_from_doc
        from compat.steps.join import join_output

        jnode = node_from_doc(self.nodes[nid])
        lnames = [left.names[i] for i in left.order]
        rnames = [right.names[i] for i in right.order] if kind not in (
            "left_semi", "left_anti") else []
        out_names: dict[int, str] = {}
        order: list[int] = []
        by_src = {("left", n.lower()): i for i, n in left.names.items()}
        by_src.update({("right", n.lower()): i for i, n in right.names.items()})
        produced = {}
        for name, side, src in join_output(jnode, lnames, rnames):
            i = by_src[(side, src.lower())]
            out_names[i] = name
            order.append(i)
            produced[(side, src.lower())] = name
        for (side, src), i in by_src.items():
            if side != "right" or i in out_names or ("left", src) not in produced:
                continue
            li = by_src[("left", src)]
            if kind == "inner":
                # A right key dropped as the pair of a left one reads as that left column.
                out_names[i] = produced[("left", src)]
            elif kind in ("right", "full"):
                # The plan's column is coalesce(left, right) (as Spark's join on a column
                # name gives it); either side alone is null where Spark's would not be.
                self.coalesced[(li, i)] = produced[("left", src)]
                del out_names[li]
        wm = [o.watermark_ms for o in (left, right) if o.watermark_ms is not None]
        return Out(nid, out_names, order, watermark_ms=min(wm) if wm else None)

    def _conjuncts(self, e: Any) -> list[Any]:
        if self.cls(e) == "And":
            return self._conjuncts(e.left()) + self._conjuncts(e.right())
        return [e]

    def _sides(self, e: Any, lids: set[int], rids: set[int]) -> set[str]:
        out = set()
        for a in self._all(e, "AttributeReference"):
            i = self.eid(a)
            out.add("left" if i in lids else "right" if i in rids else "other")
        return out

    def _event_time(self, e: Any) -> bool:
        return any(a.metadata().contains("spark.watermarkDelayMs")
                   for a in self._all(e, "AttributeReference"))


class _Raw(Out):
    """A Kafka source's raw record columns, before the value is parsed."""

    def __init__(self, node: str, cols: dict[str, int]) -> None:
        super().__init__(node, {}, [])
        self.cols = cols


def duration(micros: int) -> str:
    """Microseconds as the plan's duration text: ``30 seconds``, ``1 minute``..."""
    for unit, size in (("day", 86_400_000_000), ("hour", 3_600_000_000),
                       ("minute", 60_000_000), ("second", 1_000_000),
                       ("millisecond", 1000)):
        if micros and micros % size == 0:
            n = micros // size
            return f"{n} {unit}{'' if n == 1 else 's'}"
    return f"{micros} microseconds" if micros else "0 seconds"


def _micros(interval: Any) -> int | None:
    """A ``CalendarInterval`` (public fields) in microseconds; None with months."""
    from py4j.java_gateway import get_field

    if int(get_field(interval, "months")) != 0:
        return None
    return int(get_field(interval, "days")) * 86_400_000_000 + \
        int(get_field(interval, "microseconds"))


def _interval_text(lit: Any) -> str:
    v = lit.value()
    kind = str(lit.dataType().simpleString()).lower()
    if kind == "string":
        return str(v.toString())
    if kind == "interval":
        micros = _micros(v)
        if micros is not None:
            return duration(micros)
    if "interval" in kind and isinstance(v, int):  # day-time interval: microseconds
        return duration(v)
    return str(v.toString() if hasattr(v, "toString") else v)


def _paren_op(text: str) -> str:
    """A BETWEEN bound that is itself an operation, in parentheses."""
    return f"({text})" if " " in text and not text.startswith("(") else text


def _unparen(text: str) -> str:
    """``(a > 1)`` -> ``a > 1`` when the parentheses wrap the whole text."""
    while text.startswith("(") and text.endswith(")"):
        depth = 0
        for k, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and k < len(text) - 1:
                return text
        text = text[1:-1]
    return text


def _paren(text: str, n: int) -> str:
    return f"({text})" if n > 1 and (" OR " in text.upper()) else text


def _quote(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else \
        "`" + name.replace("`", "``") + "`"


__all__ = ["Translator", "duration"]


def avro_schema_text(e: Any) -> str | None:
    """The JSON schema a from_avro/to_avro expression was given, or None: a ``String`` or
    ``Option[String]`` field (spark-avro's expressions) or a string literal child (the SQL
    functions')."""
    v = e.jsonFormatSchema()
    if isinstance(v, str):
        return v
    cls = str(v.getClass().getSimpleName())
    if cls in ("Some", "None$"):
        return str(v.get()) if v.isDefined() else None
    if cls == "Literal":
        return None if v.value() is None else str(v.value())
    return None


def avro_options(t: Translator, e: Any) -> dict[str, str]:
    """The options a from_avro expression was given (empty: none)."""
    try:
        opts = e.options()
    except Exception:  # noqa: BLE001 - to_avro and older expressions have none
        return {}
    if t.cls(opts) == "CreateMap" and not t.children(opts):
        return {}
    if t.cls(opts) == "Literal":  # the SQL function's map literal (null or empty: none)
        return {} if opts.value() is None or "map()" in str(opts.sql()).lower() \
            else {"options": str(opts.sql())}
    try:
        return t.scala_map(opts)
    except Exception:  # noqa: BLE001 - an expression building the map
        return {"options": str(opts.sql())}
