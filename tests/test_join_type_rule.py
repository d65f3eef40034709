"""The plan check's rule for a join type change (issue 28, session s7): a stream-stream
join's change among inner, left, right and full outer is ``in_place`` with history on
the condition of join state format 2, as Spark 4's StreamingSymmetricHashJoinExec keeps
that state; a change to or from left semi, and a table-table join's change, stay
``migrate``; a stream-table join keeps no state and stays ``in_place``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compat.check import check_plans, load_plan

UP = Path(__file__).resolve().parent.parent / "fixtures" / "upgrades"


def _type_finding(case: str, old_type: str | None = None, new_type: str | None = None,
                  tmp: Path | None = None):
    paths = []
    for side, kind in (("old", old_type), ("new", new_type)):
        doc = json.loads((UP / case / f"{side}.json").read_text(encoding="utf-8"))
        if kind is not None:
            (join,) = [n for n in doc["nodes"] if n["step"] == "join"]
            join["type"] = kind
        assert tmp is not None or kind is None
        path = UP / case / f"{side}.json" if kind is None else tmp / f"{side}.json"
        if kind is not None:
            path.write_text(json.dumps(doc), encoding="utf-8")
        paths.append(str(path))
    rep = check_plans(load_plan(paths[0]), load_plan(paths[1]))
    (f,) = [f for f in rep.findings if f.code == "join-type-changed"]
    return rep, f


def test_join_stream_stream_type_changed_is_in_place_with_history():
    """inner -> left outer: Spark 4.3 restarted it correctly under both runtimes (truth.md)."""
    rep, f = _type_finding("join_stream_stream_type_changed")
    assert (rep.verdict, f.effect, f.severity, f.history) == \
        ("in_place", "in_place", "warning", True)
    assert "join state is format 2" in f.message and "matched flag" in f.message
    assert "evicted before the restart stay joined the old way" in f.message


@pytest.mark.parametrize("old_type,new_type,effect", [
    ("inner", "left", "in_place"),
    ("inner", "right", "in_place"),
    ("inner", "full", "in_place"),
    ("left", "full", "in_place"),
    ("full", "inner", "in_place"),
    ("right", "left", "in_place"),
    # left semi stores no left row that matched and skips matched right rows
    ("inner", "left_semi", "migrate"),
    ("left_semi", "inner", "migrate"),
])
def test_stream_stream_join_type_changes(tmp_path, old_type, new_type, effect):
    _, f = _type_finding("join_stream_stream_type_changed", old_type, new_type, tmp_path)
    assert f.effect == effect
    assert f.history == (effect == "in_place")


def test_table_table_join_type_change_stays_migrate():
    """Theseus' own changelog join keeps other state than Spark's stream-stream join."""
    rep, f = _type_finding("table_table_join_type_changed")
    assert (rep.verdict, f.effect) == ("migrate", "migrate")
    assert "matched flag" not in f.message


def test_stream_table_join_type_change_keeps_no_state():
    rep, f = _type_finding("join_stream_table_type_changed")
    assert (rep.verdict, f.effect, f.history) == ("in_place", "in_place", False)
