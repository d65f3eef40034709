"""A new plan against a Spark checkpoint: what Spark will say when the new plan restarts on it.

Plain Python over two :class:`~compat.checkpoint.Checkpoint` values: the real one, and the
new plan's operators as Spark plans them (``migrate.stateops`` writes them into a scratch
checkpoint of one empty batch).  The rules are Spark's own, applied in Spark's order at a
restart:

1. the sources: the offset log lists one entry per source, in the query's source order;
   another number of sources fails the restart, a source of another topic fails the gated
   source, more partitions are read from their earliest offset;
2. the shuffle partitions the offset log pins (``spark.sql.shuffle.partitions``): Spark
   restores them over the session's and the plan's;
3. the operators (``IncrementalExecution.checkOperatorValidWithMetadata``): the map
   operator id -> name of the new plan must equal the checkpoint's, both ways
   (``STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA``);
4. each state store's key, then value schema (``StateSchemaCompatibilityChecker``): the
   same types field by field, names ignored (``STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE``,
   ``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE``); compatible types under other names start,
   but read the old state as if it were the new one.

``predict`` says what the restart does: ``fails`` (with Spark's error class), ``wrong_state``
(starts, but the state holds something else than the new plan would have computed) or
``starts``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from compat.checkpoint import (
    Checkpoint,
    Operator,
    StateStore,
    compatible,
    field_names,
    type_string,
)
from compat.findings import EFFECT_HINTS, MIGRATE, Finding, finding, register_codes
from compat.model import Plan
from compat.steps import Source
from compat.tws_state import LEGACY, describe, is_named

FRESH = "Deploy it with a live migration (theseus migrate start --strategy shadow): the " \
        "new plan starts on a fresh checkpoint and rebuilds its state from the source " \
        "history. Never switch spark.sql.streaming.stateStore.stateSchemaCheck off to get " \
        "past this."

register_codes({
    "checkpoint-drift": ("in_place", "warning", "topology",
                         "The store's recorded plan is not what made this checkpoint: the "
                         "checkpoint is what Spark restarts from. Record the plan that runs "
                         "(or find out who restarted the query by hand) before changing it."),
    "checkpoint-operators-mismatch": ("migrate", "error", "topology", FRESH),
    "checkpoint-key-schema-incompatible": ("migrate", "error", "schema_evolution", FRESH),
    "checkpoint-value-schema-incompatible": ("migrate", "error", "schema_evolution", FRESH),
    "checkpoint-state-reinterpreted": ("migrate", "error", "schema_evolution", FRESH),
    "checkpoint-state-missing": ("migrate", "error", "topology", FRESH),
    "checkpoint-state-renamed": ("migrate", "error", "schema_evolution", FRESH),
    "checkpoint-sources-changed": ("migrate", "error", "source_modifying", FRESH),
    "checkpoint-source-topic-changed": ("migrate", "error", "source_modifying", FRESH),
    "checkpoint-source-partitions-changed": ("in_place", "info", "scaling",
                                             "Nothing to do: the source reads partitions "
                                             "the checkpoint does not know from their "
                                             "earliest offset."),
    # The plan asks for a count Spark will not give it: the verdict keeps what the user
    # asked for (a migration), the restart's prediction says Spark starts on the old count.
    "checkpoint-partitions-pinned": ("migrate", "error", "scaling",
                                     "To change the state partition count, deploy with a "
                                     "live migration (a fresh checkpoint); restarting in "
                                     "place keeps the checkpoint's count."),
    "checkpoint-recursive-state-missing": ("migrate", "error", "topology", FRESH),
    "checkpoint-recursive-state-changed": ("migrate", "error", "schema_evolution", FRESH),
    "checkpoint-recursive-inputs-changed": ("migrate", "error", "source_modifying", FRESH),
    "checkpoint-recursive-state-orphaned": ("migrate", "error", "topology", FRESH),
    "checkpoint-stateless": ("none", "info", "transparent",
                             "Nothing to do: only the sources are checked."),
    "checkpoint-not-verified": ("none", "info", "transparent",
                                "Check it by other means (the store's recorded plan, "
                                "theseus check OLD NEW)."),
})

#: error classes Spark raises at restart, per finding code
ERROR_CLASS = {
    "checkpoint-operators-mismatch": "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
    "checkpoint-key-schema-incompatible": "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
    "checkpoint-value-schema-incompatible": "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
    "checkpoint-sources-changed": "(no error class: an IllegalStateException on the number "
                                  "of sources)",
    # the gated source raises its SourceError inside a Python data source
    "checkpoint-source-topic-changed": "PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR",
    # Spark 4 refuses stateful operators on a checkpoint that has committed batches and no
    # state directory (truth corpus: upgrades/stateful_dedup_added under runtime theseus)
    "checkpoint-state-missing": "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY",
    "checkpoint-recursive-inputs-changed": "(the loop query's: an IllegalStateException on "
                                           "the number of sources, or the gated source's "
                                           "SourceError)",
}
#: codes after which Spark starts but with state that is not the new plan's
WRONG_STATE = ("checkpoint-state-reinterpreted", "checkpoint-state-renamed",
               "checkpoint-recursive-state-missing", "checkpoint-recursive-state-changed",
               "checkpoint-recursive-state-orphaned")


@dataclass(frozen=True)
class Prediction:
    outcome: str  # fails | wrong_state | starts
    error_class: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "error_class": self.error_class,
                "reason": self.reason}


def stateful_nodes(plan: Plan) -> list[str]:
    """The plan's stateful steps in the order Spark numbers their operators: from the
    sink, a parent before its inputs, inputs left to right (Spark's ``transform`` of the
    physical plan), each step once."""
    out: list[str] = []
    seen: set[str] = set()
    stack = [plan.sink_id]
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        if plan.info[nid].stateful:
            out.append(nid)
        stack.extend(reversed(plan.nodes[nid].inputs))
    return out


class _Ctx:
    def __init__(self, new: Plan, new_ops: Checkpoint) -> None:
        self.new = new
        nodes = stateful_nodes(new)
        # Matched in order: the i-th operator is the i-th stateful step when counts agree.
        self.node_of = {op.id: nodes[i] for i, op in enumerate(new_ops.operators)} \
            if len(nodes) == len(new_ops.operators) else {}

    def at(self, op_id: int | None) -> dict[str, Any]:
        nid = self.node_of.get(op_id) if op_id is not None else None
        if nid is None:
            return {"new": None, "new_pointer": "/nodes"}
        return {"new": nid, "new_pointer": self.new.pointer(nid)}


def compare(ck: Checkpoint, new_ops: Checkpoint, new: Plan) -> list[Finding]:
    """Findings of restarting ``new`` (whose dry run is ``new_ops``) on ``ck``."""
    ctx = _Ctx(new, new_ops)
    out = _sources(ck, new_ops, new)
    out += _partitions(ck, new)
    out += _operators(ck, new_ops, ctx)
    out += _loops(ck, new)
    return out


def _upstream_sources(plan: Plan, nid: str) -> list[str]:
    """The stream source nodes under node ``nid``, in plan order."""
    seen: set[str] = set()
    todo = [nid]
    while todo:
        n = todo.pop()
        if n in seen or n not in plan.nodes:
            continue
        seen.add(n)
        todo += list(getattr(plan.nodes[n], "inputs", ()) or ())
    return [n for n, node in plan.nodes.items()
            if n in seen and isinstance(node, Source) and plan.info[n].stream]


def _loops(ck: Checkpoint, new: Plan) -> list[Finding]:
    """A recursive step's loop keeps its state beside the checkpoint (compat.recursive_state):
    the rows derived so far (R) and the history of the stream inputs its body reads (E<i>),
    which a restart reads back and runs the new body over; and the loop query's own Spark
    checkpoint, whose sources are the step's stream inputs."""
    from compat.checkpoint import CheckpointError, read_checkpoint
    from compat.recursive_state import columns_of
    from compat.steps import Recursive

    recs = {nid: n for nid, n in new.nodes.items() if isinstance(n, Recursive)}
    out: list[Finding] = []

    def shape(cols) -> str:
        return ", ".join(f"{n} {t}" for n, t in cols)

    for nid, rec in recs.items():
        lp = ck.loops.get(nid)
        if lp is None:
            if ck.loops or any(t.startswith("theseus.recursive.") for t in ck.source_offsets()):
                out.append(finding(
                    "checkpoint-recursive-state-missing",
                    f"recursive step '{nid}' has no loop state in the checkpoint "
                    f"(recursive/{nid}/state): its loop would start with nothing derived and "
                    "no history of its inputs, so a late row would not join what came before",
                    new=nid, new_pointer=new.pointer(nid)))
            continue
        info = new.info[nid]
        want = [(n, t) for n, (_, t) in zip(info.names, info.columns)]
        have = columns_of(lp.derived.schema)
        if have is not None and [(n.lower(), t) for n, t in have] != \
                [(n.lower(), t) for n, t in want]:
            out.append(finding(
                "checkpoint-recursive-state-changed",
                f"the loop state of recursive step '{nid}' holds rows ({shape(have)}); the "
                f"new step derives ({shape(want)}): a restart runs the body over rows of "
                "another shape", new=nid, new_pointer=new.pointer(nid)))
        streams = [i for i, x in enumerate(rec.inputs) if i and new.info[x].stream]
        for i in sorted(set(lp.inputs) | set(streams)):
            if i not in streams:
                out.append(finding(
                    "checkpoint-recursive-state-changed",
                    f"the loop of recursive step '{nid}' kept the history of a stream input "
                    f"{i} (state/E{i}, {lp.inputs[i].rows} rows) that the new step does not "
                    "read as a stream", new=nid, new_pointer=new.pointer(nid, "inputs")))
                continue
            if i not in lp.inputs:
                if lp.inputs or lp.derived.batches:
                    out.append(finding(
                        "checkpoint-recursive-state-changed",
                        f"the new step '{nid}' reads stream input {i} ('{rec.inputs[i]}'), "
                        f"whose history its loop never kept (no state/E{i}): the rows derived "
                        "so far would never meet that input's past rows", new=nid,
                        new_pointer=new.pointer(nid, f"inputs/{i}")))
                continue
            xi = new.info[rec.inputs[i]]
            want_i = [(n, t) for n, (_, t) in zip(xi.names, xi.columns)]
            have_i = columns_of(lp.inputs[i].schema)
            if have_i is not None and [(n.lower(), t) for n, t in have_i] != \
                    [(n.lower(), t) for n, t in want_i]:
                out.append(finding(
                    "checkpoint-recursive-state-changed",
                    f"the loop of recursive step '{nid}' kept input {i} as ({shape(have_i)}); "
                    f"the new step's input {i} ('{rec.inputs[i]}') is ({shape(want_i)})",
                    new=nid, new_pointer=new.pointer(nid, f"inputs/{i}")))
        # the loop query's own checkpoint: its sources are the stream inputs' sources
        try:
            loop_ck = read_checkpoint(f"{ck.path}/recursive/{nid}/spark")
        except CheckpointError:
            continue  # never committed a batch: nothing to restart from
        had = list(loop_ck.source_offsets())
        srcs = list(dict.fromkeys(s for i, x in enumerate(rec.inputs)
                                  if i == 0 or i in streams
                                  for s in _upstream_sources(new, x)))
        now = list(dict.fromkeys(new.nodes[s].topic for s in srcs))  # type: ignore[attr-defined]
        if len(loop_ck.offsets) != len(srcs) or set(had) != set(now):
            out.append(finding(
                "checkpoint-recursive-inputs-changed",
                f"the loop query of recursive step '{nid}' read {', '.join(had) or 'nothing'} "
                f"({len(loop_ck.offsets)} source(s)); the new step's stream inputs read "
                f"{', '.join(now) or 'nothing'} ({len(srcs)} source(s)): Spark refuses to "
                "restart the loop query",
                new=nid, new_pointer=new.pointer(nid, "inputs")))
    for sid, lp in sorted(ck.loops.items()):
        if sid not in recs:
            out.append(finding(
                "checkpoint-recursive-state-orphaned",
                f"the checkpoint holds the loop state of recursive step '{sid}' "
                f"({lp.derived.rows} rows derived), which the new plan has no more (renamed "
                "or removed): what it derived is lost to a restart", new_pointer="/nodes"))
    return out


def _sources(ck: Checkpoint, new_ops: Checkpoint, new: Plan) -> list[Finding]:
    out: list[Finding] = []
    # The dry run's offsets name each source's node, in Spark's order.
    order = [doc.get("theseus_empty") if isinstance(doc, dict) else None
             for doc in new_ops.offsets]
    if len(ck.offsets) != len(order):
        return [finding("checkpoint-sources-changed",
                        f"Spark refuses to restart: the checkpoint's offsets hold "
                        f"{len(ck.offsets)} source(s), the new plan reads {len(order)} "
                        "stream source(s) (Spark's 'There are N sources in the checkpoint "
                        "offsets and now there are M sources requested by the query')",
                        new_pointer="/nodes")]
    for i, (doc, nid) in enumerate(zip(ck.offsets, order)):
        node = new.nodes.get(nid) if nid else None
        if not isinstance(node, Source):
            continue
        from compat.checkpoint import kafka_offsets

        offs = kafka_offsets(doc)
        if not offs:
            continue
        if node.topic not in offs:
            out.append(finding("checkpoint-source-topic-changed",
                               f"Spark refuses to restart: source {i} of the checkpoint read "
                               f"{', '.join(map(repr, offs))}; the new plan's source "
                               f"'{nid}' reads '{node.topic}' (the gated source fails: no "
                               "offset for its topic)", new=nid,
                               new_pointer=new.pointer(nid, "topic")))
            continue
        known = len(offs[node.topic])
        if node.partitions != known:
            more = node.partitions > known
            out.append(finding("checkpoint-source-partitions-changed",
                               f"source '{nid}' declares {node.partitions} partitions of "
                               f"'{node.topic}', the checkpoint has offsets for {known}: "
                               + ("Spark starts; the partitions it has no offset for are "
                                  "read from their earliest offset" if more else
                                  "Spark starts; the source reads the partitions the "
                                  "broker has (the broker's metadata wins)"),
                               new=nid, new_pointer=new.pointer(nid, "partitions")))
    return out


def _partitions(ck: Checkpoint, new: Plan) -> list[Finding]:
    pinned = ck.shuffle_partitions
    wanted = new.state_partitions
    if pinned is None or wanted is None or pinned == wanted:
        return []
    return [finding("checkpoint-partitions-pinned",
                    f"the checkpoint pins spark.sql.shuffle.partitions = {pinned}; the new "
                    f"plan asks for {wanted}: Spark starts, the state stays in {pinned} "
                    "partitions and the plan's count is ignored",
                    new_pointer="/config/state_partitions")]


def _operators(ck: Checkpoint, new_ops: Checkpoint, ctx: _Ctx) -> list[Finding]:
    old = {op.id: op for op in ck.operators}
    new = {op.id: op for op in new_ops.operators}
    if not old:
        if new:
            return [finding("checkpoint-state-missing",
                            f"the checkpoint holds no state (its query was stateless), the "
                            f"new plan has {len(new)} stateful operator(s): Spark refuses "
                            "to restart (STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY"
                            "): it will not start stateful operators without their state "
                            "on a checkpoint with committed batches",
                            **ctx.at(min(new)))]
        if ck.loops:
            return [finding("checkpoint-stateless", "the output query's checkpoint holds no "
                            "Spark state, nor does the new plan's output query: its sources "
                            "are compared, and the recursive steps' loop state on its own",
                            new_pointer="/nodes")]
        return [finding("checkpoint-stateless", "the checkpoint holds no state (its query "
                        "is stateless), nor does the new plan: only the sources and their "
                        "offsets are compared", new_pointer="/nodes")]
    if any(op.name == "unknown" for op in old.values()):
        ctx_note = [finding("checkpoint-not-verified",
                            "the checkpoint has no operator metadata (written by a Spark "
                            "before 3.5): operator names are not compared",
                            new_pointer="/nodes")]
    else:
        ctx_note = []
        names_old = {i: op.name for i, op in old.items()}
        names_new = {i: op.name for i, op in new.items()}
        if names_old != names_new:
            return [finding("checkpoint-operators-mismatch",
                            "Spark refuses to restart "
                            "(STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA): the "
                            f"checkpoint's stateful operators are {_ops(old)}, the new "
                            f"plan's are {_ops(new)}",
                            **ctx.at(_first_diff(names_old, names_new)))]
    out = list(ctx_note)
    for i in sorted(set(old) & set(new)):
        out += _stores(old[i], new[i], ctx)
    return out


def _ops(ops: dict[int, Operator]) -> str:
    return "[" + ", ".join(f"{i}: {op.name}" for i, op in sorted(ops.items())) + "]" \
        if ops else "none"


def _first_diff(a: dict[int, str], b: dict[int, str]) -> int | None:
    for i in sorted(set(a) | set(b)):
        if a.get(i) != b.get(i):
            return i if i in b else None
    return None


def restart_stores(old: Operator, new: Operator) -> dict[str, StateStore]:
    """The new operator's state stores by the name a restart on ``old``'s checkpoint gives
    them: a checkpoint holding Theseus' changelog state under the legacy single name keeps
    it (``migrate.build.core.Builder.state_name``), whatever the dry run named it."""
    stores = {s.name: s for s in new.stores}
    names = {s.name for s in old.stores}
    if LEGACY in names and LEGACY not in stores:
        named = [s for s in new.stores if is_named(s.name)]
        if len(named) == 1:
            del stores[named[0].name]
            stores[LEGACY] = replace(named[0], name=LEGACY)
    return stores


def _renamed(old: Operator, new: Operator, stores: dict[str, StateStore], ctx: _Ctx,
             label: str) -> tuple[list[Finding], set[str]]:
    """Theseus' changelog state under another name than the new plan gives it: named
    after what the state means (``compat.tws_state``), so the state means something else.
    Spark accepts added and removed column families (``StateSchemaCompatibilityChecker``),
    starts the new one empty and never reads the old one: measured on PySpark 4.3, the
    restart starts and the groups lose their history."""
    gone = [s.name for s in old.stores if is_named(s.name) and s.name not in stores]
    added = [n for n in stores if is_named(n) and n not in {s.name for s in old.stores}]
    if not gone or not added:
        return [], set()
    nid = ctx.node_of.get(new.id)
    what = f" ({describe(ctx.new, nid)})" if nid else ""
    step = f"step '{nid}'" if nid else "the new plan"
    return [finding("checkpoint-state-renamed",
                    f"Spark restarts, but without the state: {label} keeps its state as "
                    f"{', '.join(map(repr, gone))}, named after what it meant when the "
                    f"checkpoint was written; {step} names it {', '.join(map(repr, added))}"
                    f"{what}, so its meaning changed (group keys, aggregates, join or table "
                    "keys). Spark accepts the added and the removed state variable, starts "
                    "the new one empty and never reads the old one: every group restarts "
                    "without its history", **ctx.at(new.id))], set(gone)


def _stores(old: Operator, new: Operator, ctx: _Ctx) -> list[Finding]:
    new_stores = restart_stores(old, new)
    where = ctx.at(new.id)
    label = f"operator {old.id} ({old.name})"
    out, skip = _renamed(old, new, new_stores, ctx, label)
    for s in old.stores:
        if s.name in skip:
            continue
        n = new_stores.get(s.name)
        if n is None or s.key_schema is None or n.key_schema is None:
            out.append(finding("checkpoint-not-verified",
                               f"{label}, state store '{s.name}': the checkpoint records no "
                               "state schema for it; its key and value are not compared",
                               **where))
            continue
        store = "" if s.name == "default" else f", state store '{s.name}'"
        if not compatible(s.key_schema, n.key_schema):
            out.append(finding("checkpoint-key-schema-incompatible",
                               f"Spark refuses to restart (STATE_STORE_KEY_SCHEMA_NOT_"
                               f"COMPATIBLE): {label}{store} keys its state by "
                               f"{type_string(s.key_schema)}, the new plan by "
                               f"{type_string(n.key_schema)}", **where))
            continue
        if s.value_schema is not None and n.value_schema is not None and \
                not compatible(s.value_schema, n.value_schema):
            out.append(finding("checkpoint-value-schema-incompatible",
                               f"Spark refuses to restart (STATE_STORE_VALUE_SCHEMA_NOT_"
                               f"COMPATIBLE): {label}{store} stores "
                               f"{type_string(s.value_schema)}, the new plan "
                               f"{type_string(n.value_schema)}", **where))
            continue
        renamed = [(a, b) for a, b in zip(field_names(s.key_schema), field_names(n.key_schema))
                   if a.lower() != b.lower()]
        renamed += [(a, b) for a, b in zip(field_names(s.value_schema),
                                           field_names(n.value_schema)) if a.lower() != b.lower()]
        if renamed:
            pairs = ", ".join(f"{a} -> {b}" for a, b in renamed)
            out.append(finding("checkpoint-state-reinterpreted",
                               f"Spark restarts, but with the wrong state: {label}{store} has "
                               f"the same types under other names ({pairs}); Spark compares "
                               "types only and reads the old state as the new plan's",
                               **where))
    return out


def drift(ck: Checkpoint, recorded_ops: Checkpoint) -> list[str]:
    """How the checkpoint differs from what the recorded plan would have written."""
    diffs: list[str] = []
    old = {op.id: op for op in ck.operators}
    rec = {op.id: op for op in recorded_ops.operators}
    if {i: o.name for i, o in old.items()} != {i: o.name for i, o in rec.items()}:
        diffs.append(f"operators {_ops(old)} in the checkpoint, {_ops(rec)} from the "
                     "recorded plan")
    for i in sorted(set(old) & set(rec)):
        rs = restart_stores(old[i], rec[i])
        gone = [s.name for s in old[i].stores if is_named(s.name) and s.name not in rs]
        added = [n for n in rs if is_named(n) and n not in {s.name for s in old[i].stores}]
        if gone or added:
            diffs.append(f"operator {i} ({old[i].name}) state "
                         f"{', '.join(map(repr, gone)) or 'none'} in the checkpoint, "
                         f"{', '.join(map(repr, added)) or 'none'} from the recorded plan")
        for s in old[i].stores:
            r = rs.get(s.name)
            if r is None or s.key_schema is None or r.key_schema is None:
                continue
            for part, a, b in (("key", s.key_schema, r.key_schema),
                               ("value", s.value_schema, r.value_schema)):
                if a is not None and b is not None and \
                        type_string(a).lower() != type_string(b).lower():
                    diffs.append(f"operator {i} ({old[i].name}) {part} "
                                 f"{type_string(a)} in the checkpoint, {type_string(b)} "
                                 "from the recorded plan")
    if len(ck.offsets) != len(recorded_ops.offsets):
        diffs.append(f"{len(ck.offsets)} source(s) in the checkpoint, "
                     f"{len(recorded_ops.offsets)} in the recorded plan")
    return diffs


def drift_finding(diffs: list[str], recorded: Plan, made_from: str = "") -> Finding:
    """``made_from``: the user's file the recorded plan was made from, with its digest
    then (a job file edited and run outside Theseus since is the usual cause)."""
    source = f", made from {made_from}" if made_from else ""
    return finding("checkpoint-drift",
                   "the checkpoint was not made by the store's recorded plan "
                   f"({recorded.file}{source}): " + "; ".join(diffs) + ". The plan check "
                   "against the recorded plan is not to be trusted; the checkpoint decides",
                   old_pointer="/nodes", new_pointer="/nodes")


#: where Spark's Kafka connector fails otherwise than the gated source (no error class: the
#: connector's IllegalStateException), per finding code
CONNECTOR_ERROR = {
    "checkpoint-source-topic-changed": "(Spark's Kafka connector: 'Some data may have been "
                                       "lost', no error class)",
}


def predict(findings: list[Finding], written_by: str = "gated") -> Prediction:
    """What Spark does when the new plan restarts on the checkpoint (``written_by``: the
    source that wrote it, ``compat.checkpoint.written_by``)."""
    for f in findings:
        if f.code in ERROR_CLASS:
            cls = CONNECTOR_ERROR.get(f.code, ERROR_CLASS[f.code]) \
                if written_by == "kafka-connector" else ERROR_CLASS[f.code]
            return Prediction("fails", cls, f.message)
    for f in findings:
        if f.code in WRONG_STATE:
            return Prediction("wrong_state", None, f.message)
    # The plan check against the recorded plan knows what the checkpoint cannot show: a
    # changed window, join type or argument keeps the state's types and changes its meaning.
    for f in findings:
        if f.effect == "migrate" and not f.code.startswith("checkpoint-") and \
                f.code != "state-partitions-changed":
            return Prediction("wrong_state", None,
                              f"Spark restarts (the state's types still fit), but {f.message}")
    return Prediction("starts", None, "the checkpoint's operators, state schemas and sources "
                      "fit the new plan")


def characteristics(ck: Checkpoint) -> list[str]:
    """The characteristics a checkpoint shows (stateful, joined, multistage, windowed...)."""
    ops = ck.operators
    if not ops:
        return ["simple"]
    out = ["stateful"]
    if any("window" in (type_string(s.key_schema) if s.key_schema else "")
           for op in ops for s in op.stores) or any("session" in op.name.lower() for op in ops):
        out.append("windowed")
    if any("join" in op.name.lower() for op in ops):
        out.append("joined")
    if len(ops) > 1:
        out.append("multistage")
    return out


def checkpoint_report(ck: Checkpoint, new: Plan, new_ops: Checkpoint,
                      recorded: Plan | None = None, rec_ops: Checkpoint | None = None, *,
                      require: list[str] | None = None, schema_compat: str = "forward",
                      allow_migration: bool = False, recorded_from: str = "") -> Any:
    """The report of ``new`` against the checkpoint ``ck``, given the operators Spark plans
    for ``new`` (``new_ops``) and, with a recorded plan, for it (``rec_ops``).

    4. Drift first; 5. the checkpoint's rules, then (no drift) the plan check of the
    recorded plan against ``new``, else what is not verified; 6. the verdict, and the
    prediction of the restart."""
    from compat.check import Report, check_plans, dedupe, verdict_of
    from compat.findings import settle

    findings: list[Finding] = []
    drifted: list[str] = []
    if recorded is not None and rec_ops is not None:
        drifted = drift(ck, rec_ops)
        if drifted:
            findings.append(drift_finding(drifted, recorded, recorded_from))
    findings += compare(ck, new_ops, new)
    plan_report = None
    # What Spark does at the restart does not depend on what the user requires of the
    # output (--require backfill makes a passive change "migrate", yet Spark restarts on
    # correct state): the prediction comes from the plan check without requirements.
    spark_view = list(findings)
    if recorded is not None and not drifted:
        plan_report = check_plans(recorded, new, require=require, schema_compat=schema_compat,
                                  allow_migration=allow_migration)
        bare = plan_report if not require else check_plans(recorded, new)
        # The checkpoint may know more than the plan check (what Spark really does) but
        # never says less about what the user asked for: a changed state partition count
        # stays a migration, and checkpoint-partitions-pinned says beside it that an
        # in-place restart starts and keeps the checkpoint's count.
        backfill = "backfill" in (require or [])
        findings += [f if backfill else _join_type(f, ck, recorded, new)
                     for f in plan_report.findings]
        spark_view += [_join_type(f, ck, recorded, new) for f in bare.findings
                       if f.code != "state-partitions-changed" or not ck.shuffle_partitions]
    else:
        findings += _unverified(new, recorded is not None, ck)
    findings += [finding("checkpoint-not-verified", note, new_pointer="/nodes")
                 for note in ck.not_verified]
    findings = dedupe(findings)
    verdict = verdict_of(findings)
    if verdict == "identical" and recorded is None:
        verdict = "in_place"  # a checkpoint alone can say it restarts, never "same plan"
    prediction = predict(spark_view, ck.written_by)
    findings = [settle(f, allow_migration=allow_migration) for f in findings]
    section = ck.to_json()
    section["restart"] = prediction.to_json()
    section["drift"] = drifted
    section["matched"] = _matched(ck, new_ops, new)
    return Report(verdict, findings, recorded or new, new,
                  plan_report.alignment if plan_report else [], sorted(set(require or [])),
                  schema_compat, plan_report.requirements if plan_report else [],
                  allow_migration=allow_migration, checkpoint=section,
                  old_characteristics=None if recorded else characteristics(ck),
                  old_is_checkpoint=recorded is None)


def _join_type(f: Finding, ck: Checkpoint, old: Plan, new: Plan) -> Finding:
    """The checkpoint says which join state format the plan check's condition holds for.
    A stream-stream join's change between inner and outer types is ``in_place`` in the plan
    check on the condition that the join state is format 2 (Spark 3.0's default): both
    sides' rows kept with a ``matched`` flag whatever the type.  Format 1 has no flag (and
    a checkpoint that records no format is format 1 to Spark), so there the restart would
    join rows in state without knowing which had matched: a migration."""
    if f.code != "join-type-changed" or f.effect != "in_place":
        return f
    n = new.nodes.get(f.new_node or "")
    if n is None or not new.info[n.id].stateful or new.info[n.id].changelog:
        return f  # a stream-table join keeps no state: the format does not matter
    version = ck.conf.get("spark.sql.streaming.join.stateFormatVersion", "")
    if version.isdigit() and int(version) >= 2:
        return replace(f, message=f.message + f"; the checkpoint's join state is format "
                       f"v{version}: the condition holds")
    return replace(f, effect="migrate", severity="error", history=False,
                   hint=EFFECT_HINTS["migrate"],
                   message=f.message + "; but the checkpoint's join state is format "
                   f"v{version or '1 (none recorded)'}, which keeps no matched flag: "
                   "migrate")


def _matched(ck: Checkpoint, new_ops: Checkpoint, new: Plan) -> list[dict[str, Any]]:
    """Each checkpoint operator with the new plan's operator of its id and the plan step
    it was matched to (in order)."""
    nodes = stateful_nodes(new)
    by_id = {op.id: op for op in new_ops.operators}
    in_order = len(nodes) == len(new_ops.operators)
    out = []
    for i, op in enumerate(ck.operators):
        n = by_id.get(op.id)
        out.append({"operator": op.id, "checkpoint": op.name,
                    "new": n.name if n else None,
                    "node": nodes[i] if n and in_order and i < len(nodes) else None})
    return out


def _unverified(new: Plan, drifted: bool, ck: Checkpoint | None = None) -> list[Finding]:
    why = "the recorded plan did not make this checkpoint" if drifted else \
        "no recorded plan (--checkpoint alone)"
    sink_why = why if drifted else "there is no recorded plan (--checkpoint alone)"
    notes = [f"the sink (topic, key, mode, output schema): a checkpoint records nothing of "
             f"it, and {sink_why}"]
    if any(new.info[n].stateful for n in new.nodes):
        named = ck is not None and any(is_named(s.name) for op in ck.operators
                                       for s in op.stores)
        notes.append("what the state means beyond its types: window sizes and slides, join "
                     "types and time bounds, aggregate argument expressions, filters "
                     f"before state ({why})" + (
                         "; of Theseus' changelog operators, the group keys, aggregates, "
                         "join and table keys are verified by their state names, the "
                         "filters before them are not" if named else ""))
    from compat.steps import Recursive

    recs = [nid for nid, n in new.nodes.items() if isinstance(n, Recursive)]
    if recs:
        notes.append("the body, union and limits of recursive step(s) " + ", ".join(recs) +
                     ": the loop state holds the rows derived and the inputs' history, not "
                     f"the body that derived them ({why})")
    legacy = [op for op in (ck.operators if ck else []) if op.metadata_version == 2
              and any(s.name == LEGACY for s in op.stores)]
    if legacy:
        # Measured on a real checkpoint (tests/integration/test_checkpoint_tws.py): a
        # changed group key of a table aggregate keeps every schema and starts with the
        # old groups' state.  Checkpoints written since name the state after what it means
        # (compat.tws_state), and the names are compared.
        notes.append("the state of the transformWithState operator(s) "
                     + ", ".join(f"{op.id} ({op.name})" for op in legacy)
                     + f": the checkpoint was written before Theseus named changelog state "
                     f"after what it means (one variable '{LEGACY}' of JSON text keyed by "
                     "JSON text, the same whatever the group keys, aggregates, join keys or "
                     "table keys), and a restart keeps that name; the checkpoint cannot tell "
                     "whether their state is the new plan's. Check with the recorded plan "
                     "(theseus check --query NAME --state STORE NEW) or the old plan, or "
                     f"deploy with a shadow migration, whose fresh checkpoint names it ({why})")
    return [finding("checkpoint-not-verified", n, new_pointer="/nodes") for n in notes]


__all__ = ["MIGRATE", "Prediction", "checkpoint_report", "compare", "drift",
           "drift_finding", "predict", "stateful_nodes"]
