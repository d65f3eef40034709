"""Tables read as changelogs, on Spark: upserts normalised into retractions, and the steps
that keep a table's state (aggregate, table-table join) as retracting operators.

A changelog is carried as a DataFrame of the node's columns plus ``_theseus_sign``
(``+1`` a row enters the table, ``-1`` a row leaves it; Flink's ``[I,UB,UA,D]`` with UB and
D as ``-1``, I and UA as ``+1``).  Spark sees only appended rows, so stateless steps apply
to it as they are (a filter keeps the retraction of a row only if it kept the row; a
project maps both), and the sink turns each micro-batch's signed rows into upserts and
tombstones per key (``gates.sink``).

Stateful steps are ``transformWithStateInPandas`` operators in ``Append`` mode, keyed by a
JSON text of their key (``to_json`` in the JVM, so every Spark type keys alike), their rows
carried as JSON text too (``from_json`` with the node's inferred schema reads them back):

* **normalise** (the source): the previous value per table key in state; every record is
  the old row's retraction plus the new row, a tombstone the old row's retraction alone, a
  record equal to the current row nothing (Flink's ``ChangelogNormalize``).  From source
  version 4 the state is kept per bucket of table keys (one JSON object of the bucket's
  current rows, the operator keyed by the bucket's number): the same output, with one
  state round trip per bucket and batch instead of per key;
* **aggregate**: per group the number of rows and, per function, retraction-safe state
  (count; an exact sum and the non-null count for sum and avg — an int for integers,
  Shewchuk's partials for floats, so a retraction subtracts exactly what was added; a
  count per value for min and max, so that retracting the minimum finds the next one);
  the group's old output row is retracted and its new one added, and a group left with
  no rows only retracted;
* **join** (inner or left, equal keys; a foreign-key join is one): per join key the current
  rows of each side as counted multisets; the output for the key before and after the
  batch's changes is compared and the difference emitted.  Rows with a null key match
  nothing and keep no state (a left row with one passes, padded with nulls).  From join
  version 3 the state is kept per bucket of join keys (one JSON object of the bucket's
  join keys' rows, the operator keyed by the bucket's number): the same output, with one
  state round trip per bucket and batch instead of per join key.

Why ``transformWithStateInPandas``: a table aggregate or join chains two stateful operators
(the normalisation, then the aggregate or join), and Spark refuses a second
``applyInPandasWithState`` in one query ("Multiple applyInPandasWithStates are not
supported", measured on PySpark 4.3), while ``transformWithState`` operators chain in append
mode.  It needs the RocksDB state store, which ``theseus run`` configures for every query
(``Builder.start`` sets it for a changelog query whose session does not).  Its state is
versioned with the checkpoint: a batch replayed after a crash starts from the state of the
batch before it and produces the same rows, which the exactly-once sink then skips.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from gates.sink import JSON_OPTIONS, SIGN_COLUMN
from migrate.build.core import ddl, q
from migrate.build.profiling import profile_dir, profiled

SIGN = SIGN_COLUMN
ROW = "_theseus_row"
KEY = "_theseus_key"
SIDE = "_theseus_side"
#: the join key of a left row whose key is null (join version 2): no JSON object's text,
#: and a string, so that PySpark's state client keys its group as any other
NULL_KEY = ""
#: a bucketed normalisation's table key (source version 4; ``KEY`` is then the bucket)
TABLE_KEY = "_theseus_tk"
#: a bucketed normalisation's state: the bucket's rows by table key.  Its field is not
#: version 3's ``row``, so that a checkpoint's value schema tells the layouts apart too.
BUCKET_STATE = "rows string"
#: a bucketed join's join key (join version 3; ``KEY`` is then the bucket)
JOIN_KEY = "_theseus_jk"
#: a bucketed join's state: the bucket's join keys' rows of both sides.  Its one field is
#: not version 2's ``l`` and ``r``, so that a checkpoint's value schema tells the layouts
#: apart too.
JOIN_BUCKET_STATE = "keys string"
#: how a stateful changelog operator's output is typed before ``from_json``
OUT_SCHEMA = f"{ROW} string, {SIGN} bigint"


class _State:
    """A transformWithState value state as the group functions use it: ``value`` (the
    key's value, or None), ``update``, ``remove``.  Each call is a round trip to the JVM's
    state server (``bench/results/profile_tables.md``): a key's value is read once, with
    ``get`` alone (it answers None for a key without state), not ``exists`` then ``get``."""

    def __init__(self, vs: Any) -> None:
        self.vs = vs

    def value(self) -> tuple | None:
        v = self.vs.get()
        return None if v is None else tuple(v)

    def update(self, v: tuple) -> None:
        self.vs.update(tuple(v))

    def remove(self) -> None:
        self.vs.clear()


def _stateful(df: Any, core: Any, fields: tuple[str, ...], state_schema: str,
              state_name: str, rows: bool) -> Any:
    """``core(key, changes, state)`` over each group of ``df`` by ``KEY``: ``changes`` the
    group's rows as tuples of ``fields``, the result the ``(row, sign)`` pairs to output.
    Its state is a value of ``state_schema`` named ``state_name`` (``compat.tws_state``:
    what the state means, so that the checkpoint tells it).  ``rows``: PySpark's row-based
    ``transformWithState`` (the new step versions) instead of ``transformWithStateInPandas``
    (the old ones); one operator in append mode either way, the same state."""
    from pyspark.sql.streaming import StatefulProcessor

    # by position: PySpark 4.3 rebuilds each pandas chunk from itertuples(), which renames
    # columns that start with an underscore, and a Row's fields are read faster so too
    pick = itemgetter(*[list(df.columns).index(f) for f in fields])

    class Processor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.state = _State(handle.getValueState(state_name, state_schema))

        def close(self) -> None:
            pass

    if rows:
        from pyspark.sql import Row

        out_row = Row(ROW, SIGN)

        class RowProcessor(Processor):
            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
                for text, sign in core(key, map(pick, rows), self.state):
                    yield out_row(text, sign)

        cls: type = RowProcessor
    else:
        class PandasProcessor(Processor):
            def handleInputRows(self, key: Any, pdfs: Any, timerValues: Any) -> Any:  # noqa: N802,N803
                # one list of row lists per frame: per-column reads and renames cost ~77
                # us per key, this ~6 (bench/results/profile_tables_after.md)
                changes = (pick(r) for pdf in pdfs for r in pdf.to_numpy().tolist())
                out = core(key, changes, self.state)
                if out:
                    yield _frame(out)

        cls = PandasProcessor
    folder = profile_dir()
    if folder:
        cls = profiled(cls, folder, state_name)
    grouped = df.groupBy(KEY)
    if rows:
        return grouped.transformWithState(cls(), OUT_SCHEMA, "Append", "None")
    return grouped.transformWithStateInPandas(cls(), OUT_SCHEMA, "Append", "None")


def _frame(rows: list[tuple[str, int]]) -> Any:
    import pandas as pd

    # from the row tuples: built from a dict of columns with ``columns=`` given, this frame
    # was 25 % of the normalisation's Python time (bench/results/profile_tables.md),
    # ~280 us per key against ~75 us this way
    return pd.DataFrame(rows, columns=[ROW, SIGN])


def _dumps(d: Any) -> str:
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False)


def unpack(b: Any, df: Any, columns: tuple[tuple[str, str], ...], names: tuple[str, ...]
           ) -> Any:
    """The node's columns (and the sign) back from an operator's JSON rows."""
    F = b.F
    parsed = df.select(F.from_json(F.col(ROW), ddl(columns, names), JSON_OPTIONS).alias("r"),
                       F.col(SIGN))
    return parsed.select(*[F.col(f"r.{q(n)}").alias(n) for n in names], F.col(SIGN))


def _pack(b: Any, names: list[str] | tuple[str, ...]) -> Any:
    F = b.F
    return F.to_json(F.struct(*[F.col(q(n)) for n in names]), JSON_OPTIONS)


# -- the source: upserts -> retractions ------------------------------------------------------

def normalise(b: Any, df: Any, key_columns: tuple[str, ...], names: tuple[str, ...],
              columns: tuple[tuple[str, str], ...], state_name: str, rows: bool = False,
              buckets: int | None = None) -> Any:
    """A changelog source's rows (``gates.source`` role ``changelog``) as signed rows;
    ``rows``: on the row-based operator (source version 3); ``buckets``: on the row-based
    operator with the state kept per bucket of table keys, that many (source version 4)."""
    from gates.source import DELETED_COLUMN, OFFSET_COLUMN

    F = b.F
    key = _pack(b, list(key_columns))
    if buckets is not None:
        # the bucket's number as text: the state key stays a string, as every changelog
        # operator's is; xxhash64 is Spark's, seeded alike on every executor and release
        packed = df.select(
            F.pmod(F.xxhash64(key), F.lit(buckets)).cast("string").alias(KEY),
            key.alias(TABLE_KEY), _pack(b, names).alias(ROW), F.col(DELETED_COLUMN),
            F.col(OFFSET_COLUMN))
        out = _stateful(packed, _normalise_bucket,
                        (TABLE_KEY, OFFSET_COLUMN, DELETED_COLUMN, ROW), BUCKET_STATE,
                        state_name, True)
        return unpack(b, out, columns, names)
    packed = df.select(key.alias(KEY), _pack(b, names).alias(ROW),
                       F.col(DELETED_COLUMN), F.col(OFFSET_COLUMN))
    out = _stateful(packed, _normalise_group, (OFFSET_COLUMN, DELETED_COLUMN, ROW),
                    "row string", state_name, rows)
    return unpack(b, out, columns, names)


def _normalise_group(key: tuple, changes: Iterable[tuple], state: Any
                     ) -> list[tuple[str, int]]:
    """``changes`` as (offset, deleted, row)."""
    v = state.value()
    old = v[0] if v is not None else None
    # a key's last change in the order they were written decides
    last = max(changes, key=itemgetter(0), default=None)
    cur = old if last is None else None if last[1] else last[2]
    if cur == old:
        return []
    out = []
    if old is not None:
        out.append((old, -1))
    if cur is not None:
        out.append((cur, 1))
        state.update((cur,))
    else:
        state.remove()
    return out


def _normalise_bucket(key: tuple, changes: Iterable[tuple], state: Any
                      ) -> list[tuple[str, int]]:
    """``changes`` as (table key, offset, deleted, row) of one bucket's keys; the state one
    JSON object of the bucket's current rows by table key (source version 4).  Per table
    key, what ``_normalise_group`` does; the keys' outputs in the order of their last
    changes' offsets (the table key breaking ties), whatever order Spark hands them in."""
    last: dict[str, tuple] = {}
    for c in changes:
        seen = last.get(c[0])
        if seen is None or c[1] > seen[1]:  # a key's last change in the order written
            last[c[0]] = c
    if not last:
        return []
    v = state.value()
    current: dict[str, str] = json.loads(v[0]) if v is not None else {}
    out = []
    for tk, _off, deleted, row in sorted(last.values(), key=itemgetter(1, 0)):
        old = current.get(tk)
        cur = None if deleted else row
        if cur == old:
            continue
        if old is not None:
            out.append((old, -1))
        if cur is not None:
            out.append((cur, 1))
            current[tk] = cur
        else:
            del current[tk]
    if out:
        _write_bucket(state, current)
    return out


# -- aggregate with retraction -----------------------------------------------------------------

def aggregate(b: Any, df: Any, group_by: list[tuple[str, str]],
              calls: list[tuple[str, str, list[str]]], columns: tuple[tuple[str, str], ...],
              names: tuple[str, ...], state_name: str, rows: bool = False) -> Any:
    """``group_by`` as (name, expression), ``calls`` as (name, function, argument
    expressions): the signed rows of each group's output; ``rows``: on the row-based
    operator (aggregate version 2)."""
    F = b.F
    keys = [F.expr(e).alias(n) for n, e in group_by]
    args = []
    for i, (_n, _fn, exprs) in enumerate(calls):
        for j, e in enumerate(exprs):
            if e.strip() != "*":
                args.append(F.expr(e).alias(f"a{i}_{j}"))
    pre = df.select(*keys, *args, F.col(SIGN))
    key_names = [n for n, _ in group_by]
    arg_names = [a for a in pre.columns if a not in key_names and a != SIGN]
    packed = pre.select(_pack(b, key_names).alias(KEY), _pack(b, arg_names).alias(ROW),
                        F.col(SIGN))
    spec = [(name, fn.lower(), [f"a{i}_{j}" if e.strip() != "*" else "*"
                                for j, e in enumerate(exprs)])
            for i, (name, fn, exprs) in enumerate(calls)]

    def fn(key: tuple, changes: Iterable[tuple], state: Any) -> list[tuple[str, int]]:
        return _aggregate_group(spec, key, changes, state)

    out = _stateful(packed, fn, (ROW, SIGN), "st string", state_name, rows)
    return unpack(b, out, columns, names)


# -- exact sums -----------------------------------------------------------------------------
#
# A running float sum that subtracts what it added is not exact: 0.1 + 0.2 + 1e16 - 1e16
# is 0.0, and the error stays in the state for good.  A sum of integers is kept as a
# Python int (exact at any size).  A sum of floats is kept as Shewchuk's non-overlapping
# partials (what ``math.fsum`` keeps while it adds: at most a few dozen floats whose exact
# sum is the exact sum of the values added so far), so adding the negation of a value
# retracts it exactly and the output is the correctly rounded sum of the rows in the
# group, whatever order they came and left in.  Non-finite values (Spark's JSON writes them
# as "NaN", "Infinity", "-Infinity") are counted apart: the sum is NaN while a NaN, or an
# infinity of each sign, is in the group, else the infinity that is.

def _grow(partials: list[float], x: float) -> list[float]:
    """Shewchuk's partials after adding ``x`` (``math.fsum``'s inner loop)."""
    out = []
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            out.append(lo)
        x = hi
    if x or not out:
        out.append(x)
    return [p for p in out if p]


def _number(v: Any) -> Any:
    """A JSON value of a numeric column: a number, or Spark's text for a non-finite
    double."""
    return float(v) if isinstance(v, str) else v


def add_exact(total: Any, x: Any) -> Any:
    """``total`` (an int, an old state's float, or ``{"p": partials, "x": {non-finite:
    count}}``) plus ``x`` (a signed value), exactly."""
    if isinstance(total, int) and isinstance(x, int):
        return total + x
    if isinstance(total, dict):
        acc = {"p": list(total.get("p", ())), "x": dict(total.get("x", {}))}
    else:  # 0, or a float sum of a state written before sums were exact
        acc = {"p": [float(total)] if total else [], "x": {}}
    x = float(x)
    if math.isfinite(x):
        acc["p"] = _grow(acc["p"], x)
    else:
        # a retraction of +inf is sign -1 times inf: count it by the value it retracts
        name = "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"
        acc["x"][name] = acc["x"].get(name, 0) + 1
    return acc


def sub_exact(total: Any, v: Any) -> Any:
    """``total`` with the value ``v`` of a row that leaves the group taken out, exactly."""
    if isinstance(v, float) and not math.isfinite(v):
        acc = add_exact(total, 0.0)
        name = "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
        left = acc["x"].get(name, 0) - 1
        if left:
            acc["x"][name] = left
        else:
            acc["x"].pop(name, None)
        return acc
    return add_exact(total, -v)


def exact_value(total: Any) -> Any:
    """The correctly rounded value of an exact sum."""
    if not isinstance(total, dict):
        return total
    x = total.get("x", {})
    if x.get("nan") or (x.get("inf") and x.get("-inf")):
        return math.nan
    if x.get("inf"):
        return math.inf
    if x.get("-inf"):
        return -math.inf
    return math.fsum(total.get("p", ()))


def _agg_value(fn: str, st: Any) -> Any:
    if fn == "count":
        return st
    if fn in ("sum", "avg"):
        total, n = st
        if n == 0:
            return None
        total = exact_value(total)
        return total / n if fn == "avg" else total
    # min / max: st maps the JSON text of each value to how many rows hold it
    vals = [json.loads(v) for v, c in st.items() if c > 0]
    if not vals:
        return None
    return min(vals) if fn == "min" else max(vals)


def _aggregate_group(spec: list[tuple[str, str, list[str]]], key: tuple,
                     changes: Iterable[tuple], state: Any) -> list[tuple[str, int]]:
    """``changes`` as (row, sign)."""
    (key_json,) = key
    v = state.value()
    if v is not None:
        st = json.loads(v[0])
    else:
        st = {"rows": 0, "aggs": [0 if fn == "count" else [0, 0] if fn in ("sum", "avg")
                                  else {} for _n, fn, _a in spec]}
    group = json.loads(key_json)

    def output() -> str | None:
        if st["rows"] <= 0:
            return None
        out = dict(group)
        for (name, fn, _args), s in zip(spec, st["aggs"]):
            out[name] = _agg_value(fn, s)
        return _dumps(out)

    before = output()
    for row, sign in changes:
        vals = json.loads(row)
        st["rows"] += sign
        for i, (_name, fn, args) in enumerate(spec):
            v = None if args == ["*"] else vals.get(args[0]) if args else None
            if fn == "count":
                if args in ([], ["*"]) or v is not None:
                    st["aggs"][i] += sign
            elif v is None:
                continue
            elif fn in ("sum", "avg"):
                v = _number(v)
                acc = st["aggs"][i]
                for _ in range(abs(sign)):  # a sign is +1 or -1; a count, as many
                    acc[0] = add_exact(acc[0], v) if sign > 0 else sub_exact(acc[0], v)
                acc[1] += sign
            else:
                k = _dumps(v)
                c = st["aggs"][i].get(k, 0) + sign
                if c:
                    st["aggs"][i][k] = c
                else:
                    st["aggs"][i].pop(k, None)
    after = output()
    if st["rows"] > 0:
        state.update((_dumps(st),))
    else:
        state.remove()  # an emptied group leaves no state behind
    if before == after:
        return []
    out = []
    if before is not None:
        out.append((before, -1))
    if after is not None:
        out.append((after, 1))
    return out


# -- table-table join --------------------------------------------------------------------------

def join(b: Any, left: Any, right: Any, left_keys: tuple[str, ...],
         right_keys: tuple[str, ...], how: str, out: list[tuple[str, str, str]],
         left_names: tuple[str, ...], right_names: tuple[str, ...],
         columns: tuple[tuple[str, str], ...], names: tuple[str, ...], state_name: str,
         rows: bool = False, buckets: int | None = None) -> Any:
    """An inner or left join of two changelogs on equal keys; ``out`` is
    ``compat.steps.join.join_output``'s (output name, side, input column).  ``rows``: on
    the row-based operator, a left row with a null key padded by it (join version 2);
    ``buckets``: so, with the state kept per bucket of join keys, that many (join version
    3)."""
    F = b.F
    if buckets is not None:
        rows = True

    def null_key(keys: tuple[str, ...]) -> Any:
        out = None
        for e in keys:
            isnull = F.expr(e).isNull()
            out = isnull if out is None else out | isnull
        return out

    def side(df: Any, keys: tuple[str, ...], cols: tuple[str, ...], tag: int,
             pad: bool) -> Any:
        kcols = [F.expr(e).alias(f"k{i}") for i, e in enumerate(keys)]
        key = F.to_json(F.struct(*kcols), JSON_OPTIONS)
        group = key
        if buckets is not None:
            # the bucket's number as text: the state key stays a string, as every changelog
            # operator's is; xxhash64 is Spark's, seeded alike on every executor and release
            group = F.pmod(F.xxhash64(key), F.lit(buckets)).cast("string")
        if pad:
            # one group for the null key, which the operator pads without state
            isnull = null_key(keys)
            key = F.when(isnull, F.lit(NULL_KEY)).otherwise(key)
            group = F.when(isnull, F.lit(NULL_KEY)).otherwise(group)
        else:
            # SQL equality: a row with a null key matches nothing, so it never enters state
            df = df.where(~null_key(keys))
        carried = [key.alias(JOIN_KEY)] if buckets is not None else []
        return df.select(group.alias(KEY), *carried, F.lit(tag).alias(SIDE),
                         _pack(b, cols).alias(ROW), F.col(SIGN))

    pad = rows and how == "left"
    both = side(left, left_keys, left_names, 0, pad).unionByName(
        side(right, right_keys, right_names, 1, False))
    spec = (how, out)

    if buckets is not None:
        def by_bucket(key: tuple, changes: Iterable[tuple], state: Any
                      ) -> list[tuple[str, int]]:
            return _join_bucket(spec, key, changes, state)

        return unpack(b, _stateful(both, by_bucket, (JOIN_KEY, SIDE, ROW, SIGN),
                                   JOIN_BUCKET_STATE, state_name, True), columns, names)

    def fn(key: tuple, changes: Iterable[tuple], state: Any) -> list[tuple[str, int]]:
        return _join_group(spec, key, changes, state)

    res = unpack(b, _stateful(both, fn, (SIDE, ROW, SIGN), "l string, r string", state_name,
                              rows), columns, names)
    if how != "left" or pad:
        return res
    # Version 1: a left row with a null key is output padded with nulls, and retracted so,
    # apart from the operator; Spark plans the left normalisation a second time for it
    # (bench/results/profile_tables.md), kept for version 1's operators.
    types = dict(zip(names, (t for _, t in columns)))
    padded = left.where(null_key(left_keys)).select(
        *[(F.col(q(src)) if s == "left" else F.lit(None).cast(types[name])).alias(name)
          for name, s, src in out], F.col(SIGN))
    return res.unionByName(padded)


def _padded(out: list[tuple[str, str, str]], left_row: dict) -> dict:
    return {name: left_row.get(src) if s == "left" else None for name, s, src in out}


def _joined(spec: tuple[str, list[tuple[str, str, str]]], lrows: Counter, rrows: Counter
            ) -> Counter:
    how, out = spec
    result: Counter = Counter()
    rights = [(json.loads(r), c) for r, c in rrows.items() if c > 0]
    for lr, lc in lrows.items():
        if lc <= 0:
            continue
        ld = json.loads(lr)
        if rights:
            for rd, rc in rights:
                row = {name: (ld if s == "left" else rd).get(src) for name, s, src in out}
                result[_dumps(row)] += lc * rc
        elif how == "left":
            result[_dumps(_padded(out, ld))] += lc
    return result


def _join_group(spec: tuple[str, list[tuple[str, str, str]]], key: tuple,
                changes: Iterable[tuple], state: Any) -> list[tuple[str, int]]:
    """``changes`` as (side, row, sign)."""
    (key_json,) = key
    if key_json == NULL_KEY:
        return _null_keyed(spec, changes)
    v = state.value()
    if v is not None:
        ls, rs = v
        lrows, rrows = Counter(json.loads(ls)), Counter(json.loads(rs))
    else:
        lrows, rrows = Counter(), Counter()
    diff = _join_changes(spec, lrows, rrows, changes)
    if lrows or rrows:
        state.update((_dumps(dict(lrows)), _dumps(dict(rrows))))
    else:
        state.remove()
    return diff


def _null_keyed(spec: tuple[str, list[tuple[str, str, str]]], changes: Iterable[tuple]
                ) -> list[tuple[str, int]]:
    """A left join's left rows with a null key (join versions 2 and 3), as (side, row,
    sign): each passes padded, with its sign, as it would unmatched; they match nothing,
    so they keep no state."""
    return [(_dumps(_padded(spec[1], json.loads(row))), sign) for _side, row, sign in changes]


def _join_changes(spec: tuple[str, list[tuple[str, str, str]]], lrows: Counter,
                  rrows: Counter, changes: Iterable[tuple]) -> list[tuple[str, int]]:
    """One join key's rows of each side (``lrows``, ``rrows``, changed in place) after
    ``changes`` as (side, row, sign); the joined rows' difference, added rows first."""
    before = _joined(spec, lrows, rrows)
    for side, row, sign in changes:
        rows = lrows if side == 0 else rrows
        rows[row] += sign
        if rows[row] == 0:
            del rows[row]
    after = _joined(spec, lrows, rrows)
    diff = [(r, 1) for r, c in (after - before).items() for _ in range(c)]
    diff += [(r, -1) for r, c in (before - after).items() for _ in range(c)]
    return diff


def _join_bucket(spec: tuple[str, list[tuple[str, str, str]]], key: tuple,
                 changes: Iterable[tuple], state: Any) -> list[tuple[str, int]]:
    """``changes`` as (join key, side, row, sign) of one bucket's join keys; the state one
    JSON object of the bucket's join keys' rows, ``{join key: [left rows, right rows]}``,
    each side's rows a JSON object of row text to count (join version 3).  Per join key,
    what ``_join_group`` does, its outputs in the order of the join keys' texts; a left
    join's left rows with a null key (their own group, :data:`NULL_KEY`) pass padded
    without touching the state.  The bucket is read once and written once."""
    groups: dict[str, list[tuple]] = {}
    for jk, side, row, sign in changes:
        groups.setdefault(jk, []).append((side, row, sign))
    out: list[tuple[str, int]] = []
    keyed = any(jk != NULL_KEY for jk in groups)
    current: dict[str, list[dict[str, int]]] = {}
    if keyed:
        v = state.value()
        if v is not None:
            current = json.loads(v[0])
    for jk in sorted(groups):
        if jk == NULL_KEY:
            out += _null_keyed(spec, groups[jk])
            continue
        ls, rs = current.get(jk, ({}, {}))
        lrows, rrows = Counter(ls), Counter(rs)
        out += _join_changes(spec, lrows, rrows, groups[jk])
        if lrows or rrows:
            current[jk] = [dict(lrows), dict(rrows)]
        else:
            current.pop(jk, None)
    if keyed:
        _write_bucket(state, current)
    return out


def _write_bucket(state: Any, current: dict) -> None:
    """A bucketed operator's state written back whole (source 4, join 3): what makes a
    large bucket dear for few changes; removed when the bucket is empty."""
    if current:
        state.update((_dumps(current),))
    else:
        state.remove()
