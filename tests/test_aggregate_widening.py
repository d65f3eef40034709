"""aggregate-arg-type-changed when a source column widens under a streaming aggregate
(issue 28, session s7): in_place only where Spark 4's aggregation buffer keeps its types
(count; sum of integral types; avg of non-decimal numbers), migrate where the buffer is the
input's own type (min, max) or its type changes (sum int -> double, decimals), and over a
table read as a changelog (Theseus' own operator keeps other state)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compat.check import check_plans, load_plan

CASE = Path(__file__).resolve().parent.parent / "fixtures" / "upgrades" / \
    "source_column_widened_under_aggregate"


def _finding(tmp: Path, function: str, old_type: str = "int", new_type: str = "bigint"):
    paths = []
    for side, t in (("old", old_type), ("new", new_type)):
        doc = json.loads((CASE / f"{side}.json").read_text(encoding="utf-8"))
        (src,) = [n for n in doc["nodes"] if n["step"] == "source"]
        (col,) = [c for c in src["schema"] if c["name"] == "quantity"]
        col["type"] = t
        (agg,) = [n for n in doc["nodes"] if n["step"] == "aggregate"]
        (call,) = [a for a in agg["aggregates"] if a["name"] == "items"]
        call["function"] = function
        path = tmp / f"{side}.json"
        path.write_text(json.dumps(doc), encoding="utf-8")
        paths.append(str(path))
    rep = check_plans(load_plan(paths[0]), load_plan(paths[1]))
    found = [f for f in rep.findings if f.code == "aggregate-arg-type-changed"]
    return rep, found


def test_source_column_widened_under_aggregate_is_in_place():
    """The pair itself: sum(quantity), int -> bigint; Spark 4.3 restarted it correctly."""
    rep = check_plans(load_plan(str(CASE / "old.json")), load_plan(str(CASE / "new.json")))
    (f,) = [f for f in rep.findings if f.code == "aggregate-arg-type-changed"]
    assert (rep.verdict, f.effect) == ("in_place", "in_place")
    assert "bigint buffer" in f.message


@pytest.mark.parametrize("function,old_type,new_type,effect", [
    # count: a bigint count whatever it counts
    ("count", "int", "bigint", "in_place"),
    # sum: every integral type into a bigint buffer
    ("sum", "int", "bigint", "in_place"),
    ("sum", "smallint", "int", "in_place"),
    # ... but a double one for fractional input: the buffer changes type
    ("sum", "int", "double", "migrate"),
    # avg: a double sum and a bigint count for any non-decimal number
    ("avg", "int", "bigint", "in_place"),
    ("avg", "int", "double", "in_place"),
    ("avg", "float", "double", "in_place"),
    # ... a decimal sum of the input's precision for decimals
    ("avg", "decimal(10,2)", "decimal(12,2)", "migrate"),
    # min and max keep the input's own type
    ("min", "int", "bigint", "migrate"),
    ("max", "int", "bigint", "migrate"),
])
def test_widening_under_each_function_class(tmp_path, function, old_type, new_type, effect):
    _, found = _finding(tmp_path, function, old_type, new_type)
    assert [f.effect for f in found] == [effect]


def test_source_column_widened_under_max_stays_migrate():
    case = CASE.parent / "source_column_widened_under_max"
    rep = check_plans(load_plan(str(case / "old.json")), load_plan(str(case / "new.json")))
    (f,) = [f for f in rep.findings if f.code == "aggregate-arg-type-changed"]
    assert (rep.verdict, f.effect) == ("migrate", "migrate")
    assert "state changes type" in f.message
