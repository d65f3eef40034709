"""Top-N: partitioning and ordering define the state; a larger N needs rows the state
dropped, a smaller N does not."""

from __future__ import annotations

from compat import types as T
from compat.findings import Finding
from compat.model import TopN
from compat.rules import RuleContext, canon_list


def check_top_n(old: TopN, new: TopN, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    f = ctx.f
    if canon_list(old.partition_by) != canon_list(new.partition_by):
        out.append(f("topn-partition-changed", f"top_n '{new.id}' partitions by "
                     f"{list(new.partition_by)} instead of {list(old.partition_by)}",
                     old, new, "partition_by"))
    okeys = [(k, o.desc) for k, o in zip(canon_list([o.expr for o in old.order_by]),
                                         old.order_by)]
    nkeys = [(k, o.desc) for k, o in zip(canon_list([o.expr for o in new.order_by]),
                                         new.order_by)]
    if okeys != nkeys:
        out.append(f("topn-order-changed", f"top_n '{new.id}' orders by a different key",
                     old, new, "order_by"))
    if new.n > old.n:
        out.append(f("topn-n-increased", f"top_n '{new.id}' keeps {new.n} rows per "
                     f"partition instead of {old.n}; the state only has the old top {old.n}",
                     old, new, "n"))
    elif new.n < old.n:
        out.append(f("topn-n-decreased", f"top_n '{new.id}' keeps {new.n} rows per "
                     f"partition instead of {old.n}", old, new, "n"))
    a = ctx.old.info[old.inputs[0]].columns
    b = ctx.new.info[new.inputs[0]].columns
    if len(a) != len(b) or not all(T.same_layout(x[1], y[1]) for x, y in zip(a, b)):
        out.append(f("topn-state-schema-changed", f"top_n '{new.id}' keeps whole input rows "
                     "in state and the input columns changed", old, new, "inputs"))
    return out
