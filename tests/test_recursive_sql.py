"""A recursive step's batch loop as one Spark SQL ``WITH RECURSIVE`` query
(``migrate.build.recursive_sql``): which bodies it takes, and the query's text.  Spark runs
these queries in tests/integration/test_recursion.py, whose notes say which path ran."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from compat.infer import InferContext, analyze
from compat.serde import from_doc
from compat.steps.recursive import body_infos
from migrate.build.recursive_sql import (
    LOOP,
    LVL,
    Query,
    loop_chain,
    side_inputs,
    why_not,
    with_recursive,
)
from tests.recursion_util import reach_through_allowed

ROOT = Path(__file__).resolve().parents[1]
DESC = json.loads((ROOT / "fixtures/qtt/recursive_descendants/plan.json").read_text())
CYCLE = json.loads((ROOT / "fixtures/qtt/recursive_closure_cycle/plan.json").read_text())


def loaded(doc: dict):
    plan = from_doc(copy.deepcopy(doc), "plan.json")
    analyze(plan)
    rec = next(n for n in plan.nodes.values() if n.step == "recursive")
    infos = body_infos(rec, [plan.info[i] for i in rec.inputs],
                       InferContext(plan.file, {n.id: n for n in rec.body}, plan.pointers,
                                    "append"))
    return rec, infos


def query(doc: dict, known: tuple[str, ...] = ("k_old",), start: int = 0, stop: int = 8
          ) -> str:
    rec, infos = loaded(doc)
    row = [(n, t) for n, (_, t) in zip(infos[rec.body_input].names,
                                       infos[rec.body_input].columns)]
    sides = {s: f"v_{s}" for s in side_inputs(rec)}
    return with_recursive(rec, infos, row, Query("v_anchor", sides, known, start, stop))


def body(doc: dict) -> dict:
    return next(n for n in doc["nodes"] if n["step"] == "recursive")


def test_the_fixtures_bodies_run_as_with_recursive_reading_their_edges_as_views():
    for doc, side in ((DESC, "edges"), (CYCLE, "links")):
        rec, infos = loaded(doc)
        assert why_not(rec, infos) is None
        assert side_inputs(rec) == [side]
        assert f"FROM `v_{side}`" in query(doc)


def test_set_semantics_makes_each_level_distinct_and_removes_every_known_view():
    text = query(CYCLE, known=("k_old", "k_chunk"))
    assert "UNION ALL" in text and " UNION " not in text.replace("UNION ALL", "")
    # DISTINCT, not GROUP BY: Spark refuses an aggregate over the recursive reference
    assert "DISTINCT c.`__theseus_row`, c.`__theseus_lvl`" in text and "GROUP BY" not in text
    for i, view in enumerate(("k_old", "k_chunk")):
        assert (f"LEFT ANTI JOIN `{view}` AS k{i} ON c.`__theseus_row` = "
                f"k{i}.`__theseus_row`") in text
    assert "/*+ MERGE(k0, k1) */ DISTINCT" in text


def test_bag_semantics_keeps_every_derivation():
    doc = copy.deepcopy(DESC)
    body(doc)["union"] = "bag"
    text = query(doc)
    assert "DISTINCT" not in text and "ANTI JOIN" not in text and "MERGE" not in text


def test_levels_run_from_the_anchor_to_stop_and_spark_s_bound_only_guards():
    text = query(DESC, start=8, stop=24)
    # the loop's rows one level further, only below stop: the recursion ends there itself
    assert (f"SELECT `anc`, `node`, `{LVL}` + 1 AS `{LVL}` FROM `{LOOP}` "
            f"WHERE `{LVL}` < 24") in text
    assert re.search(r"MAX RECURSION LEVEL (\d+)", text).group(1) == str(24 - 8 + 2)
    assert text.startswith(f"WITH RECURSIVE `{LOOP}`(`anc`, `node`, `{LVL}`)")
    assert "FROM `v_anchor` UNION ALL" in text


def test_the_body_output_is_cast_to_the_loop_s_columns_and_keeps_the_level():
    doc = copy.deepcopy(DESC)
    doc["nodes"][0]["schema"] = [{"name": "child", "type": "long"},
                                 {"name": "parent", "type": "long"}]
    text = query(doc)
    assert "CAST(b.`anc` AS bigint) AS `anc`" in text, text
    assert "CAST(b.`node` AS bigint) AS `node`" in text
    assert f"`r`.`{LVL}` FROM" in text  # the join carries the loop side's level


def test_a_body_of_union_explode_and_semi_join_runs_its_edges_once_as_a_view():
    """Only the steps that read the loop are SQL: the union of two kinds of edges and the
    semi join with the allowed nodes read further inputs only (a view per batch)."""
    doc = reach_through_allowed()
    rec, infos = loaded(doc)
    assert why_not(rec, infos) is None
    assert loop_chain(rec) == ["j", "further"]
    assert side_inputs(rec) == ["open"]
    text = query(doc)
    assert "FROM `v_open`" in text and "explode" not in text


@pytest.mark.parametrize("change, reason", [
    # the loop read twice: semi-naive evaluation would miss derivations
    (lambda r: r.update(body=[*r["body"], {"id": "both", "step": "union", "version": 1,
                                           "inputs": ["up", "r"]}], body_output="both"),
     "not linear"),
    # a union with a branch that does not read the loop: its rows would have no level
    (lambda r: r.update(body=[
        {"id": "up", "step": "project", "version": 1, "inputs": ["r"],
         "columns": [{"name": "anc", "expr": "anc"}, {"name": "node", "expr": "node"}]},
        {"id": "plus", "step": "union", "version": 1, "inputs": ["up", "edges_pairs"]},
        {"id": "edges_pairs", "step": "project", "version": 1, "inputs": ["edges"],
         "columns": [{"name": "anc", "expr": "parent"}, {"name": "node", "expr": "child"}]}],
        body_output="plus"),
     "(union) reads the loop and has no SQL form"),
    # Spark refuses a recursive reference on the right of a left-semi join
    (lambda r: r.update(body=[
        {"id": "j", "step": "join", "version": 1, "inputs": ["edges_pairs", "r"],
         "type": "left_semi", "left_keys": ["node"], "right_keys": ["anc"]},
        {"id": "edges_pairs", "step": "project", "version": 1, "inputs": ["edges"],
         "columns": [{"name": "anc", "expr": "parent"}, {"name": "node", "expr": "child"}]}],
        body_output="j"),
     "on the right of a left-semi join"),
    # a body that does not read the loop derives the same rows at every level
    (lambda r: r.update(body=[
        {"id": "edges_pairs", "step": "project", "version": 1, "inputs": ["edges"],
         "columns": [{"name": "anc", "expr": "parent"}, {"name": "node", "expr": "child"}]}],
        body_output="edges_pairs"),
     "does not read the loop"),
])
def test_bodies_with_recursive_cannot_run_keep_the_dataframe_loop(change, reason):
    doc = copy.deepcopy(DESC)
    change(body(doc))
    rec, infos = loaded(doc)
    why = why_not(rec, infos)
    assert why is not None and reason in why, why
