"""Plan -> Spark: builds the Structured Streaming query a plan describes.

The same plan always builds the same query: nodes are built once each (a node feeding two
consumers is one DataFrame), in the plan's topological order, and Spark numbers stateful
operators by the shape of the logical plan, which only the graph decides.  Expressions reach
Spark only after ``compat`` validated them (syntax, columns, types, no Java-calling
functions); ``F.expr`` is then given the user's text, never anything built from it by string
formatting except qualified column names.

Retractions (Flink's changelog modes): a filter over an upsert stream does not drop a row
that stops matching; it marks it ``_theseus_op = 'D'`` so the sink writes a tombstone for its
key.  ``top_n`` emits the same marker for rows that fall out of the top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compat.errors import RuntimeFailure
from compat.infer import INSERT, NodeInfo
from compat.model import (
    Aggregate,
    Deduplicate,
    Explode,
    Filter,
    Join,
    Node,
    Plan,
    Project,
    Recursive,
    Sink,
    Source,
    StartGate,
    StopGate,
    TopN,
    Union,
)

OP = "_theseus_op"  # 'U' (insert or update) or 'D' (retract the row's key)
SOURCE_FORMAT = "theseus_kafka"


@dataclass
class BuildOptions:
    bootstrap: str
    store: str | None = None
    query: str | None = None  # name used for gate state and transactional ids
    max_records_per_batch: int = 100_000
    available_now: bool = False
    trigger_interval: str = "1 second"
    checkpoint: str | None = None
    start_gate: Any = None  # passed to the sink writer (a later issue opens and closes it)
    output_topic: str | None = None  # override (comparison runs write elsewhere)
    shadow_topic: str | None = None  # where a closed start gate sends output (--compare)
    on_retire: Any = None  # called once the query handed its output over to a migration


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def ddl(columns: tuple[tuple[str, str], ...], names: tuple[str, ...]) -> str:
    return ", ".join(f"{_q(n)} {t.upper() if '<' not in t else t}"
                     for n, (_, t) in zip(names, columns))


class Builder:
    def __init__(self, spark: Any, plan: Plan, opts: BuildOptions) -> None:
        if not plan.info:
            from compat.infer import analyze
            analyze(plan)
        self.spark = spark
        self.plan = plan
        self.opts = opts
        self.frames: dict[str, Any] = {}
        from pyspark.sql import functions as F  # noqa: N812

        self.F = F
        from gates.source import register

        register(spark)

    # -- entry points -------------------------------------------------------------------
    def dataframe(self, node_id: str | None = None) -> Any:
        """The DataFrame of a node (the sink's input when ``node_id`` is None)."""
        target = node_id or self.plan.sink.inputs[0]
        for nid, node in self.plan.nodes.items():
            if nid in self.frames or isinstance(node, Sink):
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

    def start(self) -> Any:
        """Start the streaming query writing to the sink; returns the StreamingQuery."""
        sink = self.plan.sink
        df = self.dataframe()
        info = self.plan.info[sink.id]
        from gates.sink import make_writer

        writer = make_writer(self.opts.bootstrap, self.opts.output_topic or sink.topic,
                             list(sink.key_columns), self.opts.query or self.plan.query,
                             sink.delivery, start_gate=self.opts.start_gate,
                             shadow_topic=self.opts.shadow_topic, on_done=self._on_done(),
                             retired=self._retired())
        w = df.writeStream.queryName(self.opts.query or self.plan.query) \
            .outputMode(sink.mode).foreachBatch(writer)
        if self.opts.checkpoint:
            w = w.option("checkpointLocation", self.opts.checkpoint)
        if self.opts.available_now:
            w = w.trigger(availableNow=True)
        else:
            w = w.trigger(processingTime=self.opts.trigger_interval)
        del info
        return w.start()

    # -- steps ----------------------------------------------------------------------------
    def _build(self, node: Node) -> Any:
        fn = getattr(self, "_" + node.step)
        try:
            return fn(node, [self.frames[i] for i in node.inputs], self.plan.info[node.id])
        except RuntimeFailure:
            raise
        except Exception as e:  # Spark's analysis errors, with the node they belong to
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RuntimeFailure(f"Spark cannot build this step: {msg}",
                                 file=self.plan.file, node=node.id,
                                 pointer=self.plan.pointer(node.id)) from None

    def _source(self, node: Source, ins: list[Any], info: NodeInfo) -> Any:
        opts = {
            "bootstrap": self.opts.bootstrap, "topic": node.topic,
            "partitions": str(node.partitions), "format": node.format,
            "schema": ddl(info.columns, info.names), "role": node.role,
            "startingOffsets": node.starting_offsets,
            "maxRecordsPerBatch": str(self.opts.max_records_per_batch),
        }
        if node.key_columns:
            opts["key_columns"] = ",".join(node.key_columns)
        if self.opts.store:
            opts["store"] = self.opts.store
            opts["query"] = self.opts.query or self.plan.query
        if node.role == "table":
            # A table is read in full (latest value per key) at every micro-batch: Spark
            # re-plans the static side of a stream-static join each time.
            return self.spark.read.format(SOURCE_FORMAT).options(**opts).load()
        df = self.spark.readStream.format(SOURCE_FORMAT).options(**opts).load()
        if node.event_time and self._watermarks_read():
            df = df.withWatermark(node.event_time.column, node.event_time.watermark)
        return df

    def _watermarks_read(self) -> bool:
        """Whether a stateful step of the plan reads an event-time watermark: a window, a
        grouping key on a watermarked column, a stream-stream join, a deduplication, a
        top-N (any stateful step but a plain aggregate counts, to be safe). When none does,
        the sources' watermarks are left out: they would change no output, only make Spark
        run an empty batch each time a watermark advances with no new input (state
        eviction that has nothing to evict), taking CPU from the batches that carry data."""
        for nid, node in self.plan.nodes.items():
            if not self.plan.info[nid].stateful:
                continue
            if not isinstance(node, Aggregate) or node.window is not None:
                return True
            marks = self.plan.info[node.inputs[0]].watermarks
            if any(m in g.expr.lower() for g in node.group_by for m in marks):
                return True
        return False

    def _filter(self, node: Filter, ins: list[Any], info: NodeInfo) -> Any:
        (df,) = ins
        F = self.F
        src = self.plan.info[node.inputs[0]]
        if src.mode == INSERT:
            return df.where(F.expr(node.predicate))
        # Over updates: keep the row, but retract its key when it stops matching.
        keep = F.coalesce(F.expr(node.predicate), F.lit(False))
        prev = F.col(OP) if OP in df.columns else F.lit("U")
        return df.withColumn(OP, F.when(keep, prev).otherwise(F.lit("D")))

    def _project(self, node: Project, ins: list[Any], info: NodeInfo) -> Any:
        (df,) = ins
        cols = [self.F.expr(c.expr).alias(c.name) for c in node.columns]
        if OP in df.columns:
            cols.append(self.F.col(OP))
        return df.select(*cols)

    def _explode(self, node: Explode, ins: list[Any], info: NodeInfo) -> Any:
        (df,) = ins
        fn = self.F.explode_outer if node.outer else self.F.explode
        return df.select("*", fn(self.F.expr(node.expr)).alias(node.alias))

    def _union(self, node: Union, ins: list[Any], info: NodeInfo) -> Any:
        out = ins[0]
        for other in ins[1:]:
            out = out.unionByName(other)
        return out

    def _aggregate(self, node: Aggregate, ins: list[Any], info: NodeInfo) -> Any:
        (df,) = ins
        F = self.F
        keys = []
        if node.window:
            w = node.window
            if w.type == "session":
                keys.append(F.session_window(F.col(w.column), w.gap or w.size).alias("window"))
            elif w.type == "hopping":
                keys.append(F.window(F.col(w.column), w.size, w.slide).alias("window"))
            else:
                keys.append(F.window(F.col(w.column), w.size).alias("window"))
        keys += [F.expr(g.expr).alias(g.name) for g in node.group_by]
        aggs = []
        for a in node.aggregates:
            args = ", ".join(a.args) if a.args else ""
            text = f"{a.function}({'DISTINCT ' if a.distinct else ''}{args})"
            aggs.append(F.expr(text).alias(a.name))
        return df.groupBy(*keys).agg(*aggs)

    def _join(self, node: Join, ins: list[Any], info: NodeInfo) -> Any:
        F = self.F
        left, right = ins
        lid, rid = node.inputs
        linfo, rinfo = self.plan.info[lid], self.plan.info[rid]
        # Keys may be expressions: compute them on each side, then join on the results.
        lk = [f"__theseus_lk{i}" for i in range(len(node.left_keys))]
        rk = [f"__theseus_rk{i}" for i in range(len(node.right_keys))]
        for name, e in zip(lk, node.left_keys):
            left = left.withColumn(name, F.expr(e))
        for name, e in zip(rk, node.right_keys):
            right = right.withColumn(name, F.expr(e))
        lq, rq = left.alias(lid), right.alias(rid)
        cond = None
        for a, b in zip(lk, rk):
            c = F.col(f"{_q(lid)}.{a}") == F.col(f"{_q(rid)}.{b}")
            cond = c if cond is None else cond & c
        for extra in (node.condition, node.time_bound):
            if extra:
                c = F.expr(extra)
                cond = c if cond is None else cond & c
        how = {"left_semi": "left_semi", "left_anti": "left_anti", "full": "full_outer",
               "left": "left_outer", "right": "right_outer"}.get(node.type, node.type)
        joined = lq.join(rq, on=cond, how=how)
        # Output columns as DESIGN.md says: left's, then right's, a clash dropped when it is
        # a paired equi-join key and renamed <right id>_<name> otherwise.
        cols = [F.col(f"{_q(lid)}.{_q(n)}").alias(n) for n in linfo.names]
        if node.type not in ("left_semi", "left_anti"):
            lnames = {n.lower() for n in linfo.names}
            paired = {(a.lower(), b.lower()) for a, b in zip(node.left_keys, node.right_keys)}
            for n in rinfo.names:
                low = n.lower()
                if low in lnames:
                    if (low, low) in paired:
                        if node.type in ("right", "full"):
                            # the key of an unmatched right row lives on the right side
                            pos = [x.lower() for x in linfo.names].index(low)
                            cols[pos] = F.coalesce(F.col(f"{_q(lid)}.{_q(n)}"),
                                                   F.col(f"{_q(rid)}.{_q(n)}")).alias(n)
                        continue
                    cols.append(F.col(f"{_q(rid)}.{_q(n)}").alias(f"{rid}_{n}"))
                else:
                    cols.append(F.col(f"{_q(rid)}.{_q(n)}").alias(n))
        return joined.select(*cols)

    def _deduplicate(self, node: Deduplicate, ins: list[Any], info: NodeInfo) -> Any:
        (df,) = ins
        if node.within:
            return df.dropDuplicatesWithinWatermark(list(node.keys))
        return df.dropDuplicates(list(node.keys))

    def _top_n(self, node: TopN, ins: list[Any], info: NodeInfo) -> Any:
        from migrate.top_n import top_n

        return top_n(self, node, ins[0], info)

    def _recursive(self, node: Recursive, ins: list[Any], info: NodeInfo) -> Any:
        raise RuntimeFailure("recursive steps are checked but cannot run yet",
                             file=self.plan.file, node=node.id,
                             pointer=self.plan.pointer(node.id, "step"),
                             expected="a plan without recursion", found="recursive")

    def _stop_gate(self, node: StopGate, ins: list[Any], info: NodeInfo) -> Any:
        return ins[0]  # the stop gate lives in the gated source

    def _start_gate(self, node: StartGate, ins: list[Any], info: NodeInfo) -> Any:
        return ins[0]  # the start gate lives in the gated sink


def build(spark: Any, plan: Plan, opts: BuildOptions) -> Builder:
    return Builder(spark, plan, opts)
