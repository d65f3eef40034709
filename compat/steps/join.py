"""``join``: rows of two inputs matched on keys.  Enforcing and stateful unless one side is
a snapshot-read table: a stream-stream join keeps both sides' rows in state, and so does a
table-table join of two tables read as changelogs (each side's current rows per join key),
so type, keys and time bound must match; a stream-table join against a snapshot (re-read
at every micro-batch) holds no state and may change freely.

A table-table join (inner or left, on equal keys) emits the joined rows' changes as either
side changes: a retraction of the old joined row and the new one.  A foreign-key join
(ksqlDB's) is one whose right keys are the right table's key and whose left keys are other
columns of the left row: it is the same join, its output keyed by the left table's key.

Versions of a table-table join (old versions stay buildable and keep their meaning):

1. a ``transformWithStateInPandas`` operator; a left join's rows with a null key are
   padded apart, which re-runs the left table's normalisation as an operator of its own;
2. PySpark's row-based ``transformWithState`` (no pandas frame per key), the left table's
   null-key rows padded by the join operator itself (without state), so the left table is
   normalised once: other operators, which Spark refuses on a version 1 checkpoint, so a
   query moves from version 1 by a migration.  Refused for other joins, where it would
   mean what 1 means.
3. the operator keeps its state per *bucket* of join keys (``state_buckets``, default
   :data:`~compat.steps.source.DEFAULT_BUCKETS`; a join key's bucket is
   ``pmod(xxhash64(key), state_buckets)``), one value of the bucket's join keys' rows of
   both sides, instead of one value per join key, as source version 4 does for the
   normalisation: PySpark 4.3's state API costs a synchronous round trip per key and
   call, so a batch pays per bucket it touches instead of per join key.  The output is
   version 2's.  The price: a batch rewrites every bucket it touches in full.  The count
   is part of the state's layout: changing it, or moving between versions 2 and 3, is a
   migration (``join-state-layout-changed``).  Refused for other joins, as 2 is;
   ``state_buckets`` is refused below version 3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from compat import expr as E
from compat import types as T
from compat.demand import (
    Demand,
    columns,
    demand_at,
    merge,
    moves_filter,
    own,
    reads,
    refs,
)
from compat.findings import MIGRATE, RESTART, Finding, register_codes
from compat.infer import (
    INSERT,
    RETRACT,
    InferContext,
    NodeInfo,
    deterministic,
    infer_step,
    plain_column,
    scope,
)
from compat.model import ENFORCING, EXPR, Node, Plan, enum, prop
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import Code, Refusal, bare, export_step, ident, py, var
from compat.rules import RuleContext, canon, canon_list, compare
from compat.signing import NodeSig, by_name, canon_expr, digest, sign_step, token
from compat.steps.source import DEFAULT_BUCKETS, MAX_BUCKETS

JOIN_TYPES = ("inner", "left", "right", "full", "left_semi", "left_anti")
#: the sides (0 left, 1 right) into which Spark moves a condition on one side's columns:
#: from a filter above the join, and from the join's own condition
_FILTER_SIDES = {"inner": (0, 1), "left": (0,), "right": (1,), "full": (),
                 "left_semi": (0,), "left_anti": (0,)}
_CONDITION_SIDES = {"inner": (0, 1), "left": (1,), "right": (0,), "full": (),
                    "left_semi": (0, 1), "left_anti": (1,)}
#: the join types of two tables read as changelogs
TABLE_TABLE_TYPES = ("inner", "left")
#: the first version whose table-table operator is the row-based ``transformWithState``
ROWS_VERSION = 2
#: the first version whose table-table operator keeps its state per bucket of join keys
BUCKETS_VERSION = 3


@dataclass(frozen=True, kw_only=True)
class Join(Node):
    """Outputs the left input's columns, then the right input's; a right column named like
    a left one is dropped when the two are a paired equi-join key, and otherwise renamed
    ``<right id>_<name>``.  In ``condition`` and ``time_bound``, columns are qualified by
    the input node's id."""

    type: str = prop(schema=enum(*JOIN_TYPES))
    left_keys: tuple[str, ...] = prop(items=EXPR)
    right_keys: tuple[str, ...] = prop(items=EXPR)
    condition: str | None = prop(None, schema=EXPR, qualified=True)
    time_bound: str | None = prop(None, schema=EXPR, qualified=True)
    state_buckets: int | None = prop(None, schema={"type": "integer", "minimum": 1,
                                                   "maximum": MAX_BUCKETS},
                                     doc="how many buckets of join keys a table-table "
                                     "join keeps its state in (join version 3; default 64)")
    step: ClassVar[str] = "join"
    klass: ClassVar[str] = ENFORCING
    max_version: ClassVar[int] = 3
    min_inputs: ClassVar[int] = 2
    max_inputs: ClassVar[int | None] = 2

    def traits(self) -> frozenset[str]:
        return frozenset({"joined"})

    def kept_state(self, plan: Plan) -> Any:
        return state_rows(self, plan) if plan.info[self.id].stateful else None


register_codes({
    "join-type-changed": ("migrate", "error", "topology", MIGRATE),
    "join-keys-changed": ("migrate", "error", "topology", MIGRATE),
    "join-time-bound-changed": ("migrate", "error", "topology", MIGRATE),
    "join-condition-changed": ("migrate", "error", "data_selection", MIGRATE),
    "join-state-schema-changed": ("migrate", "error", "schema_evolution", MIGRATE),
    "join-statefulness-changed": ("migrate", "error", "topology", MIGRATE),
    "join-state-layout-changed": ("migrate", "error", "scaling",
                                  "Spark would read the old layout's state as the new "
                                  "one's (a bucket's value as a join key's, or another "
                                  "count's buckets): migrate, so the new join rebuilds its "
                                  "state from its inputs."),
})


def state_buckets(node: Join, plan: Plan) -> int | None:
    """How many buckets of join keys the table-table join ``node`` keeps its state in
    (join version 3), or None: one state value per join key (versions 1 and 2), or no
    table-table join."""
    if node.version < BUCKETS_VERSION or not plan.info[node.id].changelog:
        return None
    return _buckets(node)


def _buckets(node: Join) -> int:
    return node.state_buckets if node.state_buckets is not None else DEFAULT_BUCKETS


def layout(node: Join, plan: Plan) -> str:
    """The table-table join's state layout in words, for findings."""
    b = state_buckets(node, plan)
    return "one value per join key" if b is None else \
        f"one value per bucket of join keys ({b} buckets)"


#: stream-stream join types whose state Spark keeps alike (join state format 2): every row
#: of both sides, each with a matched flag that every type keeps up to date
#: (SymmetricHashJoinStateManager.getJoinedRows sets it whenever a row joins; the exec
#: appends each input row with matched = whether it joined).  Left semi stores no left row
#: that matched and skips matched right rows, so its state is not the others'.
SAME_JOIN_STATE = frozenset({"inner", "left", "right", "full"})
SAME_STATE_WHY = (
    "Spark restarts it on the old checkpoint where its join state is format 2 (Spark's "
    "default since 3.0; `check --checkpoint` reads the format): both sides' rows are kept "
    "with a matched flag whatever the join type, so rows still in state are joined the new "
    "way (an outer join emits the unmatched ones when the watermark evicts them); rows "
    "evicted before the restart stay joined the old way")


def paired_keys(node: Join) -> set[str]:
    """Lower-case names that are the same bare column on both sides of an equi-key pair."""
    out = set()
    for lk, rk in zip(node.left_keys, node.right_keys):
        a, b = E.analyze(lk).ast, E.analyze(rk).ast
        if a[0] == "col" == b[0] and len(a[1]) == 1 and a[1] == b[1]:
            out.add(a[1][0])
    return out


def join_output(node: Join, left: tuple[str, ...] | list[str],
                right: tuple[str, ...] | list[str]) -> list[tuple[str, str, str]]:
    """The join's output columns, each as ``(name, side, input column)`` with side
    ``"left"`` or ``"right"``: the left columns, then the right ones; a right column named
    like a left one is dropped when the two are a paired equi-join key, and otherwise
    renamed ``<right id>_<name>``.  Semi and anti joins output the left columns only.

    The one statement of this rule: inference, the SQL compiler and the Spark builder all
    call it."""
    out = [(c, "left", c) for c in left]
    if node.type in ("left_semi", "left_anti"):
        return out
    lnames = {c.lower() for c in left}
    paired = paired_keys(node)
    rid = node.inputs[1]
    for c in right:
        low = c.lower()
        if low in lnames:
            if low in paired:
                continue
            out.append((f"{rid}_{c}", "right", c))
        else:
            out.append((c, "right", c))
    return out


@infer_step.register
def _infer(node: Join, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    left, right = ins
    lid, rid = node.inputs
    if len(node.left_keys) != len(node.right_keys):
        raise ctx.err(node, "right_keys", "left_keys and right_keys pair up one by one",
                      expected=f"{len(node.left_keys)} right key(s)",
                      found=str(len(node.right_keys)))
    if not node.left_keys and not node.condition:
        raise ctx.err(node, "left_keys", "a join needs keys or a condition",
                      expected="left_keys/right_keys or a condition", found="neither")
    lscope, rscope = scope(left), scope(right)
    for i, (lk, rk) in enumerate(zip(node.left_keys, node.right_keys)):
        lt = ctx.expr_type(node, f"left_keys/{i}", lk, lscope)
        rt = ctx.expr_type(node, f"right_keys/{i}", rk, rscope)
        if T.wider(lt, rt) == T.UNKNOWN and T.UNKNOWN not in (lt, rt):
            raise ctx.err(node, f"right_keys/{i}", "join keys of incomparable types",
                          expected=lt, found=rt)
    both = E.Scope({}, {lid.lower(): left.types, rid.lower(): right.types})
    both.columns = {k: v for k, v in {**right.types, **left.types}.items()
                    if not (k in left.types and k in right.types)}
    for f in ("condition", "time_bound"):
        text = getattr(node, f)
        if text:
            t = ctx.expr_type(node, f, text, both)
            if t not in ("boolean", T.UNKNOWN):
                raise ctx.err(node, f, f"the join {f} must be a condition",
                              expected="boolean", found=t)
    stateful = left.stream and right.stream
    if not left.stream and not right.stream:
        raise ctx.err(node, "inputs", "Spark cannot join two snapshot-read tables "
                      "continuously", expected="at least one stream input, or tables read "
                      "as changelogs (source version 2)", found="two snapshot-read tables")
    table_table = left.changelog and right.changelog
    if left.changelog != right.changelog:
        side, other = ("right", right) if left.changelog else ("left", left)
        what = "a stream" if other.stream else "a snapshot-read table"
        raise ctx.err(node, f"inputs/{0 if side == 'left' else 1}", f"a table read as a "
                      f"changelog can be joined only with another one; the {side} input is "
                      f"{what}", expected="both inputs tables read as changelogs, or the "
                      "table read as a snapshot (read: snapshot) in a stream-table join",
                      found=what)
    if node.state_buckets is not None and node.version < BUCKETS_VERSION:
        raise ctx.err(node, "state_buckets", "'state_buckets' is a field of join version "
                      f"{BUCKETS_VERSION} (a table-table join's state kept per bucket of "
                      "join keys)", expected=f"version {BUCKETS_VERSION}, or no "
                      f"'state_buckets' (version {node.version} keeps one state value per "
                      "join key)", found=f"version {node.version}")
    if node.state_buckets is not None and not table_table:
        raise ctx.err(node, "state_buckets", "'state_buckets' says how a table-table join "
                      "keeps its state; this join keeps none of its own operator",
                      expected="both inputs tables read as changelogs, or no "
                      "'state_buckets'", found="a join with a stream")
    if node.version >= ROWS_VERSION and not table_table:
        raise ctx.err(node, "version", f"join version {node.version} differs from 1 only "
                      "for a table-table join (its operator)",
                      expected="version 1 for a join with a stream",
                      found=f"version {node.version}")
    if table_table:
        if node.type not in TABLE_TABLE_TYPES:
            raise ctx.err(node, "type", f"a table-table join is {' or '.join(TABLE_TABLE_TYPES)}",
                          expected=" or ".join(TABLE_TABLE_TYPES), found=repr(node.type))
        if not node.left_keys:
            raise ctx.err(node, "left_keys", "a table-table join matches rows on equal keys",
                          expected="left_keys and right_keys", found="none")
        for f in ("condition", "time_bound"):
            if getattr(node, f):
                raise ctx.err(node, f, f"a table-table join matches on its keys only (a "
                              f"{f} would decide which left rows are padded with nulls)",
                              expected=f"no {f}: filter before or after the join",
                              found=repr(getattr(node, f)))
    elif stateful:
        for side, info in (("left", left), ("right", right)):
            if info.mode != INSERT:
                raise ctx.err(node, "inputs", f"the {side} input of a stream-stream join "
                              "emits updates, which Spark cannot join",
                              expected="[I]", found=f"[{info.mode}]")
        if node.type in ("left", "right", "full", "left_anti") and not node.time_bound:
            raise ctx.err(node, "time_bound", f"a stream-stream {node.type} join needs a "
                          "time bound and watermarks on both sides, or its state never ends",
                          expected="a time_bound such as 'r.ts BETWEEN l.ts AND l.ts + "
                          "INTERVAL 1 HOUR'", found="none")
        if node.time_bound and not (left.watermarks and right.watermarks) and \
                node.type != "inner":
            raise ctx.err(node, "inputs", "an outer stream-stream join needs a watermark on "
                          "both inputs", expected="event_time on both sides",
                          found="a side without a watermark")
    else:
        table_side = "left" if not left.stream else "right"
        ok = {"left": ("inner", "right"), "right": ("inner", "left", "left_semi",
                                                    "left_anti")}[table_side]
        if node.type not in ok:
            raise ctx.err(node, "type", f"a {node.type} join with a table on the "
                          f"{table_side} is not supported (the stream side drives the join)",
                          expected=" or ".join(ok), found=repr(node.type))
    types = {"left": dict(zip(left.names, (t for _, t in left.columns))),
             "right": dict(zip(right.names, (t for _, t in right.columns)))}
    out = join_output(node, left.names, right.names)
    names = [name for name, _side, _src in out]
    cols = [(name.lower(), types[side][src]) for name, side, src in out]
    ctx.unique(node, names, "")
    marks = left.watermarks | (right.watermarks & {c[0] for c in cols})
    det = all(deterministic(x) for x in
              (*node.left_keys, *node.right_keys, node.condition or "1",
               node.time_bound or "1"))
    mode = RETRACT if table_table else INSERT if stateful else \
        (left.mode if left.stream else right.mode)
    keys = _joined_keys(node, left, right, out) if table_table else ()
    sides = {"left": left, "right": right}
    windows = frozenset(name.lower() for name, side, src in out
                        if src.lower() in sides[side].windows)
    return NodeInfo(tuple(cols), mode, True, stateful, frozenset(marks), det, tuple(names),
                    changelog=table_table, keys=keys, windows=windows)


def _joined_keys(node: Join, left: NodeInfo, right: NodeInfo,
                 out: list[tuple[str, str, str]]) -> tuple[tuple[str, ...], ...]:
    """The unique keys of a table-table join's rows, from its inputs' (``L``, ``R``).

    A joined row is one left row with one right row, so ``L`` and ``R`` together always
    tell joined rows apart; a left join's padded rows too (a left row is either matched
    or padded once, and ``L`` tells left rows apart).  ``L`` alone does when the join keys
    pin every column of ``R`` (each left row meets at most one right row: a foreign-key
    join); ``R`` alone, in an inner join only, when they pin every column of ``L`` (one
    user, many orders: the orders' key).  Not ``L`` alone for a join on a column that is
    not the right table's key: one left row then has many joined rows under its key, and
    the retraction of one of them would tombstone the others."""
    pairs = [(plain_column(lk), plain_column(rk))
             for lk, rk in zip(node.left_keys, node.right_keys)]
    lpinned = {lc for lc, _rc in pairs if lc is not None}
    rpinned = {rc for _lc, rc in pairs if rc is not None}
    lmap = {src.lower(): name.lower() for name, side, src in out if side == "left"}
    rmap = {src.lower(): name.lower() for name, side, src in out if side == "right"}
    for lc, rc in pairs:
        # a right key column dropped from the output equals the left column it is paired
        # with in every matched row
        if lc is not None and rc is not None and rc not in rmap and lc in lmap:
            rmap[rc] = lmap[lc]
    found: list[tuple[str, ...]] = []
    for lkey in left.keys:
        for rkey in right.keys:
            if not all(k in lmap for k in lkey) or not all(k in rmap for k in rkey):
                continue
            lout = tuple(lmap[k] for k in lkey)
            rout = tuple(rmap[k] for k in rkey)
            if all(k in rpinned for k in rkey):
                found.append(lout)
            if node.type == "inner" and all(k in lpinned for k in lkey):
                found.append(rout)
            found.append(tuple(dict.fromkeys(lout + rout)))
    return tuple(dict.fromkeys(found))


@reads.register
def _reads(node: Join, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    left, right = ins
    lcols, rcols = columns(left), columns(right)
    lneed: Demand = {}
    rneed: Demand = {}
    out = join_output(node, left.names or tuple(lcols), right.names or tuple(rcols))
    # A right or full join writes a paired key from the right row when the left one is
    # padded (``coalesce``): the left key's column reads the right key too.
    coalesced = paired_keys(node) if node.type in ("right", "full") else set()
    for name, side, src in out:
        who = demand.get(name.lower())
        if who:
            (lneed if side == "left" else rneed).setdefault(src.lower(), set()).update(who)
            if side == "left" and src.lower() in coalesced:
                rneed.setdefault(src.lower(), set()).update(who)
    lread = set().union(*(refs(k, lcols) for k in node.left_keys))
    rread = set().union(*(refs(k, rcols) for k in node.right_keys))
    for text in (node.condition, node.time_bound):
        if text:
            a, b = _sides(node, text, lcols, rcols)
            lread |= a
            rread |= b
    return [merge(lneed, own(node, lread)), merge(rneed, own(node, rread))]


def _sides(node: Join, text: str, lcols: list[str], rcols: list[str]
           ) -> tuple[set[str], set[str]]:
    """The left and the right input columns an expression over both inputs reads
    (qualified by an input's id, or bare where the name is one side's only)."""
    lid, rid = (i.lower() for i in node.inputs)
    lset, rset = set(lcols), set(rcols)
    lread: set[str] = set()
    rread: set[str] = set()
    for parts in E.analyze(text).columns:
        if parts[0] == lid and len(parts) > 1 and parts[1] in lset:
            lread.add(parts[1])
        elif parts[0] == rid and len(parts) > 1 and parts[1] in rset:
            rread.add(parts[1])
        elif parts[0] in lset:
            lread.add(parts[0])
        elif parts[0] in rset:
            rread.add(parts[0])
    return lread, rread


@moves_filter.register
def _moves(node: Join, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    # PushPredicateThroughJoin: a conjunct on one side's columns goes into that side when
    # the join keeps that side's rows as they are, never into the null-padded side of an
    # outer join.  But a conjunct on the padded side that drops nulls sitting on the join
    # makes it an inner one first (EliminateOuterJoin).
    left, right = ins
    out = join_output(node, left.names or tuple(columns(left)),
                      right.names or tuple(columns(right)))
    origin = {name.lower(): (0 if side == "left" else 1, src.lower())
              for name, side, src in out}
    used = refs(conjunct, origin)
    sides = {origin[c][0] for c in used}
    if len(sides) != 1:
        return None
    (side,) = sides
    if side not in _FILTER_SIDES[_effective_type(node, above, origin)]:
        return None
    renames = {c: origin[c][1] for c in used if origin[c][1] != c}
    return [(side, E.substitute(conjunct, renames) if renames else conjunct)]


def _effective_type(node: Join, above: Sequence[str],
                    origin: dict[str, tuple[int, str]]) -> str:
    """The join type Spark runs, given the conjuncts sitting on the join: an outer join
    is inner on a side whose padded rows one of them drops (``EliminateOuterJoin``)."""
    if node.type not in ("left", "right", "full"):
        return node.type
    rejects = set()
    for c in above:
        sides = {origin[x][0] for x in refs(c, origin)}
        if len(sides) == 1 and E.rejects_nulls(c):
            rejects |= sides
    left_padded = node.type in ("right", "full") and 0 not in rejects
    right_padded = node.type in ("left", "full") and 1 not in rejects
    return {(False, False): "inner", (False, True): "left", (True, False): "right",
            (True, True): "full"}[(left_padded, right_padded)]


def state_rows(node: Join, plan: Plan) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The columns (lower-case name, type) of each input that a stateful join keeps in its
    state, left then right, in input order.

    A table-table join (Theseus' own operator) keeps its inputs' whole rows.  A
    stream-stream join is Spark's: its optimizer carries into the join only the columns
    something above it reads (``compat.demand``; a filter conjunct on one side's columns is
    moved below the join and reads them there) and the columns its condition and time
    bound read where they stay in the join (a condition on one side's columns is moved
    below it too, into a side whose rows the join keeps as they are).  The join keys are
    not counted here: the builder computes them into columns of their own
    (``migrate.build.join``), and ``join-keys-changed`` compares them."""
    ins = [plan.info[i] for i in node.inputs]
    if plan.info[node.id].changelog:
        return tuple(tuple(i.columns) for i in ins)
    left, right = ins
    lcols, rcols = columns(left), columns(right)
    demand = demand_at(plan, node.id)
    kept: tuple[set[str], set[str]] = (set(), set())
    coalesced = paired_keys(node) if node.type in ("right", "full") else set()
    for name, side, src in join_output(node, left.names or tuple(lcols),
                                       right.names or tuple(rcols)):
        if demand.get(name.lower()):
            kept[0 if side == "left" else 1].add(src.lower())
            if side == "left" and src.lower() in coalesced:
                kept[1].add(src.lower())
    for text in (node.condition, node.time_bound):
        if not text:
            continue
        for conj in E.conjuncts(text):
            a, b = _sides(node, conj, lcols, rcols)
            moved = E.analyze(conj).deterministic and (
                (a and not b and 0 in _CONDITION_SIDES[node.type]) or
                (b and not a and 1 in _CONDITION_SIDES[node.type]))
            if not moved:
                kept[0].update(a)
                kept[1].update(b)
    return tuple(tuple(c for c in info.columns if c[0] in k) for info, k in zip(ins, kept))


def _state_findings(old: Join, new: Join, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    # Spark compares the state's key schema first, then its value schema.
    for side, field in ((0, "left_keys"), (1, "right_keys")):
        a = _key_types(old, ctx.old, side)
        b = _key_types(new, ctx.new, side)
        if len(a) == len(b) and not all(T.same_layout(x, y) for x, y in zip(a, b)):
            out.append(ctx.f("join-state-schema-changed", f"join '{new.id}' keys its state "
                             f"by ({', '.join(b)}), was ({', '.join(a)}): Spark refuses the "
                             "old state (STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE)", old, new,
                             field))
    before, after = state_rows(old, ctx.old), state_rows(new, ctx.new)
    for side, (a, b) in enumerate(zip(before, after)):
        if len(a) == len(b) and all(T.same_layout(x[1], y[1]) for x, y in zip(a, b)):
            continue
        which = "left" if side == 0 else "right"
        why = "the join keeps whole rows of its inputs" if ctx.ni(new).changelog else \
            "Spark keeps only the columns read above the join or by its condition"
        out.append(ctx.f("join-state-schema-changed", f"the {which} input of stateful join "
                         f"'{new.id}' now keeps ({_show(b)}) in state, was ({_show(a)}): "
                         f"{why}, and the old state does not fit "
                         "(STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE)", old, new,
                         f"inputs/{side}"))
    return out


def _show(cols: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{n} {t}" for n, t in cols) or "no columns"


def _key_types(node: Join, plan: Plan, side: int) -> list[str]:
    keys = node.left_keys if side == 0 else node.right_keys
    sc = scope(plan.info[node.inputs[side]])
    out = []
    for k in keys:
        try:
            out.append(E.type_of(E.analyze(k), sc, k))
        except Exception:  # noqa: BLE001 - a validated plan types; never fail the check here
            out.append(T.UNKNOWN)
    return out


@compare.register
def _compare(old: Join, new: Join, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    f = ctx.f
    o_state, n_state = ctx.oi(old).stateful, ctx.ni(new).stateful
    if o_state != n_state:
        def kind(info: NodeInfo) -> str:
            return "table-table (stateful)" if info.changelog else \
                "stream-stream (stateful)" if info.stateful else "stream-table (stateless)"
        out.append(f("join-statefulness-changed", f"join '{new.id}' changes from "
                     f"{kind(ctx.oi(old))} to {kind(ctx.ni(new))}", old, new, "inputs"))
        return out
    # A stateless join's changes select different rows from now on: a restart suffices.
    soft = {} if n_state else {"effect": "in_place", "severity": "warning"}
    if old.type != new.type:
        if n_state and not ctx.ni(new).changelog and \
                {old.type, new.type} <= SAME_JOIN_STATE:
            out.append(f("join-type-changed", f"join '{new.id}' changes from {old.type} to "
                         f"{new.type}; {SAME_STATE_WHY}", old, new, "type",
                         effect="in_place", severity="warning", history=True,
                         hint=RESTART))
        else:
            out.append(f("join-type-changed", f"join '{new.id}' changes from {old.type} to "
                         f"{new.type}", old, new, "type", **soft))
    if canon_list(old.left_keys) != canon_list(new.left_keys) or \
            canon_list(old.right_keys) != canon_list(new.right_keys):
        out.append(f("join-keys-changed", f"join '{new.id}' keys change from "
                     f"{list(old.left_keys)} = {list(old.right_keys)} to "
                     f"{list(new.left_keys)} = {list(new.right_keys)}", old, new,
                     "left_keys", **soft))
    if _qual(canon(old.time_bound), old) != _qual(canon(new.time_bound), new):
        out.append(f("join-time-bound-changed", f"join '{new.id}' time bound changes from "
                     f"{old.time_bound or 'none'} to {new.time_bound or 'none'}", old, new,
                     "time_bound", **soft))
    if _qual(canon(old.condition), old) != _qual(canon(new.condition), new):
        out.append(f("join-condition-changed", f"join '{new.id}' condition changes from "
                     f"{old.condition or 'none'} to {new.condition or 'none'}", old, new,
                     "condition", **soft))
    if n_state:
        out += _state_findings(old, new, ctx)
    if ctx.oi(old).changelog and ctx.ni(new).changelog and \
            state_buckets(old, ctx.old) != state_buckets(new, ctx.new):
        # versions 2 and 3 key their state by text (a join key's JSON, a bucket's number),
        # so Spark's schema check would not stop a restart reading one layout as the other
        out.append(f("join-state-layout-changed", f"join '{new.id}' keeps its state as "
                     f"{layout(new, ctx.new)} instead of {layout(old, ctx.old)}", old, new,
                     "state_buckets" if new.state_buckets is not None and
                     old.version == new.version else "version"))
    return out


def _qual(text: str | None, node: Join) -> str | None:
    """Qualifiers name input ids, which may be renamed: replace them by their position."""
    if text is None:
        return None
    left, right = (i.lower() for i in node.inputs)
    return text.replace(left + ".", "$0.").replace(right + ".", "$1.")


@sign_step.register
def _sign(node: Join, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    left, right = ins
    lid, rid = (i.lower() for i in node.inputs)
    # Both inputs may be the same subplan (a self-join): tag each side's tokens.
    lt = {n: token("left", t) for n, t in left.columns.items()}
    rt = {n: token("right", t) for n, t in right.columns.items()}
    both = {**{k: t for k, t in rt.items() if k not in lt},
            **{k: t for k, t in lt.items() if k not in rt}}

    def qualified(parts: tuple[str, ...]) -> tuple[str, ...] | None:
        if len(parts) > 1 and parts[0] in (lid, rid):
            side = lt if parts[0] == lid else rt
            if parts[1] in side:
                return (side[parts[1]],) + parts[2:]
        tok = both.get(parts[0])
        return None if tok is None else (tok,) + parts[1:]

    keys = tuple(sorted((canon_expr(lk, by_name(lt)), canon_expr(rk, by_name(rt)))
                        for lk, rk in zip(node.left_keys, node.right_keys)))
    cond = canon_expr(node.condition, qualified) if node.condition else None
    bound = canon_expr(node.time_bound, qualified) if node.time_bound else None
    sig = digest("join", node.version, node.type, left.sig, right.sig, keys, cond, bound,
                 # version 3 (table-table joins only): its bucket count, written or not
                 *((_buckets(node),) if node.version >= BUCKETS_VERSION else ()))
    lnames = plan.info[node.inputs[0]].names if plan.info else tuple(left.columns)
    rnames = plan.info[node.inputs[1]].names if plan.info else tuple(right.columns)
    cols = {}
    for name, side, col in join_output(node, lnames, rnames):
        cols[name.lower()] = (lt if side == "left" else rt)[col.lower()]
    return NodeSig(sig, cols)


#: the sides of each join type whose rows a conjunct may select before the join (the
#: other side's rows are kept, null-padded, whatever they hold)
_PUSHABLE_SIDES = {"inner": ("left", "right"), "left": ("left",), "right": ("right",),
                  "full": (), "left_semi": ("left",), "left_anti": ("left",)}


@push_through.register
def _push_through(node: Join, c: Conjunct, g: PushGraph) -> Targets | None:
    left, right = node.inputs
    out = join_output(node, g.columns(left), g.columns(right))
    origin = {name.lower(): (side, src) for name, side, src in out}
    used = c.used
    sides = {origin[u][0] for u in used if u in origin}
    if not used or len(sides) != 1:
        return None
    side = sides.pop()
    if side not in _PUSHABLE_SIDES[node.type]:
        return None
    if g.is_stateful(node.id):
        # A stream-stream join's state changes meaning under a predicate on other columns.
        keys = node.left_keys if side == "left" else node.right_keys
        names = {n.lower() for n in (g.bare_column(k) for k in keys) if n}
        if not {origin[u][1].lower() for u in used} <= names:
            return None
    if side == "right" and any(name.lower() != src.lower() for name, s, src in out
                               if s == "right"):
        # Right columns renamed <right id>_<name> would change name with a new right input.
        return None
    renames = {u: origin[u][1] for u in used if origin[u][1].lower() != u}
    return [(left if side == "left" else right, c.rename(renames))]


@export_step.register
def _export(node: Join, plan: Plan) -> Code | Refusal:
    if not all(bare(k) for k in node.left_keys + node.right_keys):
        return Refusal(f"join '{node.id}' has expression keys (only column keys are written)")
    lid, rid = node.inputs
    conds = [f"{lid}.{ident(lk.strip('`'))} = {rid}.{ident(rk.strip('`'))}"
             for lk, rk in zip(node.left_keys, node.right_keys)]
    conds += [c for c in (node.condition, node.time_bound) if c]
    cond = " AND ".join(f"({c})" if len(conds) > 1 else c for c in conds) or "true"
    lnames, rnames = plan.info[lid].names, plan.info[rid].names
    paired = paired_keys(node) if node.type in ("right", "full") else set()
    cols = []
    right_names = {n.lower(): n for n in rnames}
    for name, side, src in join_output(node, lnames, rnames):
        ref = f"F.col({py((lid if side == 'left' else rid) + '.' + ident(src))})"
        if side == "left" and src.lower() in paired:
            ref = (f"F.coalesce({ref}, F.col("
                   f"{py(rid + '.' + ident(right_names[src.lower()]))}))")
        cols.append(f"{ref}.alias({py(name)})")
    return Code([f"{var(node.id)} = ({var(lid)}.alias({py(lid)})",
                 f"      .join({var(rid)}.alias({py(rid)}), F.expr({py(cond)}), "
                 f"{py(node.type)})",
                 f"      .select({', '.join(cols)}))"])
