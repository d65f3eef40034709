"""The names of the state of Theseus' changelog operators (``migrate.build.changelog``):
what their checkpoint holds of what the state means.

A changelog operator is a ``transformWithStateInPandas`` operator (from source 3, aggregate
2 and join 2, PySpark's row-based ``transformWithState``, with the same state) whose one
state variable holds JSON text keyed by JSON text: its key and value schemas are the same
whatever the group keys, aggregates, join keys or table keys, so Spark's schema check
cannot see a changed key, and a restart would read the old groups' state as the new
plan's.  The variable (a RocksDB column family, listed by name in the v3 state schema file) is
therefore named after what its state means: ``<kind>_<digest>``, the digest a short hash
of the step's *state descriptor*:

* ``norm`` (a changelog source's normalisation): the table key columns as written (the
  state key is their JSON object, names included) and their types; from source version 4,
  the bucket count (the state key is a bucket's number, its value the bucket's rows by
  table key);
* ``agg`` (an aggregate): the group keys (name as written, canonical expression, type),
  the window, and per aggregate its function, DISTINCT, canonical argument expressions
  and their types (the state keeps the running values by position: a changed argument
  would retract rows with other values than it added);
* ``join`` (a table-table join): the canonical key expressions of each side and their
  types; from join version 3, the bucket count (the state key is a bucket's number, its
  value the bucket's join keys' rows).  Not the join type: the state is both sides'
  current rows whatever the type, and the output before and after each change is
  computed from it with the new type.

Aggregate and column names that only name outputs are left out (renaming an output keeps
the state).  Integer types are one kind here: their JSON is the same, so widening
``int`` to ``bigint`` keeps the state's keys and values.

What Spark does when a restart declares another name (read in Spark's source and
measured on PySpark 4.3, ``tests/integration/test_checkpoint_tws.py``):
``TransformWithStateOperatorProperties.validateOperatorProperties`` fails only on a
variable kept under its name with another type (``STATE_STORE_INVALID_VARIABLE_TYPE_CHANGE``),
``StateSchemaCompatibilityChecker`` accepts added and removed column families; so the
restart starts, the new variable is empty and the old one is never read again: the
operator restarts without its history, wrong state.  ``compat.checkpoint_check``
compares the names the checkpoint holds with the names the new plan declares.

A checkpoint written before the names were introduced holds one variable named
:data:`LEGACY` (``s``) per operator; ``legacy_checkpoint`` finds it, and the builder
keeps that name for such a checkpoint so a running query restarts on its own state (what
it means is then not verified, as before).
"""

from __future__ import annotations

import hashlib
import json
from functools import singledispatch
from pathlib import Path
from typing import Any

from compat import expr as E
from compat import types as T
from compat.infer import scope
from compat.model import Node, Plan
from compat.steps import Aggregate, Join, Source
from compat.steps.join import state_buckets as join_buckets
from compat.steps.source import state_buckets

#: the one state variable's name before state names said what the state means
LEGACY = "s"
#: the state variable's name prefix per step type
KINDS = {"source": "norm", "aggregate": "agg", "join": "join"}
DIGEST_CHARS = 12


def _type(t: str) -> str:
    t = t.lower()
    return "integral" if t in T.INTEGRAL else t


def _expr_type(text: str, plan: Plan, input_id: str) -> str:
    if text.strip() == "*":
        return "*"
    return _type(E.infer_type(E.shape(text), scope(plan.info[input_id])))


def _canon(text: str) -> str:
    return "*" if text.strip() == "*" else E.canonical(text)


@singledispatch
def descriptor(node: Node, plan: Plan) -> dict[str, Any] | None:
    """What the state of ``node``'s changelog operator means (None: the step keeps no
    changelog state).  Every step with a changelog operator registers its own."""
    return None


@descriptor.register
def _source(node: Source, plan: Plan) -> dict[str, Any] | None:
    types = plan.info[node.id].types
    desc: dict[str, Any] = {"step": "source", "key": [[k, _type(types.get(k.lower(), T.UNKNOWN))]
                                                      for k in node.key_columns]}
    buckets = state_buckets(node)
    if buckets is not None:
        # source version 4: a value per bucket of keys, the bucket a number modulo the
        # count; versions 2 and 3 keep the descriptor (and so the name) they always had
        desc["buckets"] = buckets
    return desc


@descriptor.register
def _aggregate(node: Aggregate, plan: Plan) -> dict[str, Any] | None:
    info = plan.info[node.id]
    off = 1 if node.window else 0
    (src,) = node.inputs
    w = node.window
    return {"step": "aggregate",
            "window": None if w is None else [w.type, w.column.lower(), w.size, w.slide,
                                              w.gap],
            "group_by": [[g.name, E.canonical(g.expr), _type(info.columns[off + i][1])]
                         for i, g in enumerate(node.group_by)],
            "aggregates": [[a.function.lower(), bool(a.distinct),
                            [_canon(x) for x in a.args],
                            [_expr_type(x, plan, src) for x in a.args]]
                           for a in node.aggregates]}


@descriptor.register
def _join(node: Join, plan: Plan) -> dict[str, Any] | None:
    lid, rid = node.inputs
    desc: dict[str, Any] = {
        "step": "join",
        "left_keys": [[E.canonical(k), _expr_type(k, plan, lid)] for k in node.left_keys],
        "right_keys": [[E.canonical(k), _expr_type(k, plan, rid)] for k in node.right_keys]}
    buckets = join_buckets(node, plan)
    if buckets is not None:
        # join version 3: a value per bucket of join keys, the bucket a number modulo the
        # count; versions 1 and 2 keep the descriptor (and so the name) they always had
        desc["buckets"] = buckets
    return desc


def digest(desc: dict[str, Any]) -> str:
    text = json.dumps(desc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def state_name(plan: Plan, node_id: str) -> str:
    """The state variable name of ``node_id``'s changelog operator: ``<kind>_<digest>``."""
    node = plan.nodes[node_id]
    desc = descriptor(node, plan)
    if desc is None:
        raise ValueError(f"step '{node.step}' keeps no changelog state")
    return f"{KINDS[node.step]}_{digest(desc)}"


def describe(plan: Plan, node_id: str) -> str:
    """``state_name``'s descriptor as a line a report can show."""
    node = plan.nodes[node_id]
    d = descriptor(node, plan) or {}
    if d.get("step") == "source":
        keys = "table key (" + ", ".join(f"{k} {t}" for k, t in d["key"]) + ")"
        return keys + (f" in {d['buckets']} buckets" if "buckets" in d else "")
    if d.get("step") == "aggregate":
        keys = ", ".join(f"{e} {t}" for _n, e, t in d["group_by"])
        aggs = ", ".join(f"{fn}({'DISTINCT ' if dist else ''}{', '.join(args)})"
                         for fn, dist, args, _t in d["aggregates"])
        win = f"window {d['window'][0]} {d['window'][2]}; " if d["window"] else ""
        return f"{win}group by ({keys}); {aggs}"
    if d.get("step") == "join":
        keys = "join keys (" + ", ".join(f"{a[0]} = {b[0]}" for a, b in
                                         zip(d["left_keys"], d["right_keys"])) + ")"
        return keys + (f" in {d['buckets']} buckets" if "buckets" in d else "")
    return node.step


def is_named(name: str) -> bool:
    """Whether a column family name is one ``state_name`` gives."""
    kind, _, dig = name.partition("_")
    return kind in KINDS.values() and len(dig) == DIGEST_CHARS and \
        all(c in "0123456789abcdef" for c in dig)


def legacy_checkpoint(path: str | None) -> bool:
    """Whether the checkpoint at ``path`` holds changelog state under the :data:`LEGACY`
    name (a query started before state names said what the state means).  A missing or
    unreadable directory is not a legacy checkpoint: a query starting on it starts
    afresh."""
    if not path:
        return False
    from compat.checkpoint import CheckpointError, read_schema_file

    root = Path(path.removeprefix("file:"))
    state = root / "state"
    if not state.is_dir():
        return False
    for f in sorted(state.glob("*/_stateSchema/*/*")):
        try:
            fams = read_schema_file(f)
        except (CheckpointError, OSError):
            continue
        if isinstance(fams, list) and any(
                (d.get("colFamilyName") or d.get("columnFamilyName")) == LEGACY for d in fams):
            return True
    return False
