"""The retracting operators of tables read as changelogs (``migrate.build.changelog``), run
without Spark on the inputs Spark would hand them, and the sink's consolidation of signed
rows into upserts and tombstones (``gates.sink.consolidate``).  The same operators run on
Spark in ``tests/integration/test_tables.py``, judged by an oracle."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pandas as pd
import pytest

from gates.sink import consolidate
from gates.source import DELETED_COLUMN, OFFSET_COLUMN
from migrate.build import changelog as C


class State:
    """One group's state, as ``changelog._State`` shows it to the group functions."""

    def __init__(self) -> None:
        self.held = None

    @property
    def exists(self) -> bool:
        return self.held is not None

    def value(self):
        return self.held

    def update(self, v) -> None:
        self.held = tuple(v)

    def remove(self) -> None:
        self.held = None


class ValueState:
    """transformWithState's value state (what ``handle.getValueState`` returns), counting
    the calls: each is a round trip to the JVM's state server."""

    def __init__(self) -> None:
        self.v = None
        self.calls: Counter = Counter()

    def exists(self) -> bool:
        self.calls["exists"] += 1
        return self.v is not None

    def get(self):
        self.calls["get"] += 1
        return self.v

    def update(self, v) -> None:
        self.calls["update"] += 1
        self.v = v

    def clear(self) -> None:
        self.calls["clear"] += 1
        self.v = None


def rows(out) -> list[tuple[dict, int]]:
    return [(json.loads(r), s) for r, s in out]


def norm(*changes) -> list[tuple]:
    """(offset, value or None for a tombstone) as the normalisation's (offset, deleted,
    row)."""
    return [(o, v is None, None if v is None else json.dumps(v)) for o, v in changes]


def signed(*pairs) -> list[tuple[str, int]]:
    """(value of a0_0, sign) as the aggregate's (row, sign)."""
    return [(json.dumps({"a0_0": v}), s) for v, s in pairs]


def test_normalise_retracts_the_old_row_and_deletes_on_a_tombstone():
    st = State()

    def batch(*changes):
        return rows(C._normalise_group(("k",), iter(norm(*changes)), st))

    assert batch((0, {"a": 1})) == [({"a": 1}, 1)]
    # out of order within the batch: the offset decides, the last change wins
    assert batch((2, {"a": 3}), (1, {"a": 2})) == [({"a": 1}, -1), ({"a": 3}, 1)]
    assert batch((3, {"a": 3})) == []  # the same value again: no change
    assert batch((4, None)) == [({"a": 3}, -1)] and not st.exists
    assert batch((5, None)) == []  # deleting a deleted key


def test_a_key_reads_its_state_once():
    vs = ValueState()
    st = C._State(vs)

    def batch(value):
        vs.calls.clear()
        out = rows(C._normalise_group(("k",), iter(norm((0, value))), st))
        return out, dict(vs.calls)

    assert batch({"a": 1}) == ([({"a": 1}, 1)], {"get": 1, "update": 1})
    assert batch({"a": 2}) == ([({"a": 1}, -1), ({"a": 2}, 1)], {"get": 1, "update": 1})
    assert batch({"a": 2}) == ([], {"get": 1})  # unchanged: read, nothing written
    assert batch(None) == ([({"a": 2}, -1)], {"get": 1, "clear": 1})
    spec = [("n", "count", ["*"])]
    vs.calls.clear()
    C._aggregate_group(spec, ('{"g":1}',), iter([("{}", 1)]), st)
    assert dict(vs.calls) == {"get": 1, "update": 1}


def test_an_output_frame_has_the_operators_columns_and_types():
    f = C._frame([('{"a":1}', -1), ('{"a":2}', 1)])
    assert list(f.columns) == [C.ROW, C.SIGN]
    assert f[C.ROW].tolist() == ['{"a":1}', '{"a":2}'] and f[C.SIGN].tolist() == [-1, 1]
    assert str(f[C.SIGN].dtype) == "int64"


def _agg_spec():
    return [("n", "count", ["*"]), ("nx", "count", ["a0_0"]), ("s", "sum", ["a0_0"]),
            ("m", "avg", ["a0_0"]), ("lo", "min", ["a0_0"]), ("hi", "max", ["a0_0"])]


def test_aggregate_retracts_min_and_max_and_deletes_an_emptied_group():
    st = State()
    spec = _agg_spec()

    def batch(*pairs):
        return rows(C._aggregate_group(spec, ('{"g":"x"}',), iter(signed(*pairs)), st))

    first = batch((5, 1), (1, 1), (None, 1))
    assert first == [({"g": "x", "n": 3, "nx": 2, "s": 6, "m": 3.0, "lo": 1, "hi": 5}, 1)]
    second = batch((1, -1))  # the minimum leaves: the next one is found
    assert second == [(first[0][0], -1),
                      ({"g": "x", "n": 2, "nx": 1, "s": 5, "m": 5.0, "lo": 5, "hi": 5}, 1)]
    last = batch((5, -1), (None, -1))
    assert last == [(second[1][0], -1)] and not st.exists


def test_aggregate_matches_a_recomputation_under_random_changes():
    rng = random.Random(3)
    st, spec = State(), _agg_spec()
    live: Counter = Counter()
    current = None
    for _ in range(200):
        pairs = []
        for _ in range(rng.randint(1, 5)):
            if live and rng.random() < 0.4:
                v = rng.choice(sorted(live, key=str))
                live[v] -= 1
                live += Counter()
                pairs.append((v, -1))
            else:
                v = rng.choice([None, *range(10)])
                live[v] += 1
                pairs.append((v, 1))
        for row, sign in rows(C._aggregate_group(spec, ('{"g":1}',), signed(*pairs), st)):
            current = row if sign > 0 else (None if current == row else current)
        vals = [v for v in live.elements() if v is not None]
        n = sum(live.values())
        want = None if n == 0 else {
            "g": 1, "n": n, "nx": len(vals), "s": sum(vals) if vals else None,
            "m": sum(vals) / len(vals) if vals else None,
            "lo": min(vals) if vals else None, "hi": max(vals) if vals else None}
        assert current == want


@pytest.mark.parametrize("how", ["inner", "left"])
def test_join_emits_the_difference_as_either_side_changes(how):
    st = State()
    out = [("id", "left", "id"), ("v", "left", "v"), ("w", "right", "w")]

    def batch(*changes):
        got = rows(C._join_group((how, out), ('{"k0":1}',),
                                 [(s, json.dumps(r), g) for s, r, g in changes], st))
        return sorted(got, key=lambda x: (x[1], json.dumps(x[0])))

    a, b = {"id": 1, "v": "a"}, {"id": 1, "v": "b"}
    pad = [({"id": 1, "v": "a", "w": None}, 1)] if how == "left" else []
    assert batch((0, a, 1)) == pad
    joined = batch((1, {"w": 7}, 1))
    assert joined == [(dict(id=1, v="a", w=None), -1)] * (how == "left") + \
        [({"id": 1, "v": "a", "w": 7}, 1)]
    # the left row changes: its joined row is replaced
    assert batch((0, a, -1), (0, b, 1)) == [({"id": 1, "v": "a", "w": 7}, -1),
                                            ({"id": 1, "v": "b", "w": 7}, 1)]
    # the right row leaves: inner retracts, left pads with nulls
    left_pad = [({"id": 1, "v": "b", "w": None}, 1)] if how == "left" else []
    assert batch((1, {"w": 7}, -1)) == [({"id": 1, "v": "b", "w": 7}, -1)] + left_pad


def test_a_null_join_key_pads_each_left_row_with_its_sign_and_keeps_no_state():
    # join version 2: a left join's left rows with a null key come to the operator under
    # the null key's group (the right side's never do)
    vs = ValueState()
    out = [("id", "left", "id"), ("w", "right", "w")]
    got = rows(C._join_group(("left", out), (C.NULL_KEY,),
                             [(0, '{"id":1}', 1), (0, '{"id":2}', -1)], C._State(vs)))
    assert got == [({"id": 1, "w": None}, 1), ({"id": 2, "w": None}, -1)]
    assert not vs.calls  # no state read or written


def test_consolidate_writes_one_record_per_key():
    keys = ["a", "a", "b", "c", "c", "d", "d"]
    vals = ["1", "2", "3", "4", "4", "5", "6"]
    signs = [-1, 1, -1, -1, 1, 1, -1]
    # a: updated; b: deleted; c: retracted and re-added unchanged; d: 5 in, 6 out
    k, v = consolidate(keys, vals, signs)
    assert list(zip(k, v)) == [("a", "2"), ("b", None), ("d", "5")]


def _sum_batch(st, spec, pairs):
    return rows(C._aggregate_group(spec, ('{"g":"x"}',), signed(*pairs), st))


def test_a_double_sum_under_retraction_is_exact():
    # a running float sum gives 0.0 here: 0.1 + 0.2 + 1e16 rounds the small values away
    st, spec = State(), [("s", "sum", ["a0_0"]), ("m", "avg", ["a0_0"])]
    _sum_batch(st, spec, [(0.1, 1), (0.2, 1), (1e16, 1)])
    out = _sum_batch(st, spec, [(1e16, -1)])
    assert out[-1] == ({"g": "x", "s": 0.1 + 0.2, "m": (0.1 + 0.2) / 2}, 1)
    assert json.loads(json.dumps(st.held)) == list(st.held)  # the state stays JSON


def test_a_double_sum_matches_fsum_under_random_changes():
    rng = random.Random(5)
    st, spec = State(), [("s", "sum", ["a0_0"])]
    live: Counter = Counter()
    pool = [rng.choice([1e-3, 1.0, 1e8, 1e16, 1e300]) * rng.uniform(-1, 1) for _ in range(40)]
    current = None
    for _ in range(300):
        if live and rng.random() < 0.45:
            v = rng.choice(sorted(live))
            live[v] -= 1
            live += Counter()
            signed = [(v, -1)]
        else:
            v = rng.choice(pool)
            live[v] += 1
            signed = [(v, 1)]
        for row, sign in _sum_batch(st, spec, signed):
            current = row if sign > 0 else (None if current == row else current)
        want = None if not live else {"g": "x", "s": math.fsum(live.elements())}
        assert current == want


def test_integer_sums_stay_ints_and_an_old_float_state_is_read():
    st, spec = State(), [("s", "sum", ["a0_0"])]
    assert _sum_batch(st, spec, [(2 ** 62, 1), (2 ** 62, 1), (1, 1)]) == \
        [({"g": "x", "s": 2 ** 63 + 1}, 1)]
    # a state written before sums were exact holds a float total: it is carried on
    st.held = (json.dumps({"rows": 2, "aggs": [[0.5, 2]]}),)
    out = _sum_batch(st, spec, [(0.25, 1)])
    assert out == [({"g": "x", "s": 0.5}, -1), ({"g": "x", "s": 0.75}, 1)]


def test_non_finite_values_enter_and_leave_a_sum():
    # Spark's JSON writes non-finite doubles as text
    st, spec = State(), [("s", "sum", ["a0_0"])]
    _sum_batch(st, spec, [(1.5, 1), ("Infinity", 1)])
    assert math.isinf(C._agg_value("sum", json.loads(st.held[0])["aggs"][0]))
    out = _sum_batch(st, spec, [("NaN", 1)])
    assert math.isnan(out[-1][0]["s"])
    out = _sum_batch(st, spec, [("NaN", -1), ("Infinity", -1)])
    assert out[-1] == ({"g": "x", "s": 1.5}, 1)


class Grouped:
    """What ``_stateful`` calls on a DataFrame, answering the API it picked and the
    processor."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns

    def groupBy(self, key):  # noqa: N802
        assert key == C.KEY
        return self

    def transformWithState(self, processor, *args):  # noqa: N802
        return "rows", processor

    def transformWithStateInPandas(self, processor, *args):  # noqa: N802
        return "pandas", processor


class Handle:
    def __init__(self) -> None:
        self.vs = ValueState()

    def getValueState(self, name, schema):  # noqa: N802
        return self.vs


@pytest.mark.parametrize("rows_api", [False, True])
def test_both_apis_hand_the_group_function_the_same_changes(rows_api):
    """The old versions' pandas frames and the new versions' Rows come with every column
    of the operator's input (the key too, in the input's order); both paths pick the same
    fields by position and output the same pairs, one state read and write per key."""
    from pyspark.sql import Row

    columns = [C.KEY, C.ROW, DELETED_COLUMN, OFFSET_COLUMN]
    api, proc = C._stateful(Grouped(columns), C._normalise_group,
                            (OFFSET_COLUMN, DELETED_COLUMN, C.ROW), "row string", "norm_x",
                            rows_api)
    assert api == ("rows" if rows_api else "pandas")
    handle = Handle()
    proc.init(handle)
    changes = [("k", '{"a":1}', False, 7), ("k", '{"a":2}', False, 9),
               ("k", None, True, 8)]
    if rows_api:
        data = iter([Row(*columns)(*c) for c in changes])
    else:
        half = [pd.DataFrame(changes[:1], columns=columns),
                pd.DataFrame(changes[1:], columns=columns)]
        data = iter(half)
    out = list(proc.handleInputRows(("k",), data, None))
    if rows_api:
        got = [(r[C.ROW], r[C.SIGN]) for r in out]
    else:
        (frame,) = out
        assert str(frame[C.SIGN].dtype) == "int64"
        got = list(zip(frame[C.ROW], frame[C.SIGN]))
    assert got == [('{"a":2}', 1)]  # offset 9 is the key's last change
    assert dict(handle.vs.calls) == {"get": 1, "update": 1}
    # unchanged: nothing output (the pandas path yields no empty frame)
    again = [("k", '{"a":2}', False, 10)]
    data = iter([Row(*columns)(*again[0])]) if rows_api else \
        iter([pd.DataFrame(again, columns=columns)])
    assert list(proc.handleInputRows(("k",), data, None)) == []
