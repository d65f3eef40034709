"""The state a recursive step keeps in its query's checkpoint, read in plain Python.

A plan with recursive steps runs as a loop query per step and an output query
(``migrate/build/recursive.py``). The output query's checkpoint is the query's checkpoint:
its source for the step is the loop's internal topic
(``theseus.recursive.<query>.<step>.<hash>``). The loop keeps its state beside it, as
Parquet written by Spark:

    <checkpoint>/recursive/<step id>/state/R/batch=<n>/    the rows derived in batch n
    <checkpoint>/recursive/<step id>/state/E<i>/batch=<n>/ the rows of the step's input i
                                                           (i >= 1: the inputs its body reads
                                                           besides the loop) in batch n

A restart on the checkpoint reads all of it back: the rows derived so far are what the body
runs over when new input arrives. So the new plan must derive rows of R's columns, and read
the same further inputs, with E<i>'s columns. Only the Parquet footers are read (pyarrow,
which PySpark brings; imported here only, on the ``check --checkpoint`` path).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat.types import parse_type, type_string

#: the Spark schema Spark writes into every Parquet footer it writes
SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"
_BATCH = re.compile(r"batch=(\d+)")
_E = re.compile(r"E(\d+)")
INTERNAL_PREFIX = "theseus.recursive."


@dataclass(frozen=True)
class Table:
    """One folder of the loop's state (R or E<i>): its batches, rows and Spark schema."""

    batches: int
    rows: int
    #: Spark's StructType JSON of the first file with a footer; None: no file written yet
    schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class LoopState:
    step: str
    derived: Table
    inputs: dict[int, Table] = field(default_factory=dict)
    #: the loop's internal topic, as the output query's offsets name it (None: not found)
    topic: str | None = None

    def to_json(self) -> dict[str, Any]:
        def table(t: Table) -> dict[str, Any]:
            return {"batches": t.batches, "rows": t.rows,
                    "columns": type_string(t.schema) if t.schema else None}

        return {"step": self.step, "topic": self.topic, "derived": table(self.derived),
                "inputs": {str(i): table(t) for i, t in sorted(self.inputs.items())}}


def step_of_topic(topic: str) -> str | None:
    """The step id in an internal topic's name (``theseus.recursive.<query>.<step>.<hash>``)."""
    if not topic.startswith(INTERNAL_PREFIX):
        return None
    parts = topic[len(INTERNAL_PREFIX):].rsplit(".", 2)
    return parts[1] if len(parts) == 3 else None


def _table(folder: Path) -> Table:
    import pyarrow.parquet as pq

    batches = sorted((int(m.group(1)), d) for d in folder.iterdir()
                     if d.is_dir() and (m := _BATCH.fullmatch(d.name))) \
        if folder.is_dir() else []
    rows, schema = 0, None
    for _, d in batches:
        for f in sorted(d.glob("*.parquet")):
            md = pq.read_metadata(f)
            rows += md.num_rows
            if schema is None:
                raw = (md.metadata or {}).get(SPARK_ROW_METADATA)
                if raw:
                    schema = json.loads(raw)
    return Table(len(batches), rows, schema)


def read_loop_states(checkpoint: str | Path, topics: list[str] | None = None
                     ) -> dict[str, LoopState]:
    """Every recursive step's state in ``checkpoint`` by step id; ``topics``: the topics of
    the checkpoint's sources (the internal ones are matched to their step)."""
    root = Path(checkpoint) / "recursive"
    if not root.is_dir():
        return {}
    by_step = {s: t for t in (topics or []) if (s := step_of_topic(t))}
    out: dict[str, LoopState] = {}
    for d in sorted(root.iterdir()):
        state = d / "state"
        if not state.is_dir():
            continue
        inputs = {int(m.group(1)): _table(e) for e in sorted(state.iterdir())
                  if e.is_dir() and (m := _E.fullmatch(e.name))}
        out[d.name] = LoopState(d.name, _table(state / "R"), inputs, by_step.get(d.name))
    return out


def columns_of(schema: dict[str, Any] | None) -> list[tuple[str, str]] | None:
    """(name, type) of a Spark StructType JSON's fields, types as Theseus spells them."""
    if schema is None:
        return None
    out = []
    for f in schema.get("fields", []):
        t = type_string(f.get("type"))
        try:
            t = parse_type(t)
        except ValueError:
            pass
        out.append((str(f.get("name")), t))
    return out


__all__ = ["INTERNAL_PREFIX", "LoopState", "Table", "columns_of", "read_loop_states",
           "step_of_topic"]
