"""``top_n`` on Spark: per partition key, a bounded state with the current top rows.

Spark has no streaming ROW_NUMBER, so this is Flink's Top-N operator written with
``applyInPandasWithState``: each micro-batch merges the new rows of a partition with the
stored top ``n``, emits rows that entered the top (op 'U') and retracts rows that fell out
(op 'D'), and stores the new top.  The state holds at most ``n`` rows per partition key.
"""

from __future__ import annotations

import pickle
from typing import Any

from compat.infer import NodeInfo
from compat.steps import TopN
from migrate.build.core import OP, Builder, build_step


@build_step.register
def _build(node: TopN, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout
    from pyspark.sql.types import StringType, StructField, StructType

    (df,) = ins
    F = b.F
    names = list(info.names)
    pcols = [f"__theseus_p{i}" for i in range(len(node.partition_by))]
    ocols = [f"__theseus_o{i}" for i in range(len(node.order_by))]
    for c, e in zip(pcols, node.partition_by):
        df = df.withColumn(c, F.expr(e))
    for c, o in zip(ocols, node.order_by):
        df = df.withColumn(c, F.expr(o.expr))
    df = df.select(*[F.col(f"`{n}`") for n in names], *pcols, *ocols)
    out_schema = StructType(list(df.schema.fields[:len(names)]) +
                            [StructField(OP, StringType())])
    state_schema = "rows binary"
    n = node.n
    desc = [o.desc for o in node.order_by]
    width = len(names)
    n_p = len(pcols)

    def step(key: tuple, batches, state):  # runs on executors
        import pandas as pd

        prev: list[tuple] = pickle.loads(state.get[0]) if state.exists else []
        rows = list(prev)
        for pdf in batches:
            rows.extend(tuple(r) for r in pdf.itertuples(index=False, name=None))

        def sort_key(r: tuple) -> tuple:
            keys = []
            for i, d in enumerate(desc):
                v = r[width + n_p + i]
                missing = v is None or (isinstance(v, float) and v != v)
                # nulls last in both directions
                keys.append((missing, _Rev(v) if d and not missing else v if not missing
                             else 0))
            return tuple(keys)

        rows.sort(key=sort_key)
        top = rows[:n]
        before = {r[:width] for r in prev}
        after = {r[:width] for r in top}
        out = [r[:width] + ("U",) for r in top if r[:width] not in before]
        out += [r[:width] + ("D",) for r in prev if r[:width] not in after]
        state.update((pickle.dumps(top),))
        if out:
            yield pd.DataFrame(out, columns=[*names, OP])

    return df.groupBy(*pcols).applyInPandasWithState(
        step, out_schema, state_schema, "update", GroupStateTimeout.NoTimeout)


class _Rev:
    """Reverses the order of a value inside a sort key (for descending columns)."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: _Rev) -> bool:
        return other.v < self.v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Rev) and other.v == self.v
