"""Join version 3: a table-table join keeps its state per bucket of join keys
(``state_buckets``).  Where the version and the field are accepted, what a change of the
layout is judged (by ``check`` and by ``check --checkpoint``), how the state is named and
signed, and that the bucketed operator outputs what version 2's does per join key."""

from __future__ import annotations

import copy
import json
import random
import zlib
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compat import tws_state as S
from compat.check import load_plan
from compat.checkpoint import read_checkpoint
from compat.checkpoint_check import compare, predict, stateful_nodes
from compat.fleet.signature import signatures
from compat.steps.join import state_buckets
from compat.steps.source import DEFAULT_BUCKETS
from migrate.build import changelog
from tests.conftest import FIXTURES
from tests.test_buckets_version import check, refused

CASES = FIXTURES / "upgrades"
JOIN = json.loads((CASES / "table_table_join_type_changed" / "old.json").read_text())
#: the join's index in JOIN's nodes
J = next(i for i, n in enumerate(JOIN["nodes"]) if n["step"] == "join")
LEGACY_CK = FIXTURES / "checkpoints" / "table_agg_tws"


def versioned(doc: dict, version: int, buckets=None, source: int = 3) -> dict:
    """``doc`` with its join at ``version`` (and ``state_buckets``), its tables at
    ``source`` (the row-based normalisation, as a row-based join wants)."""
    d = copy.deepcopy(doc)
    for n in d["nodes"]:
        if n["step"] == "join":
            n["version"] = version
            if buckets is not None:
                n["state_buckets"] = buckets
        elif n["step"] == "source" and n.get("role") == "table":
            n["version"] = source
    return d


# -- the plan format ---------------------------------------------------------------------

def test_version_3_keeps_its_state_bucketed_with_the_default_or_the_given_count(write_plan):
    plan = load_plan(write_plan(versioned(JOIN, 3)))
    assert state_buckets(plan.nodes["j"], plan) == DEFAULT_BUCKETS
    plan = load_plan(write_plan(versioned(JOIN, 3, 16)))
    assert state_buckets(plan.nodes["j"], plan) == 16
    # versions 1 and 2 keep one state value per join key
    for v in (1, 2):
        plan = load_plan(write_plan(versioned(JOIN, v)))
        assert state_buckets(plan.nodes["j"], plan) is None
    # and on source version 4 (the tables bucketed too), each its own count
    d = versioned(JOIN, 3, 8, source=4)
    plan = load_plan(write_plan(d))
    assert state_buckets(plan.nodes["j"], plan) == 8


@pytest.mark.parametrize("value,needle", [(0, "expected a number >= 1, found 0"),
                                          (-3, "found -3"),
                                          ("8", 'expected an integer, found "8"'),
                                          (True, "expected an integer, found true"),
                                          (2.5, "expected an integer"),
                                          (2**31, "found 2147483648")])
def test_a_bad_bucket_count_is_one_error_at_its_pointer(write_plan, value, needle):
    refused(write_plan, versioned(JOIN, 3, value), "node 'j'", f"/nodes/{J}/state_buckets",
            needle)


@pytest.mark.parametrize("version", [1, 2])
def test_state_buckets_is_refused_below_version_3(write_plan, version):
    refused(write_plan, versioned(JOIN, version, 16), f"/nodes/{J}/state_buckets",
            "'state_buckets' is a field of join version 3", f"found version {version}")


@pytest.mark.parametrize("case", ["join_stream_table_type_changed",
                                  "join_stream_stream_type_changed"])
def test_state_buckets_and_version_3_are_refused_on_a_join_with_a_stream(write_plan, case):
    d = json.loads((CASES / case / "old.json").read_text())
    i, j = next((i, n) for i, n in enumerate(d["nodes"]) if n["step"] == "join")
    j.update(version=3, state_buckets=8)
    refused(write_plan, d, f"/nodes/{i}/state_buckets", "found a join with a stream")
    # version 3 alone on a join with a stream means what version 1 means: refused as 2 is
    del j["state_buckets"]
    refused(write_plan, d, f"/nodes/{i}/version", "join version 3 differs from 1 only",
            "found version 3")


# -- the checker's rule ------------------------------------------------------------------

def _layout(report) -> list:
    return [f for f in report.findings if f.code == "join-state-layout-changed"]


@pytest.mark.parametrize("old,new,pointer,says", [
    ((2, None), (3, None), "version", "one value per bucket of join keys (64 buckets) "
                                      "instead of one value per join key"),
    ((3, 16), (2, None), "version", "one value per join key instead of one value per "
                                    "bucket of join keys (16 buckets)"),
    ((1, None), (3, 8), "version", "(8 buckets) instead of one value per join key"),
    ((3, None), (3, 16), "state_buckets", "(16 buckets) instead of one value per bucket of "
                                          "join keys (64 buckets)"),
    ((3, 16), (3, 17), "state_buckets", "(17 buckets) instead of"),
    ((3, 16), (3, None), "version", "(64 buckets) instead of"),
])
def test_a_changed_state_layout_is_a_migration(write_plan, old, new, pointer, says):
    report = check(write_plan, versioned(JOIN, *old), versioned(JOIN, *new))
    (f,) = _layout(report)
    assert (f.effect, f.new_node, f.new_pointer) == ("migrate", "j", f"/nodes/{J}/{pointer}")
    assert says in f.message, f.message
    assert "migrate" in f.hint and "rebuilds its state" in f.hint, f.hint
    assert report.verdict == "migrate"


def test_the_same_count_keeps_the_layout(write_plan):
    assert check(write_plan, versioned(JOIN, 3), versioned(JOIN, 3, DEFAULT_BUCKETS)
                 ).verdict == "identical"
    assert check(write_plan, versioned(JOIN, 3, 16), versioned(JOIN, 3, 16)
                 ).verdict == "identical"
    # the tables' own layout is theirs: the join's finding is not raised for it
    report = check(write_plan, versioned(JOIN, 3, 16), versioned(JOIN, 3, 16, source=4))
    assert not _layout(report)
    # an in-place change beside a version 3 join keeps its verdict and raises no layout
    case = CASES / "table_table_join_filter_added"
    expect = json.loads((case / "expect.json").read_text())
    old = versioned(json.loads((case / "old.json").read_text()), 3, 16)
    new = versioned(json.loads((case / "new.json").read_text()), 3, 16)
    report = check(write_plan, old, new)
    assert not _layout(report) and report.verdict == expect["verdict"] == "in_place"


def test_a_move_from_version_1_to_2_keeps_the_layout_and_stays_a_migration(write_plan):
    report = check(write_plan, versioned(JOIN, 1), versioned(JOIN, 2))
    assert not _layout(report)
    (f,) = [f for f in report.findings if f.code == "step-version-changed"]
    assert f.effect == "migrate" and report.verdict == "migrate"
    # a move 2 -> 3 is both: another operator version and another state layout
    report = check(write_plan, versioned(JOIN, 2), versioned(JOIN, 3))
    assert {f.code for f in report.findings if f.new_node == "j"} == {
        "step-version-changed", "join-state-layout-changed"}


def test_the_signature_carries_the_count(write_plan):
    def sig(d):
        return signatures(load_plan(write_plan(d)))["j"]

    v3 = sig(versioned(JOIN, 3))
    assert v3 == sig(versioned(JOIN, 3, DEFAULT_BUCKETS))
    assert v3 != sig(versioned(JOIN, 3, 16)) != sig(versioned(JOIN, 3, 17))
    assert v3 != sig(versioned(JOIN, 2))


# -- the state's name, and check --checkpoint ----------------------------------------------

def _names(write_plan, doc) -> dict[str, str]:
    p = load_plan(write_plan(doc))
    return {n: S.state_name(p, n) for n in p.nodes if p.info[n].stateful}


def test_versions_1_and_2_keep_their_state_names_and_3_names_its_layout(write_plan):
    v1 = _names(write_plan, versioned(JOIN, 1))
    v2 = _names(write_plan, versioned(JOIN, 2))
    assert v1 == v2 and v2["j"].startswith("join_")
    v3 = _names(write_plan, versioned(JOIN, 3))
    assert v3["j"] != v2["j"] and S.is_named(v3["j"])
    # the tables' names are theirs alone
    assert {k: v for k, v in v3.items() if k != "j"} == {k: v for k, v in v2.items()
                                                         if k != "j"}
    assert v3 == _names(write_plan, versioned(JOIN, 3, DEFAULT_BUCKETS))
    assert _names(write_plan, versioned(JOIN, 3, 16))["j"] not in (v2["j"], v3["j"])
    p = load_plan(write_plan(versioned(JOIN, 3, 16)))
    assert S.describe(p, "j") == "join keys (user_id = user_id) in 16 buckets"
    p = load_plan(write_plan(versioned(JOIN, 2)))
    assert S.describe(p, "j") == "join keys (user_id = user_id)"


def _named(plan):
    """A checkpoint as ``plan`` writes it: one operator per stateful step (Spark's order),
    each state store under the name ``plan`` gives that step's state."""
    ck = read_checkpoint(LEGACY_CK)
    (op, *_rest) = ck.operators
    ck.operators = [replace(op, id=i, stores=tuple(replace(s, name=S.state_name(plan, nid))
                                                   for s in op.stores))
                    for i, nid in enumerate(stateful_nodes(plan))]
    ck.offsets = [{"theseus_empty": "users"}]
    return ck


@pytest.mark.parametrize("old,new", [((2, None), (3, None)), ((3, None), (2, None)),
                                     ((3, 64), (3, 8))])
def test_check_checkpoint_never_says_the_layout_change_restarts_in_place(write_plan, old,
                                                                          new):
    """Both layouts key their state by text and store text, so Spark's schema check would
    let a restart read one as the other: the state's name tells them apart."""
    def plan(version):
        d = versioned(JOIN, *version)
        d["config"]["state_partitions"] = read_checkpoint(LEGACY_CK).shuffle_partitions
        return load_plan(write_plan(d))

    o, n = plan(old), plan(new)
    assert stateful_nodes(n)[0] == "j"
    fs = compare(_named(o), _named(n), n)
    assert [f.code for f in fs] == ["checkpoint-state-renamed"]
    assert fs[0].new_node == "j"
    assert predict(fs).outcome == "wrong_state"
    same = compare(_named(o), _named(o), o)
    assert same == [] and predict(same).outcome == "starts"


# -- the builder ---------------------------------------------------------------------------

class _State:
    def __init__(self) -> None:
        self.v: tuple | None = None
        self.reads = 0
        self.writes = 0

    def value(self):
        self.reads += 1
        return self.v

    def update(self, v):
        self.v = tuple(v)
        self.writes += 1

    def remove(self):
        self.v = None
        self.writes += 1


class _Untouchable:
    """A state no call may reach."""

    def value(self):
        raise AssertionError("read")

    def update(self, v):
        raise AssertionError("written")

    def remove(self):
        raise AssertionError("removed")


OUT = [("lid", "left", "lid"), ("jk", "left", "jk"), ("v", "left", "v"),
       ("rid", "right", "rid"), ("w", "right", "w")]
JOIN_KEYS = ["a", "b", "c", "d", "e", None]


def _jk(value) -> str:
    """A join key's JSON as the builder writes it (``to_json`` of ``struct(k0)``)."""
    return changelog.NULL_KEY if value is None else changelog._dumps({"k0": value})


def _bucket(jk: str, buckets: int) -> str:
    return changelog.NULL_KEY if jk == changelog.NULL_KEY else \
        str(zlib.crc32(jk.encode()) % buckets)


# an operation on a table: (left or right, table key, deleted, join key, value)
_op = st.tuples(st.integers(0, 1), st.integers(0, 5), st.booleans(),
                st.sampled_from(JOIN_KEYS), st.integers(0, 2))


@settings(max_examples=300, deadline=None)
@given(how=st.sampled_from(["inner", "left"]), buckets=st.integers(1, 3),
       batches=st.lists(st.lists(_op, max_size=12), min_size=1, max_size=5),
       seed=st.integers(0, 1000))
def test_a_bucket_outputs_what_version_2_outputs_per_join_key(how, buckets, batches, seed):
    """Over batches of two tables' changes (upserts that move rows between join keys,
    deletes, null join keys), every bucket outputs per join key exactly what version 2's
    operator outputs for it (the join keys in order, version 2's order within each), the
    batch as a multiset is version 2's, and the bucket's state holds exactly the per-key
    states' rows; a left join's null-keyed left rows pass padded, no state touched."""
    rng = random.Random(seed)
    spec = (how, OUT)
    tables: list[dict[int, dict]] = [{}, {}]
    per_key: dict[str, _State] = {}
    per_bucket: dict[str, _State] = {}
    for batch in batches:
        # what the normalisation emits: the old row's retraction, then the new row
        changes = []
        for side, tk, deleted, jk, val in batch:
            old = tables[side].get(tk)
            new = None if deleted else (
                {"lid": tk, "jk": jk, "v": val} if side == 0 else
                {"rid": tk, "jk": jk, "w": val})
            if old == new:
                continue
            for row, sign in ((old, -1), (new, 1)):
                if row is None:
                    continue
                key = _jk(row["jk"])
                if key == changelog.NULL_KEY and (side == 1 or how == "inner"):
                    continue  # filtered before the operator: matches nothing
                changes.append((key, side, changelog._dumps(row), sign))
            if new is None:
                del tables[side][tk]
            else:
                tables[side][tk] = new
        rng.shuffle(changes)  # Spark hands a group's rows in no promised order
        # version 2: one group per join key
        want: Counter = Counter()
        by_key: dict[str, list] = {}
        for jk, side, row, sign in changes:
            by_key.setdefault(jk, []).append((side, row, sign))
        v2 = {}
        for jk, rows in by_key.items():
            state = _Untouchable() if jk == changelog.NULL_KEY else \
                per_key.setdefault(jk, _State())
            v2[jk] = changelog._join_group(spec, (jk,), rows, state)
            want.update(v2[jk])
        # version 3: one group per bucket
        got: Counter = Counter()
        groups: dict[str, list] = {}
        for c in changes:
            groups.setdefault(_bucket(c[0], buckets), []).append(c)
        for b, rows in groups.items():
            if b == changelog.NULL_KEY:
                out = changelog._join_bucket(spec, (b,), rows, _Untouchable())
            else:
                state = per_bucket.setdefault(b, _State())
                reads, writes = state.reads, state.writes
                out = changelog._join_bucket(spec, (b,), rows, state)
                assert (state.reads - reads, state.writes - writes) == (1, 1)
            order = sorted({jk for jk, *_x in rows})
            assert out == [r for jk in order for r in v2[jk]]
            got.update(out)
        assert got == want
        # the state: per join key, the same rows of each side as version 2 keeps
        v2_state = {jk: [json.loads(s.v[0]), json.loads(s.v[1])]
                    for jk, s in per_key.items() if s.v is not None}
        v3_state: dict = {}
        for s in per_bucket.values():
            if s.v is not None:
                part = json.loads(s.v[0])
                assert part  # an emptied bucket leaves no state behind
                v3_state.update(part)
        assert v3_state == v2_state
        # and the state is the tables' rows, per join key (the model's own check)
        model: dict[str, list[dict]] = {}
        for side in (0, 1):
            for row in tables[side].values():
                jk = _jk(row["jk"])
                if jk != changelog.NULL_KEY:
                    model.setdefault(jk, [{}, {}])[side][changelog._dumps(row)] = 1
        assert v3_state == model


def test_a_bucket_is_written_once_and_removed_when_empty():
    spec = ("inner", OUT)
    s = _State()
    rows = []
    for i in range(20):
        jk = _jk("abcd"[i % 4])
        rows.append((jk, 0, changelog._dumps({"lid": i, "jk": "abcd"[i % 4], "v": 0}), 1))
    rows += [(_jk(k), 1, changelog._dumps({"rid": k, "jk": k, "w": 1}), 1) for k in "ab"]
    out = changelog._join_bucket(spec, ("0",), rows, s)
    assert len(out) == 10 and all(sign == 1 for _r, sign in out)
    assert (s.reads, s.writes) == (1, 1)
    assert sorted(json.loads(s.v[0])) == sorted(_jk(k) for k in "abcd")
    # the join keys' outputs in their texts' order
    assert [json.loads(r)["jk"] for r, _s in out] == ["a"] * 5 + ["b"] * 5
    gone = [(jk, side, row, -sign) for jk, side, row, sign in rows]
    out = changelog._join_bucket(spec, ("0",), gone, s)
    assert [sign for _r, sign in out] == [-1] * 10
    assert s.v is None and s.writes == 2
    # nothing handed in: nothing read or written
    assert changelog._join_bucket(spec, ("0",), [], s) == [] and (s.reads, s.writes) == (2, 2)


def test_null_keyed_left_rows_pass_padded_without_state():
    spec = ("left", OUT)
    row = changelog._dumps({"lid": 1, "jk": None, "v": 2})
    changes = [(changelog.NULL_KEY, 0, row, 1), (changelog.NULL_KEY, 0, row, -1)]
    out = changelog._join_bucket(spec, (changelog.NULL_KEY,), changes, _Untouchable())
    padded = changelog._dumps({"lid": 1, "jk": None, "v": 2, "rid": None, "w": None})
    assert out == [(padded, 1), (padded, -1)]
    assert out == changelog._join_group(spec, (changelog.NULL_KEY,),
                                        [c[1:] for c in changes], _Untouchable())


class _Recorder:
    """Stands in for ``pyspark.sql.functions`` and columns: records the functions called."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def __getattr__(self, name):
        def call(*a, **k):
            self.calls.append(name)
            return _Recorder(self.calls)
        return call

    def __or__(self, other):
        return self

    def __invert__(self):
        return self


class _Df:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def where(self, cond):
        self.calls.append("where")
        return self

    def select(self, *cols):
        self.calls.append(("select", len(cols)))
        return self

    def unionByName(self, other):  # noqa: N802
        return self


@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("rows,buckets", [(False, None), (True, None), (True, 16)])
def test_the_builder_buckets_only_version_3(monkeypatch, how, rows, buckets):
    calls: list = []
    seen: dict = {}
    monkeypatch.setattr(changelog, "unpack", lambda b, df, c, n: df)

    def spy(df, core, fields, state_schema, state_name, rows):
        seen.update(core=core, fields=fields, schema=state_schema, rows=rows)
        return df

    monkeypatch.setattr(changelog, "_stateful", spy)

    class B:
        F = _Recorder(calls)

    left, right = _Df(calls), _Df(calls)
    changelog.join(B(), left, right, ("user_id",), ("user_id",), how,
                   [("user_id", "left", "user_id")], ("user_id",), ("user_id",),
                   (("user_id", "string"),), ("user_id",), "join_x", rows, buckets=buckets)
    bucketed = buckets is not None
    assert ("xxhash64" in calls and "pmod" in calls) == bucketed
    assert seen["schema"] == ("keys string" if bucketed else "l string, r string")
    assert seen["fields"] == ((changelog.JOIN_KEY, changelog.SIDE, changelog.ROW,
                               changelog.SIGN) if bucketed else
                              (changelog.SIDE, changelog.ROW, changelog.SIGN))
    assert seen["rows"] == rows
    # each side's select carries the join key beside the bucket in version 3
    assert [c for c in calls if isinstance(c, tuple)][:2] == \
        [("select", 5 if bucketed else 4)] * 2
    # the core: version 3's buckets, else version 2's per join key
    probe = [(changelog._dumps({"k0": "u"}), 0, changelog._dumps({"user_id": "u"}), 1)]
    s = _State()
    if bucketed:
        assert seen["core"](("3",), probe, s) == changelog._join_bucket(
            (how, [("user_id", "left", "user_id")]), ("3",), probe, _State())
        assert json.loads(s.v[0]) == {probe[0][0]: [{probe[0][2]: 1}, {}]}
    else:
        seen["core"]((probe[0][0],), [p[1:] for p in probe], s)
        assert json.loads(s.v[0]) == {probe[0][2]: 1}
    # a left join on the row-based operators pads its null-keyed rows in the operator (a
    # left row's key routed to NULL_KEY by `when`), else filters them on both sides
    pad = how == "left" and rows
    assert calls.count("where") == (1 if pad else 2) + (how == "left" and not rows)
