"""Source version 4: a table read as a changelog keeps its normalisation's state per bucket
of table keys (``state_buckets``).  Where the version and the field are accepted, what a
change of the layout is judged (by ``check`` and by ``check --checkpoint``), how the state
is named, and that the bucketed normalisation outputs what version 3's does."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import replace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from compat import tws_state as S
from compat.check import check_plans, load_plan
from compat.checkpoint import read_checkpoint
from compat.checkpoint_check import compare, predict
from compat.steps.source import DEFAULT_BUCKETS, state_buckets
from migrate.build import changelog
from migrate.cli import main
from tests.conftest import FIXTURES

AGG = json.loads((FIXTURES / "upgrades" / "table_aggregate_function_added" / "old.json")
                 .read_text())
JOIN = json.loads((FIXTURES / "upgrades" / "table_table_join_type_changed" / "old.json")
                  .read_text())
LEGACY_CK = FIXTURES / "checkpoints" / "table_agg_tws"
TABLE_AGG = json.loads((LEGACY_CK / "plan.json").read_text())
#: the changelog operators' row-based versions, as source 3 needs them above it
ROWS = {"aggregate": 2, "join": 2}


def versioned(doc: dict, version: int, buckets: int | None = None, **more) -> dict:
    """``doc`` with its table sources at ``version`` (and ``state_buckets``)."""
    d = copy.deepcopy(doc)
    for n in d["nodes"]:
        if n["step"] == "source" and n.get("role") == "table":
            n["version"] = version
            if buckets is not None:
                n["state_buckets"] = buckets
            n.update(more)
        elif n["step"] in ROWS and version >= 3:
            n["version"] = ROWS[n["step"]]
    return d


def refused(write_plan, d: dict, *needles: str) -> None:
    result = CliRunner().invoke(main, ["check", write_plan(d), write_plan(d)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    for n in needles:
        assert n in result.output, (n, result.output)


def check(write_plan, old: dict, new: dict):
    return check_plans(load_plan(write_plan(old)), load_plan(write_plan(new)))


# -- the plan format ---------------------------------------------------------------------

def test_version_4_reads_its_tables_bucketed_with_the_default_or_the_given_count(write_plan):
    plan = load_plan(write_plan(versioned(JOIN, 4)))
    tables = [n for n in plan.nodes.values() if n.step == "source"]
    assert tables and {state_buckets(n) for n in tables} == {DEFAULT_BUCKETS}
    plan = load_plan(write_plan(versioned(JOIN, 4, 16)))
    assert {state_buckets(n) for n in plan.nodes.values() if n.step == "source"} == {16}
    # versions 2 and 3 keep one state value per key
    for v in (2, 3):
        plan = load_plan(write_plan(versioned(JOIN, v)))
        assert {state_buckets(n) for n in plan.nodes.values() if n.step == "source"} == {None}


@pytest.mark.parametrize("value,needle", [(0, "expected a number >= 1, found 0"),
                                          (-3, "found -3"),
                                          ("8", 'expected an integer, found "8"'),
                                          (True, "expected an integer, found true"),
                                          (2.5, "expected an integer"),
                                          (2**31, "found 2147483648")])
def test_a_bad_bucket_count_is_one_error_at_its_pointer(write_plan, value, needle):
    d = versioned(AGG, 4, value)
    refused(write_plan, d, "node 'users'", "/nodes/0/state_buckets", needle)


@pytest.mark.parametrize("version", [2, 3])
def test_state_buckets_is_refused_below_version_4(write_plan, version):
    refused(write_plan, versioned(AGG, version, 16), "/nodes/0/state_buckets",
            "'state_buckets' is a field of source version 4", f"found version {version}")


def test_state_buckets_is_refused_where_no_changelog_is_normalised(write_plan):
    refused(write_plan, versioned(AGG, 4, 16, read="snapshot"), "/nodes/0/state_buckets",
            "found a table read as a snapshot")
    d = json.loads((FIXTURES / "upgrades" / "table_source_version_bump_snapshot" / "old.json")
                   .read_text())
    i, stream = next((i, n) for i, n in enumerate(d["nodes"]) if n["role"] == "stream")
    stream.update(version=4, state_buckets=8)
    refused(write_plan, d, f"/nodes/{i}/state_buckets", "found a stream")
    # version 4 alone on a stream means what version 2 means: refused as 3 is
    del stream["state_buckets"]
    refused(write_plan, d, f"/nodes/{i}/version", "found version 4 on a stream")


# -- the checker's rule ------------------------------------------------------------------

def _layout(report) -> list:
    return [f for f in report.findings if f.code == "source-state-layout-changed"]


@pytest.mark.parametrize("old,new,pointer,says", [
    ((3, None), (4, None), "version", "one value per bucket of table keys (64 buckets) "
                                      "instead of one value per table key"),
    ((4, 16), (3, None), "version", "one value per table key instead of one value per "
                                    "bucket of table keys (16 buckets)"),
    ((2, None), (4, 8), "version", "(8 buckets) instead of one value per table key"),
    ((4, None), (4, 16), "state_buckets", "(16 buckets) instead of one value per bucket of "
                                          "table keys (64 buckets)"),
    ((4, 16), (4, 17), "state_buckets", "(17 buckets) instead of"),
    ((4, 16), (4, None), "version", "(64 buckets) instead of"),
])
def test_a_changed_state_layout_is_a_migration(write_plan, old, new, pointer, says):
    report = check(write_plan, versioned(AGG, *old), versioned(AGG, *new))
    (f,) = _layout(report)
    assert (f.effect, f.new_node, f.new_pointer) == ("migrate", "users", f"/nodes/0/{pointer}")
    assert f.old_pointer == ("/nodes/0/state_buckets" if old[1] and old[0] == new[0]
                             else "/nodes/0/version")
    assert says in f.message, f.message
    assert report.verdict == "migrate"


def test_both_tables_of_a_join_are_judged(write_plan):
    report = check(write_plan, versioned(JOIN, 4, 32), versioned(JOIN, 4, 64))
    assert {f.new_node for f in _layout(report)} == {"orders", "users"}
    assert report.verdict == "migrate"


def test_the_default_count_written_out_is_the_same_plan(write_plan):
    assert check(write_plan, versioned(AGG, 4), versioned(AGG, 4, DEFAULT_BUCKETS)
                 ).verdict == "identical"
    assert check(write_plan, versioned(AGG, 4, 16), versioned(AGG, 4, 16)
                 ).verdict == "identical"
    # a move between versions 2 and 3 keeps the layout: its own finding only
    assert not _layout(check(write_plan, versioned(AGG, 2), versioned(AGG, 3)))


# -- the state's name, and check --checkpoint ----------------------------------------------

def _names(write_plan, doc) -> dict[str, str]:
    p = load_plan(write_plan(doc))
    return {n: S.state_name(p, n) for n in p.nodes if p.info[n].stateful}


def test_versions_2_and_3_keep_their_state_names_and_4_names_its_layout(write_plan):
    # the names a running version 2 or 3 query restarts on (tests/test_tws_state.py's)
    frozen = "norm_7da0320306dc"
    assert _names(write_plan, TABLE_AGG)["users"] == frozen
    assert _names(write_plan, versioned(TABLE_AGG, 3))["users"] == frozen
    v4 = _names(write_plan, versioned(TABLE_AGG, 4))["users"]
    assert v4 != frozen and S.is_named(v4)
    assert v4 == _names(write_plan, versioned(TABLE_AGG, 4, DEFAULT_BUCKETS))["users"]
    # frozen too: a version 4 query restarts on the state this name holds
    assert v4 == "norm_1789f7c49f05"
    assert _names(write_plan, versioned(TABLE_AGG, 4, 16))["users"] not in (v4, frozen)
    p = load_plan(write_plan(versioned(TABLE_AGG, 4, 16)))
    assert S.describe(p, "users") == "table key (user_id string) in 16 buckets"


def _named(ck, plan):
    """``ck``'s operators as a checkpoint written for ``plan`` names them."""
    ck.operators = [replace(op, stores=tuple(replace(s, name=S.state_name(plan, nid))
                                             for s in op.stores))
                    for op, nid in zip(ck.operators, ("a", "users"))]
    ck.offsets = [{"theseus_empty": "users"}]
    return ck


@pytest.mark.parametrize("old,new", [((3, None), (4, None)), ((4, None), (3, None)),
                                     ((4, 64), (4, 8))])
def test_check_checkpoint_never_says_the_layout_change_restarts_in_place(write_plan, old,
                                                                          new):
    """Both layouts key their state by text and store text, so Spark's schema check would
    let a restart read one as the other: the state's name tells them apart."""
    o = load_plan(write_plan(versioned(TABLE_AGG, *old)))
    n = load_plan(write_plan(versioned(TABLE_AGG, *new)))
    ck = _named(read_checkpoint(LEGACY_CK), o)
    fs = compare(ck, _named(read_checkpoint(LEGACY_CK), n), n)
    assert [f.code for f in fs] == ["checkpoint-state-renamed"]
    assert fs[0].new_node == "users"
    assert predict(fs).outcome == "wrong_state"
    # the same plan on its own checkpoint restarts
    same = compare(ck, _named(read_checkpoint(LEGACY_CK), o), o)
    assert same == [] and predict(same).outcome == "starts"


# -- the builder ---------------------------------------------------------------------------

class _State:
    def __init__(self) -> None:
        self.v: tuple | None = None
        self.writes = 0

    def value(self):
        return self.v

    def update(self, v):
        self.v = tuple(v)
        self.writes += 1

    def remove(self):
        self.v = None
        self.writes += 1


_change = st.tuples(st.integers(0, 5), st.booleans(), st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.lists(_change, max_size=10), min_size=1, max_size=5),
       seed=st.integers(0, 1000))
def test_a_bucket_outputs_what_version_3_outputs_per_key(batches, seed):
    """Per table key, in every batch, the bucketed normalisation's output is version 3's
    (the old row's retraction, then the new row), the keys in the order of their last
    change; the bucket's state holds exactly the keys' current rows."""
    rng = random.Random(seed)
    per_key: dict[str, _State] = {}
    bucket = _State()
    offset = 0
    for batch in batches:
        changes = []
        for k, deleted, v in batch:
            offset += 1
            row = None if deleted else json.dumps({"k": k, "v": v})
            changes.append((f'{{"k":{k}}}', offset, deleted, row))
        shuffled = changes[:]
        rng.shuffle(shuffled)  # Spark hands a group's rows in no promised order
        want = []
        last = {tk: off for tk, off, _d, _r in changes}
        for tk in sorted(last, key=last.get):
            mine = [(off, d, r) for t, off, d, r in changes if t == tk]
            want += changelog._normalise_group((tk,), mine, per_key.setdefault(tk, _State()))
        assert changelog._normalise_bucket(("3",), shuffled, bucket) == want
        current = {tk: s.v[0] for tk, s in per_key.items() if s.v is not None}
        assert (json.loads(bucket.v[0]) if bucket.v else {}) == current


def test_a_bucket_is_read_and_written_once_per_batch_and_only_if_it_changed():
    s = _State()
    rows = [(f'{{"k":{i}}}', i, False, f'{{"k":{i},"v":1}}') for i in range(50)]
    out = changelog._normalise_bucket(("0",), rows, s)
    assert len(out) == 50 and all(sign == 1 for _r, sign in out) and s.writes == 1
    assert changelog._normalise_bucket(("0",), rows, s) == [] and s.writes == 1  # no change
    gone = [(tk, 100 + i, True, None) for i, (tk, *_x) in enumerate(rows)]
    out = changelog._normalise_bucket(("0",), gone, s)
    assert [sign for _r, sign in out] == [-1] * 50
    assert s.v is None and s.writes == 2  # an emptied bucket leaves no state behind


class _Recorder:
    """Stands in for ``pyspark.sql.functions`` and columns: records the functions called."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def __getattr__(self, name):
        def call(*a, **k):
            self.calls.append(name)
            return _Recorder(self.calls)
        return call


class _Df:
    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.columns: list[str] = []

    def select(self, *cols):
        self.calls.append("select")
        df = _Df(self.calls)
        df.columns = [changelog.KEY, changelog.TABLE_KEY, changelog.ROW, "_theseus_deleted",
                      "_theseus_offset"]
        return df

    def groupBy(self, key):  # noqa: N802
        return self

    def transformWithState(self, proc, schema, mode, time):  # noqa: N802
        self.calls.append(("rows", type(proc).__name__))
        return self

    def transformWithStateInPandas(self, *a):  # noqa: N802
        self.calls.append(("pandas",))
        return self


@pytest.mark.parametrize("rows,buckets,api,bucketed", [
    (False, None, ("pandas",), False), (True, None, ("rows", "RowProcessor"), False),
    (True, 16, ("rows", "RowProcessor"), True)])
def test_the_builder_buckets_only_version_4(monkeypatch, rows, buckets, api, bucketed):
    calls: list = []
    monkeypatch.setattr(changelog, "unpack", lambda b, df, c, n: df)
    seen = {}
    real = changelog._stateful

    def spy(df, core, fields, state_schema, state_name, rows):
        seen.update(core=core, fields=fields, schema=state_schema)
        return real(df, core, fields, state_schema, state_name, rows)

    monkeypatch.setattr(changelog, "_stateful", spy)

    class B:
        F = _Recorder(calls)

    df = _Df(calls)
    df.columns = ["user_id", "_theseus_deleted", "_theseus_offset"]
    changelog.normalise(B(), df, ("user_id",), ("user_id",), (("user_id", "string"),),
                        "norm_x", rows, buckets=buckets)
    assert api in calls
    assert ("xxhash64" in calls and "pmod" in calls) == bucketed
    assert (seen["core"] is changelog._normalise_bucket) == bucketed
    assert seen["schema"] == ("rows string" if bucketed else "row string")
