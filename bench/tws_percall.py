"""The Python cost per key of a changelog operator, replayed without Spark (issue 31).

PySpark 4.3's ``transformWithStateInPandas`` worker does, for every key: a pandas frame of
the key's rows (``pd.DataFrame(rows)`` of ``itertuples`` rows), ``iloc`` of the value
columns, the processor's ``handleInputRows``, and ``PandasToArrowConversion.convert`` of
each frame it yields (``pyspark/worker.py``, ``transform_with_state_func``).  This replays
that path for the normalisation of ``BENCH_KEYS`` changed keys (default 5000) with the
group functions of two versions of ``migrate/build/changelog.py`` (``BEFORE``, default
the commit before the change, and the working tree), interleaved round by round (the
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
BEFORE = os.environ.get("BEFORE", "a0bc516")


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


def per_key_us(cl, keys: list[str]) -> float:
    import pandas as pd
    from pyspark.sql.conversion import PandasToArrowConversion
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from gates.source import DELETED_COLUMN, OFFSET_COLUMN

    out = StructType([StructField("_0", StructType([StructField(cl.ROW, StringType()),
                                                    StructField(cl.SIGN, LongType())]))])
    columns = [cl.KEY, cl.ROW, DELETED_COLUMN, OFFSET_COLUMN]
    # PySpark's rows come from itertuples(), which renames the underscored columns
    Row = collections.namedtuple("Pandas", ["k", "_1", "_2", "_3"], rename=True)
    states = {k: cl._State(Value()) for k in keys}
    t = time.perf_counter()
    for i, k in enumerate(keys):
        row = Row(k, json.dumps({"user_id": k, "score": i}), False, i)
        pdf = pd.DataFrame([row]).iloc[:, [0, 1, 2, 3]]
        for frame in cl._normalise_group((k,), cl._named(iter([pdf]), columns), states[k]):
            PandasToArrowConversion.convert([frame], out, timezone="UTC", safecheck=True,
                                            arrow_cast=True, assign_cols_by_name=True,
                                            int_to_decimal_coercion_enabled=False)
    return (time.perf_counter() - t) / len(keys) * 1e6


def main() -> int:
    old_src = subprocess.run(["git", "show", f"{BEFORE}:migrate/build/changelog.py"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tmp = Path(tempfile.mkdtemp(prefix="theseus-percall-")) / "changelog_before.py"
    tmp.write_text(old_src)
    sides = {"before": load(tmp, "changelog_before"),
             "after": load(ROOT / "migrate" / "build" / "changelog.py", "changelog_after")}
    keys = [json.dumps({"user_id": f"u{i}"}) for i in range(KEYS)]
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name, cl in sides.items():
            us = per_key_us(cl, keys)
            best[name] = min(best.get(name, us), us)
    print(json.dumps({"keys": KEYS, "rounds": ROUNDS, "before": BEFORE,
                      "us_per_key_best": {k: round(v) for k, v in best.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
