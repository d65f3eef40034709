"""``join``: keys computed on each side, joined on equality plus the condition and time
bound; the output columns follow ``compat.steps.join.join_output``."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.steps import Join
from compat.steps.join import ROWS_VERSION, join_output, paired_keys, state_buckets
from migrate.build import changelog
from migrate.build.core import Builder, build_step, q

_HOW = {"left_semi": "left_semi", "left_anti": "left_anti", "full": "full_outer",
        "left": "left_outer", "right": "right_outer"}


@build_step.register
def _build(node: Join, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    F = b.F
    left, right = ins
    lid, rid = node.inputs
    linfo, rinfo = b.plan.info[lid], b.plan.info[rid]
    if info.changelog:
        return changelog.join(b, left, right, node.left_keys, node.right_keys, node.type,
                              join_output(node, linfo.names, rinfo.names), linfo.names,
                              rinfo.names, info.columns, info.names,
                              b.state_name(node.id), node.version >= ROWS_VERSION,
                              buckets=state_buckets(node, b.plan))
    # Keys may be expressions: compute them on each side, then join on the results.
    lk = [f"__theseus_lk{i}" for i in range(len(node.left_keys))]
    rk = [f"__theseus_rk{i}" for i in range(len(node.right_keys))]
    for name, e in zip(lk, node.left_keys):
        left = left.withColumn(name, F.expr(e))
    for name, e in zip(rk, node.right_keys):
        right = right.withColumn(name, F.expr(e))
    lq, rq = left.alias(lid), right.alias(rid)
    cond = None
    for a, c in zip(lk, rk):
        eq = F.col(f"{q(lid)}.{a}") == F.col(f"{q(rid)}.{c}")
        cond = eq if cond is None else cond & eq
    for extra in (node.condition, node.time_bound):
        if extra:
            cond = F.expr(extra) if cond is None else cond & F.expr(extra)
    joined = lq.join(rq, on=cond, how=_HOW.get(node.type, node.type))
    paired = paired_keys(node) if node.type in ("right", "full") else set()
    right_names = {n.lower(): n for n in rinfo.names}
    cols = []
    for name, side, src in join_output(node, linfo.names, rinfo.names):
        col = F.col(f"{q(lid if side == 'left' else rid)}.{q(src)}")
        if side == "left" and src.lower() in paired:
            # the key of an unmatched right row lives on the right side
            col = F.coalesce(col, F.col(f"{q(rid)}.{q(right_names[src.lower()])}"))
        cols.append(col.alias(name))
    return joined.select(*cols)
