"""The Python cost per key of a changelog operator, replayed without Spark (issue 31).

PySpark 4.3's ``transformWithStateInPandas`` worker does, for every key: a pandas frame of
the key's rows (``pd.DataFrame(rows)`` of ``itertuples`` rows), ``iloc`` of the value
columns, the processor's ``handleInputRows``, and ``PandasToArrowConversion.convert`` of
each frame it yields (``pyspark/worker.py``, ``transform_with_state_func``).  Its row-based
``transformWithState`` worker builds a ``Row`` per input row from the Arrow batch (an
``as_py()`` per cell), calls ``handleInputRows`` with them, and turns each key's output
Rows into an Arrow batch (``asDict`` then ``RecordBatch.from_pylist``, ``convert_results``).

This replays those paths for the normalisation of ``BENCH_KEYS`` changed keys (default
5000): the pandas path with ``migrate/build/changelog.py`` of ``BEFORE`` (default the
commit before the row-based versions) and of the working tree (the old versions' operator),
and the row path of the working tree (the new versions'), interleaved round by round (the
best of ``ROUNDS``, default 5), with a value state that costs nothing: the state server's
round trips are not in it.  Run: ``PYTHONPATH=. .venv/bin/python bench/tws_percall.py``.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
KEYS = int(os.environ.get("BENCH_KEYS", "5000"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
BEFORE = os.environ.get("BEFORE", "64c897b")


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


class Value:
    """A value state held in the process (``exists``/``get``/``update``/``clear``)."""

    def __init__(self) -> None:
        self.v = None

    def exists(self) -> bool:
        return self.v is not None

    def get(self):
        return self.v

    def update(self, v) -> None:
        self.v = v

    def clear(self) -> None:
        self.v = None


class _Grouped:
    """What ``changelog._stateful`` calls on a DataFrame: answers the processor."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns

    def groupBy(self, key):  # noqa: N802
        return self

    def transformWithState(self, processor, *args):  # noqa: N802
        return processor

    transformWithStateInPandas = transformWithState


class _Handle:
    def getValueState(self, name, schema):  # noqa: N802
        return Value()


def _processors(cl, columns: list[str], rows: bool, keys: list[str]) -> dict:
    from gates.source import DELETED_COLUMN, OFFSET_COLUMN

    procs = {}
    for k in keys:
        proc = cl._stateful(_Grouped(columns), cl._normalise_group,
                            (OFFSET_COLUMN, DELETED_COLUMN, cl.ROW), "row string", "norm_x",
                            rows)
        proc.init(_Handle())
        procs[k] = proc
    return procs


def per_key_us(cl, keys: list[str], rows: bool = False) -> float:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import Row as SparkRow
    from pyspark.sql.conversion import PandasToArrowConversion
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from gates.source import DELETED_COLUMN, OFFSET_COLUMN

    out = StructType([StructField("_0", StructType([StructField(cl.ROW, StringType()),
                                                    StructField(cl.SIGN, LongType())]))])
    columns = [cl.KEY, cl.ROW, DELETED_COLUMN, OFFSET_COLUMN]
    # PySpark's rows come from itertuples(), which renames the underscored columns
    Row = collections.namedtuple("Pandas", ["k", "_1", "_2", "_3"], rename=True)
    new = hasattr(cl, "_normalise_group") and not hasattr(cl, "_named")
    if new:
        procs = _processors(cl, columns, rows, keys)
    else:
        states = {k: cl._State(Value()) for k in keys}
    arrow_out = pa.schema([(cl.ROW, pa.string()), (cl.SIGN, pa.int64())])
    batch = pa.RecordBatch.from_pylist(
        [{c: v for c, v in zip(columns, (k, json.dumps({"user_id": k, "score": i}), False, i))}
         for i, k in enumerate(keys)])
    t = time.perf_counter()
    if rows:
        data_row = SparkRow(*batch.schema.names)
        for i, k in enumerate(keys):
            row = data_row(*(batch.column(c)[i].as_py() for c in range(batch.num_columns)))
            result = [r.asDict(True) for r in procs[k].handleInputRows((k,), iter([row]), None)]
            pa.RecordBatch.from_pylist(result, schema=arrow_out)
        return (time.perf_counter() - t) / len(keys) * 1e6
    for i, k in enumerate(keys):
        row = Row(k, json.dumps({"user_id": k, "score": i}), False, i)
        pdf = pd.DataFrame([row]).iloc[:, [0, 1, 2, 3]]
        if new:
            frames = procs[k].handleInputRows((k,), iter([pdf]), None)
        else:
            frames = cl._normalise_group((k,), cl._named(iter([pdf]), columns), states[k])
        for frame in frames:
            PandasToArrowConversion.convert([frame], out, timezone="UTC", safecheck=True,
                                            arrow_cast=True, assign_cols_by_name=True,
                                            int_to_decimal_coercion_enabled=False)
    return (time.perf_counter() - t) / len(keys) * 1e6


def main() -> int:
    old_src = subprocess.run(["git", "show", f"{BEFORE}:migrate/build/changelog.py"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tmp = Path(tempfile.mkdtemp(prefix="theseus-percall-")) / "changelog_before.py"
    tmp.write_text(old_src)
    after = load(ROOT / "migrate" / "build" / "changelog.py", "changelog_after")
    sides = {"before": (load(tmp, "changelog_before"), False), "after": (after, False),
             "after_rows": (after, True)}
    keys = [json.dumps({"user_id": f"u{i}"}) for i in range(KEYS)]
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name, (cl, rows) in sides.items():
            us = per_key_us(cl, keys, rows)
            best[name] = min(best.get(name, us), us)
    print(json.dumps({"keys": KEYS, "rounds": ROUNDS, "before": BEFORE,
                      "us_per_key_best": {k: round(v) for k, v in best.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
