"""Changelog state named after what it means (``compat.tws_state``), and the restart rule
over the names (``compat.checkpoint_check``): a checkpoint of Theseus' transformWithState
operators tells a changed group key, aggregate, join key or table key by the name of its
state variable.  What Spark does with a changed name is measured in
``tests/integration/test_checkpoint_tws.py``."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

from compat import tws_state as S
from compat.check import load_plan
from compat.checkpoint import read_checkpoint
from compat.checkpoint_check import checkpoint_report, compare, drift, predict
from tests.conftest import FIXTURES

LEGACY_CK = FIXTURES / "checkpoints" / "table_agg_tws"
TABLE_AGG = json.loads((LEGACY_CK / "plan.json").read_text())
JOIN = json.loads((FIXTURES / "upgrades" / "table_table_join_type_changed" / "new.json")
                  .read_text())


def _names(write_plan, doc) -> dict[str, str]:
    p = load_plan(write_plan(doc))
    return {n: S.state_name(p, n) for n in p.nodes if p.info[n].stateful}


def _agg(doc) -> dict:
    return next(n for n in doc["nodes"] if n["step"] == "aggregate")


def test_names_are_stable_across_releases(write_plan):
    # A running query restarts on the state named so: a name that changes between
    # releases for the same plan would restart every table query on empty state.
    assert _names(write_plan, TABLE_AGG) == {"users": "norm_7da0320306dc",
                                             "a": "agg_ac5e25ea2c5d"}


def test_a_changed_group_key_renames_only_the_aggregate_state(write_plan):
    base = _names(write_plan, TABLE_AGG)
    d = copy.deepcopy(TABLE_AGG)
    _agg(d)["group_by"][0]["expr"] = "upper(region)"
    got = _names(write_plan, d)
    assert got["a"] != base["a"] and got["users"] == base["users"]
    # the state key is the JSON object of the keys, names as written: a renamed key too
    d = copy.deepcopy(TABLE_AGG)
    _agg(d)["group_by"][0]["name"] = "area"
    d["nodes"][-1]["key_columns"] = ["area"]
    assert _names(write_plan, d)["a"] != base["a"]


def test_what_does_not_change_the_state_keeps_its_name(write_plan):
    base = _names(write_plan, TABLE_AGG)
    d = copy.deepcopy(TABLE_AGG)
    a = _agg(d)
    a["group_by"][0]["expr"] = "  REGION "  # canonical form: case and spaces
    a["aggregates"][0]["name"] = "rows"  # an output name only
    d["nodes"][0]["schema"][2]["type"] = "int"  # JSON of int and bigint is the same
    d["nodes"][-1]["topic"] = "elsewhere"
    assert _names(write_plan, d) == base


def test_aggregates_and_their_arguments_are_part_of_the_name(write_plan):
    base = _names(write_plan, TABLE_AGG)["a"]
    for change in ({"function": "avg"}, {"args": ["score + 1"]}):
        d = copy.deepcopy(TABLE_AGG)
        _agg(d)["aggregates"][1].update(change)
        assert _names(write_plan, d)["a"] != base, change
    d = copy.deepcopy(TABLE_AGG)
    _agg(d)["aggregates"].append({"name": "top", "function": "max", "args": ["score"]})
    assert _names(write_plan, d)["a"] != base


def test_table_key_and_join_keys(write_plan):
    d = copy.deepcopy(TABLE_AGG)
    d["nodes"][0]["key_columns"] = ["user_id", "region"]
    assert _names(write_plan, d)["users"] != _names(write_plan, TABLE_AGG)["users"]
    base = _names(write_plan, JOIN)
    assert set(base) == {"orders", "users", "j"} and base["j"].startswith("join_")
    # the join state is both sides' rows whatever the type: inner <-> left keeps it
    d = copy.deepcopy(JOIN)
    d["nodes"][2]["type"] = "inner"
    assert _names(write_plan, d) == base
    d = copy.deepcopy(JOIN)
    d["nodes"][2]["left_keys"] = ["lower(user_id)"]
    got = _names(write_plan, d)
    assert got["j"] != base["j"] and got["orders"] == base["orders"]


def test_describe_and_is_named(write_plan):
    p = load_plan(write_plan(TABLE_AGG))
    assert S.describe(p, "a") == "group by (region string); count(*), sum(score)"
    assert S.describe(p, "users") == "table key (user_id string)"
    assert S.is_named(S.state_name(p, "a")) and S.is_named("norm_7da0320306dc")
    assert not S.is_named(S.LEGACY) and not S.is_named("agg_xyz") and not S.is_named("$ttl")


def test_legacy_checkpoints_are_recognised(tmp_path):
    assert S.legacy_checkpoint(str(LEGACY_CK))
    assert not S.legacy_checkpoint(str(FIXTURES / "checkpoints" / "agg_dedup"))
    assert not S.legacy_checkpoint(str(tmp_path / "none"))
    assert not S.legacy_checkpoint(None)


# -- the restart rule over the names -------------------------------------------------------

def _named(ck, plan, order=("a", "users")):
    """``ck``'s operators as a checkpoint written for ``plan`` names them."""
    ck.operators = [replace(op, stores=tuple(replace(s, name=S.state_name(plan, nid))
                                             for s in op.stores))
                    for op, nid in zip(ck.operators, order)]
    return ck


def _ops(plan):
    ck = _named(read_checkpoint(LEGACY_CK), plan)
    ck.offsets = [{"theseus_empty": "users"}]  # the dry run's offsets name the source
    return ck


def _plans(write_plan):
    old = load_plan(write_plan(TABLE_AGG))
    d = copy.deepcopy(TABLE_AGG)
    _agg(d)["group_by"][0]["expr"] = "upper(region)"
    return old, load_plan(write_plan(d))


def test_a_renamed_state_is_predicted_wrong_state(write_plan):
    old, new = _plans(write_plan)
    ck = _named(read_checkpoint(LEGACY_CK), old)
    fs = compare(ck, _ops(new), new)
    assert [f.code for f in fs] == ["checkpoint-state-renamed"]
    (f,) = fs
    assert f.new_node == "a" and f.new_pointer == "/nodes/1"
    assert S.state_name(old, "a") in f.message and S.state_name(new, "a") in f.message
    assert "group by (upper(region) string)" in f.message
    p = predict(fs)
    assert (p.outcome, p.error_class) == ("wrong_state", None)
    # the same plan: the names agree and the checkpoint verifies them
    fs = compare(ck, _ops(old), old)
    assert fs == [] and predict(fs).outcome == "starts"
    rep = checkpoint_report(ck, old, _ops(old))
    assert rep.checkpoint["restart"]["outcome"] == "starts"
    assert not any("transformWithState" in f.message for f in rep.findings)


def test_a_renamed_state_beats_a_schema_change_of_another_store(write_plan):
    old, new = _plans(write_plan)
    ck = _named(read_checkpoint(LEGACY_CK), old)
    ops = _ops(new)
    norm = ops.operators[1]
    ops.operators[1] = replace(norm, stores=(replace(norm.stores[0], key_schema={
        "type": "struct", "fields": [{"name": "k", "type": "long", "nullable": True}]}),))
    fs = compare(ck, ops, new)
    assert sorted(f.code for f in fs) == ["checkpoint-key-schema-incompatible",
                                          "checkpoint-state-renamed"]
    assert predict(fs).outcome == "fails"  # Spark fails before it reads any state


def test_a_legacy_checkpoint_keeps_its_name_and_says_not_verified(write_plan):
    old, new = _plans(write_plan)
    ck = read_checkpoint(LEGACY_CK)  # state named "s", as before names meant something
    fs = compare(ck, _ops(new), new)
    assert fs == []  # a restart keeps the name "s": the schemas fit
    rep = checkpoint_report(ck, new, _ops(new))
    assert rep.checkpoint["restart"]["outcome"] == "starts"
    notes = [f.message for f in rep.findings if f.code == "checkpoint-not-verified"]
    assert any("before Theseus named changelog state" in n and "'s'" in n for n in notes)


def test_drift_names_a_state_the_recorded_plan_would_not_have_written(write_plan):
    old, new = _plans(write_plan)
    ck = _named(read_checkpoint(LEGACY_CK), new)  # made by the key-changed plan
    diffs = drift(ck, _ops(old))
    assert len(diffs) == 1 and diffs[0].startswith("operator 0 (transformWithStateInPandas")
    assert S.state_name(new, "a") in diffs[0] and S.state_name(old, "a") in diffs[0]
    assert drift(ck, _ops(new)) == []
    # a legacy checkpoint is not drift: a restart keeps its name
    assert drift(read_checkpoint(LEGACY_CK), _ops(old)) == []


def test_real_checkpoint_with_named_state(write_plan):
    """``fixtures/checkpoints/table_agg_tws_named``: the table aggregate's checkpoint as
    PySpark 4.3 wrote it with named state (made by test_checkpoint_tws.py with
    THESEUS_WRITE_FIXTURES=1): its column families are the names its plan gives."""
    ck_dir = FIXTURES / "checkpoints" / "table_agg_tws_named"
    plan = load_plan(str(ck_dir / "plan.json"))
    ck = read_checkpoint(ck_dir)
    assert [[s.name for s in op.stores] for op in ck.operators] == \
        [[S.state_name(plan, "a")], [S.state_name(plan, "users")]]
    assert not S.legacy_checkpoint(str(ck_dir))
    ops = _ops(plan)
    ops.offsets = [{"theseus_empty": "users"}]
    assert compare(ck, ops, plan) == []
    doc = json.loads((ck_dir / "plan.json").read_text())
    _agg(doc)["aggregates"][1]["args"] = ["score * 2"]  # in place for the plan check
    new = load_plan(write_plan(doc))
    fs = compare(ck, _ops(new), new)
    assert [f.code for f in fs] == ["checkpoint-state-renamed"]
    assert S.describe(new, "a") in fs[0].message and "2 * score" in S.describe(new, "a")
    assert predict(fs).outcome == "wrong_state"


def test_checkpoint_alone_says_what_the_names_verify(write_plan):
    old, _new = _plans(write_plan)
    named = checkpoint_report(read_checkpoint(FIXTURES / "checkpoints" / "table_agg_tws_named"),
                              old, _ops(old))
    legacy = checkpoint_report(read_checkpoint(LEGACY_CK), old, _ops(old))
    said = [[f.message for f in r.findings if f.code == "checkpoint-not-verified"]
            for r in (named, legacy)]
    assert any("verified by their state names" in n for n in said[0]), said[0]
    assert not any("verified by their state names" in n for n in said[1]), said[1]
