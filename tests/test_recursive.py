"""The ``recursive`` step's versions: version 1 documents keep loading with their meaning;
version 2's fields, further inputs and monotone body; what the CLI says about bad ones."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compat.errors import PlanError
from compat.infer import analyze
from compat.serde import from_doc, to_doc
from compat.steps import Recursive
from compat.steps.recursive import body_paths
from migrate.cli import main

ROOT = Path(__file__).resolve().parents[1]
V1 = json.loads((ROOT / "fixtures/upgrades/recursive_body_changed/old.json").read_text())
V2 = json.loads((ROOT / "fixtures/qtt/recursive_descendants/plan.json").read_text())


def rec_doc(doc: dict) -> dict:
    return next(n for n in doc["nodes"] if n["step"] == "recursive")


def load(doc: dict):
    plan = from_doc(copy.deepcopy(doc), "plan.json")
    analyze(plan)
    return plan


def test_a_version_1_document_keeps_its_meaning_and_its_bytes():
    plan = load(V1)
    rec = plan.nodes["route"]
    assert isinstance(rec, Recursive)
    assert (rec.version, rec.union, rec.max_iterations, rec.on_limit) == (1, "set", 100,
                                                                           "error")
    assert rec.feedback is not None and rec.feedback.partitions == 2
    assert to_doc(plan)["nodes"][1] == V1["nodes"][1]  # no version 2 key is written


def test_version_2_reads_further_inputs_and_writes_only_what_differs_from_defaults():
    doc = copy.deepcopy(V2)
    rec_doc(doc).update(union="bag", max_iterations=7, on_limit="return")
    plan = load(doc)
    rec = plan.nodes["closure"]
    assert rec.further_inputs == ("edges",)
    written = next(n for n in to_doc(plan)["nodes"] if n["id"] == "closure")
    assert (written["union"], written["max_iterations"], written["on_limit"]) == \
        ("bag", 7, "return")
    assert "union" not in next(n for n in to_doc(load(V2))["nodes"] if n["id"] == "closure")


def _bad(doc_fn, base=V2):
    doc = copy.deepcopy(base)
    doc_fn(doc)
    with pytest.raises(PlanError) as e:
        load(doc)
    return e.value


def test_version_1_refuses_version_2_fields_and_further_inputs():
    e = _bad(lambda d: rec_doc(d).update(on_limit="return"), V1)
    assert e.pointer == "/nodes/1/on_limit" and "version 2" in str(e)
    e = _bad(lambda d: rec_doc(d).pop("feedback"), V1)
    assert e.pointer == "/nodes/1/feedback"


def test_version_2_refuses_a_feedback_topic():
    e = _bad(lambda d: rec_doc(d).update(feedback={"partitions": 2}))
    assert e.pointer == "/nodes/2/feedback" and "no feedback topic" in str(e)


@pytest.mark.parametrize("change,pointer,words", [
    (lambda r: r["body"][0].update(type="left"), "/nodes/2/body/0/type", "a left join"),
    (lambda r: r["body"].__setitem__(1, {
        "id": "up", "step": "aggregate", "version": 1, "inputs": ["j"],
        "group_by": [{"name": "anc", "expr": "parent"}],
        "aggregates": [{"name": "node", "function": "max", "args": ["node"]}]}),
     "/nodes/2/body/1/step", "aggregates sit after the recursion"),
    (lambda r: r["body"][1].update(id="edges"), "/nodes/2/body/1/id",
     "id of an input of its recursive step"),
    (lambda r: r.update(body_input="edges"), "/nodes/2/body_input",
     "further input"),
])
def test_version_2_refuses_bodies_it_cannot_run(change, pointer, words):
    e = _bad(lambda d: change(rec_doc(d)))
    assert e.pointer == pointer, str(e)
    assert words in str(e)


def _semi(r: dict, union: str) -> None:
    """The descendants body with its join made a left-semi join (keeps r's columns)."""
    r["union"] = union
    r["body"][0]["type"] = "left_semi"
    r["body"][1]["columns"] = [{"name": "anc", "expr": "anc"}, {"name": "node", "expr": "node"}]


def test_a_bag_recursion_refuses_a_left_semi_join_reading_new_rows_on_its_right():
    """Semi-naive evaluation feeds a stream's new rows apart from its old ones: a left row
    matched by an old and by a new edge would come out twice under UNION ALL."""
    e = _bad(lambda d: _semi(rec_doc(d), "bag"))
    assert e.pointer == "/nodes/2/body/0/inputs/1", str(e)
    assert "the stream 'edges'" in str(e) and "a table on the right" in str(e)
    load(_doc(lambda d: _semi(rec_doc(d), "set")))  # set semantics keep a row once anyway
    table = _doc(lambda d: _semi(rec_doc(d), "bag"))
    edges = next(n for n in table["nodes"] if n["id"] == "edges")
    edges.update(role="table", key_columns=["child"])
    base = next(n for n in table["nodes"] if n["id"] == "base")
    table["nodes"].append({**edges, "id": "edge_stream", "topic": "edge_stream",
                           "role": "stream"})
    del table["nodes"][-1]["key_columns"]
    base["inputs"] = ["edge_stream"]
    load(table)  # a table is read whole at each batch: no new rows on the right


def _doc(change) -> dict:
    doc = copy.deepcopy(V2)
    change(doc)
    return doc


def test_the_cli_reports_a_bad_recursive_step_in_one_line_with_exit_2(tmp_path):
    doc = copy.deepcopy(V2)
    rec_doc(doc)["body"][0]["type"] = "left_anti"
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["check", str(p), str(p)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "bad.json" in result.output and "/nodes/2/body/0/type" in result.output


def test_body_paths_say_whether_semi_naive_may_feed_new_rows_only():
    rec = load(V2).nodes["closure"]
    assert body_paths(rec) == {"r": 1, "edges": 1}
    doc = copy.deepcopy(V2)
    r = rec_doc(doc)
    # the loop read twice (r joined with itself through the edges): not linear in r
    r["body"] = [
        {"id": "j", "step": "join", "version": 1, "inputs": ["r", "edges"], "type": "inner",
         "left_keys": ["anc"], "right_keys": ["child"]},
        {"id": "up", "step": "project", "version": 1, "inputs": ["j"],
         "columns": [{"name": "anc", "expr": "parent"}, {"name": "node", "expr": "node"}]},
        {"id": "both", "step": "union", "version": 1, "inputs": ["up", "r"]}]
    r["body_output"] = "both"
    assert body_paths(load(doc).nodes["closure"]) == {"r": 2, "edges": 1}
    # under UNION ALL the same body cannot run (semi-naive would count a row by the order
    # of evaluation): refused when the plan is loaded, not when it is deployed
    r["union"] = "bag"
    e = _bad(lambda d: d.update(copy.deepcopy(doc)))
    assert e.pointer.endswith("/union"), str(e)
    assert "r (2 paths)" in str(e) and "union 'set'" in str(e)


def test_check_does_not_import_spark_for_a_recursive_plan(tmp_path):
    """theseus check stays a light CI gate for recursive plans too."""
    import subprocess
    import sys

    p = ROOT / "fixtures/qtt/recursive_closure_cycle/plan.json"
    code = ("import sys; from click.testing import CliRunner; from migrate.cli import main; "
            f"r = CliRunner().invoke(main, ['check', {str(p)!r}, {str(p)!r}]); "
            "assert r.exit_code == 0, r.output; "
            "bad = [m for m in ('pyspark', 'confluent_kafka', 'networkx', 'deepdiff') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


# -- SQL: WITH RECURSIVE ----------------------------------------------------------------------

EDGES = """CREATE TABLE edges (child STRING, parent STRING)
  USING kafka OPTIONS (topic 'edges', partitions 2, format 'json', role 'stream');
CREATE TABLE counts USING kafka OPTIONS (topic 'counts', key 'node') AS
"""
DESCENDANTS_SQL = EDGES + """WITH RECURSIVE closure(anc, node) AS (
  SELECT parent, child FROM edges
  UNION
  SELECT {hint} e.parent, c.node FROM closure c JOIN edges e ON c.anc = e.child
)
SELECT anc AS node, count(node) AS descendants FROM closure GROUP BY anc;
"""


def _compiled(sql: str):
    from compat.sql import compile_sql

    doc = compile_sql(sql, "q.sql")
    plan = load(doc)
    (rec,) = [n for n in plan.nodes.values() if isinstance(n, Recursive)]
    return plan, rec


def test_with_recursive_compiles_to_a_recursive_step_reading_the_edges():
    plan, rec = _compiled(DESCENDANTS_SQL.format(hint=""))
    assert (rec.version, rec.union, rec.max_iterations, rec.on_limit) == (2, "set", 100,
                                                                          "error")
    assert [plan.nodes[i].step for i in rec.inputs] == ["project", "source"]
    assert plan.info[rec.id].names == ("anc", "node")
    assert plan.nodes[rec.further_inputs[0]].topic == "edges"
    join = next(b for b in rec.body if b.step == "join")
    assert join.inputs == (rec.body_input, rec.further_inputs[0])
    assert body_paths(rec) == {rec.body_input: 1, rec.further_inputs[0]: 1}


def test_the_compiled_closure_has_the_hand_written_body():
    """The compiled plan and fixtures/qtt/recursive_descendants compute the same body: the
    checker pairs their recursive steps without a finding on it."""
    from compat.check import check_plans

    plan, _ = _compiled(DESCENDANTS_SQL.format(hint=""))
    report = check_plans(load(V2), plan)
    assert "recursive-body-changed" not in {f.code for f in report.findings}, \
        [f.message for f in report.findings]


def test_union_all_is_bag_semantics_and_hints_set_the_limit():
    sql = DESCENDANTS_SQL.format(hint="/*+ MAX_ITERATIONS(7), ON_LIMIT('return') */")
    _, rec = _compiled(sql.replace("  UNION\n", "  UNION ALL\n"))
    assert (rec.union, rec.max_iterations, rec.on_limit) == ("bag", 7, "return")


@pytest.mark.parametrize("sql,words", [
    (EDGES + """WITH RECURSIVE a(x, y) AS (SELECT parent, child FROM edges UNION
                SELECT b.x, b.y FROM b),
              b(x, y) AS (SELECT parent, child FROM edges UNION SELECT a.x, a.y FROM a)
       SELECT x AS node, count(y) AS n FROM a GROUP BY x;""",
     "mutual recursion is not supported: 'a' reads 'b'"),
    (DESCENDANTS_SQL.format(hint="/*+ MAX_ITERATIONS(0) */"), "MAX_ITERATIONS takes one"),
    (DESCENDANTS_SQL.format(hint="/*+ ON_LIMIT('stop') */"), "ON_LIMIT takes 'error'"),
    (EDGES + """WITH RECURSIVE c AS (SELECT parent AS a, child AS n FROM edges)
       SELECT a AS node, count(n) AS k FROM c GROUP BY a;""", None),
    (EDGES + """WITH RECURSIVE c(a, n) AS (SELECT c.a, c.n FROM c UNION
                SELECT parent, child FROM edges)
       SELECT a AS node, count(n) AS k FROM c GROUP BY a;""", "must not read 'c'"),
])
def test_with_recursive_errors_point_at_the_sql(sql, words):
    from compat.errors import SqlError
    from compat.sql import compile_sql

    if words is None:  # a WITH RECURSIVE whose CTEs do not recurse is a plain WITH
        assert not any(n["step"] == "recursive" for n in compile_sql(sql, "q.sql")["nodes"])
        return
    with pytest.raises(SqlError) as e:
        compile_sql(sql, "q.sql")
    assert words in str(e.value) and "q.sql:" in str(e.value), str(e.value)


@pytest.mark.parametrize("member,step,column", [
    ("SELECT DISTINCT e.parent, c.node FROM closure c JOIN edges e ON c.anc = e.child",
     "deduplicate", 19),  # DISTINCT: at the SELECT list it applies to
    ("SELECT e.parent, max(c.node) FROM closure c JOIN edges e ON c.anc = e.child "
     "GROUP BY e.parent", "aggregate", None),
])
def test_a_body_step_the_loop_cannot_run_is_reported_at_the_members_line(member, step,
                                                                        column):
    """The refusal of a body step points at the recursive member that wrote it (line 7),
    not at the CREATE TABLE line of the query (line 3), and names the recursive step."""
    from compat.errors import SqlError
    from compat.sql import compile_sql

    sql = EDGES + f"""WITH RECURSIVE closure(anc, node) AS (
  SELECT parent, child FROM edges
  UNION
  {member}
)
SELECT anc AS node, count(node) AS descendants FROM closure GROUP BY anc;
"""
    with pytest.raises(SqlError) as e:
        compile_sql(sql, "q.sql")
    msg = str(e.value)
    assert f"{step} '" in msg and "in the body of recursive 'closure_1'" in msg, msg
    assert f"an {step} step cannot be" in msg or f"a {step} step cannot be" in msg, msg
    where = msg.split(": ", 1)[0]
    assert where.startswith("q.sql:7:"), msg
    if column is not None:
        assert where == f"q.sql:7:{column}", msg


def test_a_live_migration_of_an_unrecorded_loop_is_refused_before_anything_starts(tmp_path,
                                                                                 monkeypatch):
    """A changed body (migrate) goes through a shadow, whose cut passes through the old
    query's loop (its gate and internal topic, recorded by its host): an old query whose
    status does not record them is refused at step 1 with the reason, nothing spawned
    (tests/test_migration_recursion.py has the steps)."""
    from compat.check import load_plan
    from compat.errors import Refused
    from compat.serde import dumps
    from migrate import migration
    from migrate.phases import check as check_phase
    from migrate.store import DirectoryStore

    case = ROOT / "fixtures/upgrades/recursive_v2_body_changed"
    store = DirectoryStore(tmp_path)
    store.put_plan("descendants", dumps(load_plan(str(case / "old.json"))))
    store.set_status("descendants", status="running", pid=0, generation=0)
    # the preflight asks the broker for the source topics (every one there, here)
    monkeypatch.setattr(check_phase, "preflight", lambda *a: {})
    with pytest.raises(Refused) as e:
        migration.start(store, "descendants", str(case / "new.json"), bootstrap="127.0.0.1:1",
                        echo=lambda line: None, timeout=30)
    assert "does not record its loop query's gate: restart it with theseus run" in \
        str(e.value)
    assert not store.query_dir("descendants.g1").exists()
    assert migration.current(store, "descendants").phase == "refused"
