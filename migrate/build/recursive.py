"""``recursive`` on Spark: a fixpoint loop inside each micro-batch over state the step keeps.

A streaming DataFrame cannot loop, so a plan with recursive steps runs as a chain of
streaming queries in one Spark session (``QueryChain``):

1. A **loop query** per recursive step reads the step's stream inputs (the base rows and
   the streams its body reads, e.g. edges) as one tagged stream.  Its ``foreachBatch``
   computes the batch's new rows semi-naively: the new base rows, plus the body over the
   old rows with the new edges, then the body over each iteration's new rows only, until
   an iteration derives nothing (``set``: rows already derived are dropped, so cycles
   end) or ``max_iterations`` is reached (``on_limit``).  It writes the new rows to an
   internal topic through the gated sink (one Kafka transaction per batch, a replayed batch
   is skipped) after appending them to its state.
2. The **output query** is the plan with every recursive step replaced by a source reading
   that internal topic (read-committed): the steps after the recursion (aggregates) and the
   sink run there as in any plan.

State lives in the query's checkpoint directory, beside Spark's own files:
``<checkpoint>/recursive/<step id>/state/{R,E<i>}/batch=<n>/`` holds the rows derived (R)
and the further stream inputs received (E) in batch n, as Parquet; the loop query's Spark
checkpoint is ``<checkpoint>/recursive/<step id>/spark``.  Batch n reads only batches < n
and first deletes what an interrupted attempt of n left, so a replay (Spark replays the
last uncommitted batch with the same offsets) recomputes the same rows, and the sink skips
them if they were already committed: exactly once, across a SIGKILL.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from compat.errors import RuntimeFailure
from compat.infer import InferContext, NodeInfo, analyze
from compat.model import Column, Plan
from compat.steps import Recursive, Source
from compat.steps.recursive import body_infos, body_order, body_paths
from gates.deadline import Deadline
from migrate.build.core import Builder, build_step, q, register_chain_start
from migrate.build.recursive_sql import LVL, ROW, Query, side_inputs, why_not, with_recursive

TAG = "__theseus_in"
#: a row of the recursion as one struct column: the key of the set of rows known
KEY = ROW
#: the levels of a batch's first WITH RECURSIVE query at least (then twice the levels the
#: batch before needed, and each further query twice as many as the one before)
FIRST_LEVELS = 8
log = logging.getLogger("theseus.recursive")


@build_step.register
def _build(node: Recursive, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    # Reached only when a recursive plan is built as one DataFrame (Builder.dataframe of
    # a node at or after the recursion): Builder.start runs it as a chain instead.
    raise RuntimeFailure("a recursive step runs as a loop query of its own: start the plan "
                         "with Builder.start (theseus run), not as one DataFrame",
                         file=b.plan.file, node=node.id, pointer=b.plan.pointer(node.id),
                         expected="Builder.start", found="Builder.dataframe")


def has_recursion(plan: Plan) -> bool:
    return any(isinstance(n, Recursive) for n in plan.nodes.values())


def loop_gate(instance: str, rec_id: str) -> str:
    """The name under which the loop query of step ``rec_id`` of ``instance`` reads its
    gate and writes its acknowledgements (and its sink's transactional id): apart from the
    instance's own, which the output query (the plan's sink) keeps.  A migration caps the
    loops at the sources' cut C and the output queries at the cut of the internal topics
    (``migrate.migration``), so the two must not share one gate: a cap is per name, and
    under a shared name the output query's commits would acknowledge offsets of the loop's
    sources that its batch had not committed yet."""
    return f"{instance}.{rec_id}.loop"


def internal_topic(b: Builder, rec: Recursive) -> str:
    """The topic the loop query writes and the output query reads: named by the query and
    the step, and by the checkpoint (a migration's new query gets a topic of its own)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", b.opts.query or b.plan.query)
    where = hashlib.sha1((b.opts.checkpoint or "").encode()).hexdigest()[:8]
    return f"theseus.recursive.{name}.{rec.id}.{where}"


def rewritten(plan: Plan, topics: dict[str, str], partitions: int) -> Plan:
    """The plan with each recursive step replaced by a source reading its internal topic."""
    nodes = {}
    for nid, node in plan.nodes.items():
        if isinstance(node, Recursive):
            info = plan.info[nid]
            node = Source(id=nid, topic=topics[nid], partitions=partitions, format="json",
                          role="stream",
                          schema=tuple(Column(name=n, type=t) for n, (_, t)
                                       in zip(info.names, info.columns)))
        nodes[nid] = node
    out = replace(plan, nodes=nodes, info={})
    analyze(out)
    return out


def start_chain(b: Builder) -> QueryChain:
    """Start the loop queries, then the output query (after them with available-now)."""
    from gates.sink import make_writer

    plan = b.plan
    recs = [n for n in plan.nodes.values() if isinstance(n, Recursive)]
    partitions = plan.state_partitions or 1
    topics = {r.id: internal_topic(b, r) for r in recs}
    _create_topics(b.opts.bootstrap, list(topics.values()), partitions)
    flat = rewritten(plan, topics, partitions)
    fb = Builder(b.spark, flat, b.opts)  # builds the inputs of each loop and the output
    chain = QueryChain(b.opts.available_now)
    root = Path(b.opts.checkpoint) if b.opts.checkpoint else \
        Path(tempfile.mkdtemp(prefix="theseus-recursive-"))
    instance = b.opts.query or plan.query
    for rec in recs:
        gate = loop_gate(instance, rec.id)
        # the loop's sources read their gate under the loop's name (see loop_gate)
        lb = Builder(b.spark, flat, replace(b.opts, query=gate))
        loop = Loop(b, rec, lb, root / "recursive" / rec.id, chain, gate)
        writer = make_writer(b.opts.bootstrap, topics[rec.id], [], gate, "exactly_once",
                             on_done=_promote(b.opts.store, gate),
                             producer_config=b.opts.kafka())
        chain.add(lambda loop=loop, writer=writer: loop.start(writer))
        chain.loops[rec.id] = {"gate": gate, "topic": topics[rec.id]}
    chain.add(lambda: Builder.start(fb))
    chain.begin()
    return chain


register_chain_start(start_chain)


def _promote(store: str | None, gate: str) -> Callable[[int], None] | None:
    """After a loop batch committed: acknowledge the cap it reached (gates.state), as the
    plan's sink does for the output query, so that a migration sees the loop at its cut
    without waiting for the loop's next trigger."""
    if not store:
        return None
    from gates.state import promote_pending

    def done(batch_id: int) -> None:
        promote_pending(store, gate)

    return done


def _create_topics(bootstrap: str, topics: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from gates.broker import client_conf

    admin = AdminClient(client_conf(bootstrap))
    have = admin.list_topics(timeout=30).topics
    todo = [NewTopic(t, partitions, 1) for t in topics if t not in have]
    if not todo:
        return
    for t, fut in admin.create_topics(todo, request_timeout=30).items():
        try:
            fut.result(timeout=30)
        except Exception as e:  # created meanwhile by another host of the same query
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise RuntimeFailure(f"cannot create the internal topic of a recursive step: "
                                     f"{e}", expected="a topic the broker accepts",
                                     found=t) from None
    deadline = Deadline(30)
    while not deadline.expired():
        md = admin.list_topics(timeout=30).topics
        if all(t.topic in md and md[t.topic].error is None and
               all(p.leader >= 0 for p in md[t.topic].partitions.values()) for t in todo):
            return
        time.sleep(0.1)


class _BodyBuilder:
    """What the step builders read from a Builder, for the body's own little plan."""

    def __init__(self, b: Builder, rec: Recursive, infos: dict[str, NodeInfo]) -> None:
        self.spark = b.spark
        self.F = b.F
        self.opts = b.opts
        self.plan = Plan(query=b.plan.query, nodes={n.id: n for n in rec.body},
                         file=b.plan.file, info=infos,
                         pointers={n.id: b.plan.pointers.get(f"{rec.id}/{n.id}", "")
                                   for n in rec.body})


class Loop:
    """The loop query of one recursive step and its per-batch fixpoint."""

    def __init__(self, b: Builder, rec: Recursive, fb: Builder, root: Path,
                 chain: QueryChain, name: str) -> None:
        self.rec = rec
        self.name = name
        self.plan = b.plan
        self.fb = fb
        self.root = root
        self.chain = chain
        ins = [b.plan.info[i] for i in rec.inputs]
        self.infos = body_infos(rec, ins, InferContext(b.plan.file,
                                                       {n.id: n for n in rec.body},
                                                       b.plan.pointers, "append"))
        self.bb = _BodyBuilder(b, rec, self.infos)
        self.order = body_order(rec)
        self.linear = all(n <= 1 for n in body_paths(rec).values())
        self.set = rec.union == "set"
        if not self.linear and not self.set:
            raise RuntimeFailure("a bag (UNION ALL) recursion needs a body that reads the "
                                 "loop and each further input along one path at most",
                                 file=b.plan.file, node=rec.id,
                                 pointer=b.plan.pointer(rec.id, "body"),
                                 expected="a linear body, or union 'set'",
                                 found="an input read along several paths")
        # stream inputs arrive through the loop query; tables are read at every batch
        self.streams = [i for i, nid in enumerate(rec.inputs) if b.plan.info[nid].stream]
        if 0 not in self.streams:
            raise RuntimeFailure("the base of a recursive step must be a stream",
                                 file=b.plan.file, node=rec.id,
                                 pointer=b.plan.pointer(rec.id, "inputs/0"),
                                 expected="a stream", found="a table")
        self.names = {i: list(b.plan.info[nid].names) for i, nid in enumerate(rec.inputs)}
        self.schemas: dict[int, Any] = {}
        #: why a batch's loop cannot be one WITH RECURSIVE query (None: it is)
        self.sql_why = why_not(rec, self.infos)
        self.last_levels = 0

    # -- the query ---------------------------------------------------------------------
    def start(self, writer: Any) -> Any:
        F = self.fb.F
        frames = {i: self.fb.dataframe(self.rec.inputs[i]) for i in self.streams}
        for i, df in frames.items():
            self.schemas[i] = df.select(*[F.col(q(n)) for n in self.names[i]]).schema
        tagged = None
        for i in self.streams:
            cols = [F.lit(i).alias(TAG)]
            for j in self.streams:
                s = F.struct(*[F.col(q(n)) for n in self.names[j]])
                cols.append((s if j == i else F.lit(None).cast(self.schemas[j]))
                            .alias(f"{TAG}{j}"))
            part = frames[i].select(*cols)
            tagged = part if tagged is None else tagged.unionByName(part)
        self.writer = writer
        opts = self.fb.opts
        w = tagged.writeStream.queryName(self.name) \
            .foreachBatch(self.batch).option("checkpointLocation", str(self.root / "spark"))
        w = w.trigger(availableNow=True) if opts.available_now else \
            w.trigger(processingTime=opts.trigger_interval)
        return w.start()

    # -- one micro-batch -----------------------------------------------------------------
    def batch(self, df: Any, batch_id: int) -> None:
        """Step 1. Forget what an interrupted attempt of this batch left.  Step 2. Read the
        state of the batches before.  Step 3. Iterate to the fixpoint.  Step 4. Record the
        new rows and edges.  Step 5. Write the new rows (exactly once)."""
        t0 = time.monotonic()
        F = self.fb.F
        state = self.root / "state"
        kept = _Kept()
        # The loop runs in the batch's own session (the loop query's clone of the session)
        # without adaptive execution: it would run every shuffle and broadcast of an
        # iteration as a job of its own, and it does not trust the partitioning of the
        # checkpointed rows known, so every iteration would shuffle them all again (see
        # _fixpoint).  Its WITH RECURSIVE queries bound their levels themselves, so Spark's
        # bound on their rows (a million by default) is lifted, and a small level is not
        # collected to the driver (Spark would compute it a second time to do so).  The
        # plan's other queries keep their own sessions' settings.
        spark = df.sparkSession
        if not spark._jsparkSession.equals(self.fb.spark._jsparkSession):
            for key, value in (("spark.sql.adaptive.enabled", "false"),
                               ("spark.sql.cteRecursionRowLimit", "-1"),
                               ("spark.sql.cteRecursionAnchorRowsLimitToConvertToLocalRelation",
                                "0")):
                spark.conf.set(key, value)
        try:
            # Step 1.
            for d in [*state.glob(f"*/batch={batch_id}"), self.root / "tmp"]:
                shutil.rmtree(d, ignore_errors=True)
            df = df.localCheckpoint(eager=True)
            new = {i: df.where(F.col(TAG) == i).select(f"{TAG}{i}.*") for i in self.streams}
            # Step 2.
            old = {i: self._read(spark, state / f"E{i}", i, batch_id)
                   for i in self.streams if i}
            r_old = self._read(spark, state / "R", 0, batch_id)
            # a table as it is now, read once for the whole batch's loop
            tables = {i: self.fb.dataframe(self.rec.inputs[i]).localCheckpoint(eager=True)
                      for i in range(1, len(self.rec.inputs)) if i not in self.streams}
            # every iteration joins with the further inputs: kept in memory for the batch
            # rather than each iteration rescanning the state's Parquet files
            full = {i: kept.keep(old[i].unionByName(new[i]))[0] for i in old}
            full.update(tables)
            # Step 3.
            rows, n_rows, iterations, hit, how = self._fixpoint(spark, new[0], r_old, old,
                                                                new, full, kept)
            # Step 4.
            counts = {}
            for i in self.streams:
                if i:
                    counts[f"E{i}"] = self._write(new[i],
                                                  state / f"E{i}" / f"batch={batch_id}")
            counts["R"] = self._write(rows, state / "R" / f"batch={batch_id}", n_rows)
            if hit:
                msg = (f"recursive step '{self.rec.id}' reached max_iterations="
                       f"{self.rec.max_iterations} in batch {batch_id} and the body still "
                       f"derives new rows")
                if self.rec.on_limit == "error":
                    raise RuntimeFailure(msg, file=self.plan.file, node=self.rec.id,
                                         pointer=self.plan.pointer(self.rec.id,
                                                                   "max_iterations"),
                                         expected=f"a fixpoint within "
                                         f"{self.rec.max_iterations} iterations",
                                         found=f"new rows at iteration {iterations}")
                self.chain.note(f"  warning: {msg}; on_limit 'return' keeps what was derived")
            # Step 5.
            self.writer(rows, batch_id)
        finally:
            kept.release()
        self.chain.note(f"  recursive '{self.rec.id}' batch {batch_id}: "
                        f"{counts['R']} new rows in {iterations} iteration(s), "
                        f"{int((time.monotonic() - t0) * 1000)} ms ({how})")

    def _fixpoint(self, spark: Any, base: Any, r_old: Any, old: dict[int, Any],
                  new: dict[int, Any], full: dict[int, Any],
                  kept: _Kept) -> tuple[Any, int, int, bool, str]:
        """The batch's new rows, their count, the iterations, whether the limit was hit,
        and how they were computed: as WITH RECURSIVE queries where the body allows it
        (``_recursive_sql``), else by the DataFrame loop (``_loop``).  With set semantics
        the rows known are first kept as one column (the row as a struct, whose equality
        is the null-safe equality of ``subtract``), hash-partitioned and sorted on it, so
        that removing them from new rows shuffles the new rows only."""
        parts = int(spark.conf.get("spark.sql.shuffle.partitions"))
        known: list[Any] = []
        if self.set:
            known.append(kept.cut(self._as_key(r_old).repartition(parts, KEY)
                                  .sortWithinPartitions(KEY))[0])
            r_old = self._rows(known[0])
        if self.sql_why is None:
            done = self._recursive_sql(spark, base, r_old, old, new, full, list(known), kept)
            if done is not None:
                return done
        return (*self._loop(base, r_old, old, new, full, known, parts, kept),
                f"DataFrame loop: {self.sql_why}")

    def _extended(self, r_old: Any, old: dict[int, Any], new: dict[int, Any],
                  full: dict[int, Any]) -> list[Any]:
        """The old rows extended by the batch's new stream rows, once (a linear body):
        for each further stream k, the body over the old rows with the streams before k
        as they were, k's new rows, the ones after k as they are now (each new derivation
        counted once)."""
        streams = sorted(old)
        out = []
        for m, k in enumerate(streams):
            ins = dict(full)
            ins.update({j: old[j] for j in streams[:m]})
            ins[k] = new[k]
            out.append(self._body(r_old, ins))
        return out

    def _loop(self, base: Any, r_old: Any, old: dict[int, Any], new: dict[int, Any],
              full: dict[int, Any], known: list[Any], parts: int,
              kept: _Kept) -> tuple[Any, int, int, bool]:
        """Semi-naive: D0 = new base rows; D1 = body(D0, all edges) ∪ body(old rows, new
        edges); Dk+1 = body(Dk, all edges); with set semantics minus every row known.

        Every Dk is kept in memory until the batch ends and its row count, taken by the job
        that materialises it, is the fixpoint test.  Each Dk is keyed, partitioned and
        sorted as the old rows are when it is made, and appended to ``known``."""
        limit = self.rec.max_iterations
        if self.set:
            d, n = self._unknown(base, known, parts, kept)
        else:
            d, n = kept.cut(base)
        derived, total = [d], n
        i = 0
        while True:
            i += 1
            frontier = self._rows(d) if self.set else d
            if self.linear:
                terms = [self._body(frontier, full)]
                if i == 1:
                    terms += self._extended(r_old, old, new, full)
                nxt = _union(terms)
            else:
                nxt = self._body(_union([self._rows(k) for k in known]), full)
            nxt, n = self._unknown(nxt, known, parts, kept) if self.set else kept.cut(nxt)
            if not n:
                break
            derived.append(nxt)
            total += n
            d = nxt
            if i >= limit:
                break
        rows = _union([self._rows(k) for k in derived] if self.set else derived)
        return rows, total, i, bool(n) and i >= limit

    def _recursive_sql(self, spark: Any, base: Any, r_old: Any, old: dict[int, Any],
                       new: dict[int, Any], full: dict[int, Any], known: list[Any],
                       kept: _Kept) -> tuple[Any, int, int, bool, str] | None:
        """The batch's loop as Spark SQL ``WITH RECURSIVE`` queries (``recursive_sql``),
        each running a chunk of levels: the first as many as twice the levels the batch
        before needed (at least ``FIRST_LEVELS``), each further one twice the one before,
        until a chunk's last level holds no new row or ``max_iterations`` is reached.  The
        chunks bound what a cycle costs under set semantics: the CTE cannot see rows it
        derived at earlier levels, so it goes round a cycle to the chunk's end, and the
        next chunk starts from the rows of that last level that are new.

        Returns None when Spark refuses the query (then the DataFrame loop runs, and runs
        for the batches after: the body is the same)."""
        from pyspark.errors import AnalysisException

        F = self.fb.F
        limit = self.rec.max_iterations
        fields = self.schemas[0].fields
        cols = [F.col(q(f.name)) for f in fields]
        row = [(f.name, f.dataType.simpleString()) for f in fields]
        views = _Views(spark, self.rec.id)
        try:
            sides = {sid: views.add(df) for sid, df in self._sides(full, kept).items()}
            anchor = _union([base.select(*cols, F.lit(0).alias(LVL))]
                            + [e.select(*cols, F.lit(1).alias(LVL))
                               for e in self._extended(r_old, old, new, full)])
            if self.set:
                anchor = self._fresh(anchor, known)
            start, stop = 0, min(limit, max(FIRST_LEVELS, 2 * self.last_levels))
            pieces, levels, queries = [], {}, 0
            while True:
                text = with_recursive(self.rec, self.infos, row, Query(
                    anchor=views.add(anchor), sides=sides,
                    known=tuple(views.add(k) for k in known), start=start, stop=stop))
                log.debug("recursive '%s': levels %d-%d as %s", self.rec.id, start, stop, text)
                out = spark.sql(text)
                queries += 1
                if self.set:
                    # a row reached again at a later level of the query: its first level
                    out = self._as_key(out, LVL).groupBy(KEY).agg(F.min(LVL).alias(LVL))
                if start:
                    out = out.where(F.col(LVL) > start)  # the anchor: the chunk before's
                if self.set:
                    out = out.sortWithinPartitions(KEY)
                out = kept.cut_lazy(out)
                # the job that runs the query's levels and keeps their rows
                got = {r[0]: r[1] for r in out.groupBy(LVL).count().collect()}
                levels.update(got)
                pieces.append(out)
                if not got.get(stop) or stop >= limit:
                    break
                anchor = out.where(F.col(LVL) == stop)
                if self.set:
                    anchor = anchor.select(f"{KEY}.*", LVL)
                    known.append(out)
                start, stop = stop, min(limit, stop + 2 * (stop - start))
        except AnalysisException as e:
            self.sql_why = "Spark refuses its WITH RECURSIVE: " + str(e).splitlines()[0]
            log.debug("recursive '%s': %s", self.rec.id, self.sql_why)
            return None
        except Exception as e:  # a bound of Spark's own (rows): this batch loops
            if "RECURSION_" not in str(e):
                raise
            log.debug("recursive '%s': %s", self.rec.id, str(e).splitlines()[0])
            return None
        finally:
            views.drop()
        top = max((lv for lv, n in levels.items() if n), default=0)
        self.last_levels = top
        rows = _union([p.select(f"{KEY}.*") if self.set else p.drop(LVL) for p in pieces])
        return (rows, sum(levels.values()), min(top + 1, limit), bool(levels.get(limit)),
                f"WITH RECURSIVE: {queries} quer{'y' if queries == 1 else 'ies'}")

    def _fresh(self, rows: Any, known: list[Any]) -> Any:
        """``rows`` (with their level) once each, at their first level, minus the rows
        known."""
        F = self.fb.F
        out = self._as_key(rows, LVL).groupBy(KEY).agg(F.min(LVL).alias(LVL))
        for piece in known:
            out = out.join(piece.select(KEY).hint("merge"), on=KEY, how="left_anti")
        return out.select(f"{KEY}.*", LVL)

    def _sides(self, full: dict[int, Any], kept: _Kept) -> dict[str, Any]:
        """What the loop's chain reads besides the loop: further inputs as they are for
        the batch, body steps over them built once and kept for the batch."""
        frames = {fid: full[k] for k, fid in enumerate(self.rec.further_inputs, 1)}
        body = {n.id: n for n in self.rec.body}
        out = {}
        for sid in side_inputs(self.rec):
            if sid not in frames:
                for bid in self.order:
                    node = body[bid]
                    if bid not in frames and all(i in frames for i in node.inputs):
                        frames[bid] = build_step(node, self.bb, [frames[i] for i in node.inputs],
                                                 self.infos[bid])
                frames[sid] = kept.keep(frames[sid])[0]
            out[sid] = frames[sid]
        return out

    def _as_key(self, rows: Any, *more: str) -> Any:
        F = self.fb.F
        return rows.select(F.struct(*[F.col(q(f.name)) for f in self.schemas[0].fields])
                           .alias(KEY), *more)

    def _rows(self, keyed: Any) -> Any:
        return keyed.select(f"{KEY}.*")

    def _unknown(self, rows: Any, known: list[Any], parts: int,
                 kept: _Kept) -> tuple[Any, int]:
        """The distinct rows of ``rows`` that no piece of ``known`` holds, kept (keyed,
        partitioned and sorted as the pieces are) and appended to ``known``."""
        out = self._as_key(rows).repartition(parts, KEY).dropDuplicates([KEY])
        for piece in known:
            # a merge join of co-partitioned, sorted sides: a broadcast would be a job of
            # its own per piece and iteration
            out = out.join(piece.hint("merge"), on=KEY, how="left_anti")
        out, n = kept.cut(out.sortWithinPartitions(KEY))
        known.append(out)
        return out, n

    def _body(self, loop: Any, inputs: dict[int, Any]) -> Any:
        frames = {self.rec.body_input: loop}
        for k, fid in enumerate(self.rec.further_inputs, 1):
            frames[fid] = inputs[k]
        body = {n.id: n for n in self.rec.body}
        for bid in self.order:
            node = body[bid]
            frames[bid] = build_step(node, self.bb, [frames[i] for i in node.inputs],
                                     self.infos[bid])
        out = frames[self.rec.body_output]
        return out.select(*[self.fb.F.col(q(o)).cast(t.dataType).alias(t.name)
                            for o, t in zip(out.columns, self.schemas[0].fields)])

    def _read(self, spark: Any, path: Path, i: int, batch_id: int) -> Any:
        if path.exists() and any(path.glob("batch=*/*.parquet")):
            df = spark.read.schema(self._with_batch(i)).parquet(str(path))
            return df.where(self.fb.F.col("batch") < batch_id).drop("batch")
        return spark.createDataFrame([], self.schemas[i])

    def _with_batch(self, i: int) -> Any:
        from pyspark.sql.types import LongType, StructField, StructType

        return StructType([*self.schemas[i].fields, StructField("batch", LongType())])

    def _write(self, df: Any, path: Path, n: int | None = None) -> int:
        n = df.count() if n is None else n
        if n:
            # written aside, then renamed: a batch directory is complete or absent
            tmp = self.root / "tmp" / f"{path.parent.name}-{path.name}"
            df.coalesce(1).write.mode("overwrite").parquet(str(tmp))
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
        return n


class _Kept:
    """The DataFrames one loop batch keeps, released when the batch ends."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.rdds: list[Any] = []

    def keep(self, df: Any) -> tuple[Any, int]:
        """``df`` cached and its row count, for a DataFrame whose plan stays small."""
        df = df.persist()
        self.frames.append(df)
        return df, df.count()

    def cut_lazy(self, df: Any) -> Any:
        """``df`` as a DataFrame over its rows, computed and kept by the first job that
        reads it (as ``cut``, without the count)."""
        df = df.localCheckpoint(eager=False)
        self.rdds.append(df._jdf.queryExecution().analyzed().rdd())
        return df

    def cut(self, df: Any) -> tuple[Any, int]:
        """``df`` computed once, as a DataFrame over its rows (its plan a leaf: each
        iteration's plan reads the ones before, so plans that kept their lineage would grow
        exponentially), and its row count.  Counting the checkpointed RDD is the job that
        computes it: an eager ``localCheckpoint`` counts it too but drops the count, and
        the fixpoint test would be a job of its own."""
        df = df.localCheckpoint(eager=False)
        rdd = df._jdf.queryExecution().analyzed().rdd()
        self.rdds.append(rdd)
        return df, rdd.count()

    def release(self) -> None:
        for df in self.frames:
            df.unpersist()
        for rdd in self.rdds:
            rdd.unpersist(False)
        self.frames.clear()
        self.rdds.clear()


class _Views:
    """Temporary views of one batch's DataFrames, for its SQL, dropped when it is done."""

    def __init__(self, spark: Any, step: str) -> None:
        self.spark = spark
        self.prefix = "__theseus_" + re.sub(r"[^A-Za-z0-9_]", "_", step)
        self.names: list[str] = []

    def add(self, df: Any) -> str:
        name = f"{self.prefix}_{len(self.names)}"
        df.createOrReplaceTempView(name)
        self.names.append(name)
        return name

    def drop(self) -> None:
        for name in self.names:
            self.spark.catalog.dropTempView(name)
        self.names.clear()


def _union(frames: list[Any]) -> Any:
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


class QueryChain:
    """Several streaming queries that ``theseus run`` hosts as one: the loop queries of the
    recursive steps, then the output query.  With available-now each starts when the one
    before finished, so the output query sees every row the fixpoint derived from the input
    present at the start.  ``notes()`` gives the loops' progress lines and warnings."""

    def __init__(self, available_now: bool) -> None:
        self.available_now = available_now
        self._starters: list[Callable[[], Any]] = []
        self.queries: list[Any] = []
        self._notes: list[str] = []
        self._lock = threading.Lock()
        #: per recursive step: its loop's gate name and internal topic (the host records
        #: them in its status: a migration caps the loop and cuts the topic)
        self.loops: dict[str, dict[str, str]] = {}

    def add(self, starter: Callable[[], Any]) -> None:
        self._starters.append(starter)

    def begin(self) -> None:
        if self.available_now:
            self.queries.append(self._starters.pop(0)())
        else:
            while self._starters:
                self.queries.append(self._starters.pop(0)())

    def note(self, line: str) -> None:
        with self._lock:
            self._notes.append(line)

    def notes(self) -> list[str]:
        with self._lock:
            out, self._notes = self._notes, []
        return out

    def _advance(self) -> None:
        if any(sq.exception() is not None for sq in self.queries):
            for sq in self.queries:
                if sq.isActive:
                    sq.stop()
            self._starters.clear()
            return
        while self._starters and not any(sq.isActive for sq in self.queries):
            self.queries.append(self._starters.pop(0)())

    @property
    def isActive(self) -> bool:  # noqa: N802  (StreamingQuery's name)
        self._advance()
        return any(sq.isActive for sq in self.queries) or bool(self._starters)

    @property
    def recentProgress(self) -> list[dict]:  # noqa: N802
        self._advance()
        out = self.queries[-1] if not self._starters else None
        return out.recentProgress if out is not None else []

    @property
    def id(self) -> Any:
        return self.queries[0].id

    @property
    def status(self) -> dict:
        return {"isTriggerActive": any(sq.status.get("isTriggerActive", False)
                                       for sq in self.queries if sq.isActive)}

    def exception(self) -> Any:
        for sq in self.queries:
            e = sq.exception()
            if e is not None:
                return e
        return None

    def stop(self) -> None:
        self._starters.clear()
        for sq in self.queries:
            if sq.isActive:
                sq.stop()

    def awaitTermination(self, timeout: float | None = None) -> bool:  # noqa: N802
        deadline = None if timeout is None else Deadline(timeout)
        while self.isActive:
            if self.exception() is not None:
                self.stop()
                return True
            if deadline is not None and deadline.expired():
                return False
            time.sleep(0.2)
        return True
