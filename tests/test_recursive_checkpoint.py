"""``theseus check --checkpoint`` on a plan with a recursive step, without Spark: the loop
state beside the output query's checkpoint (compat.recursive_state) and what a restart of a
changed plan would do with it (compat.checkpoint_check._loops).

``fixtures/checkpoints/recursive_reach`` is a real checkpoint written by `theseus run` of
``fixtures/history/recursive_closure_cycle/v1`` (reachability over links with a cycle, one
batch of four links); its topic names were set back to the plan's ('links') and Spark's .crc
files left out."""

from __future__ import annotations

import json

import jsonschema
import pytest

from compat.check import load_plan
from compat.checkpoint import read_checkpoint
from compat.checkpoint_check import _loops, checkpoint_report, predict
from compat.recursive_state import step_of_topic
from compat.report import checkpoint_lines
from compat.schema_check import load_schema
from tests.conftest import FIXTURES

CK = FIXTURES / "checkpoints" / "recursive_reach"
PLAN = CK / "plan.json"


def variant(tmp_path, change) -> object:
    doc = json.loads(PLAN.read_text())
    change({n["id"]: n for n in doc["nodes"]}, doc)
    p = tmp_path / "new.json"
    p.write_text(json.dumps(doc))
    return load_plan(str(p))


def test_the_loop_state_is_read_from_the_parquet_footers():
    ck = read_checkpoint(CK)
    lp = ck.loops["reach_1"]
    assert (lp.derived.batches, lp.derived.rows) == (1, 12)  # 4 links on a 3-cycle + 1
    assert lp.inputs[1].rows == 4 and set(lp.inputs) == {1}
    assert lp.topic == "theseus.recursive.reachability.reach_1.cd9574c8"
    doc = ck.to_json()["recursion"][0]
    assert doc["derived"]["columns"] == "struct<src:string,dst:string>"
    assert step_of_topic(lp.topic) == "reach_1" and step_of_topic("links") is None


def test_the_same_plan_restarts_and_the_report_shows_the_loop(tmp_path):
    ck = read_checkpoint(CK)
    plan = load_plan(str(PLAN))
    assert _loops(ck, plan) == []
    # the dry run of the output query has no stateful operator: the checkpoint's own
    # operator list stands in for it
    rep = checkpoint_report(ck, plan, ck)
    assert rep.checkpoint["restart"]["outcome"] == "starts"
    assert any("body, union and limits of recursive step(s) reach_1" in f.message
               for f in rep.findings if f.code == "checkpoint-not-verified")
    schema = load_schema("report.v1.json")
    jsonschema.validate(rep.checkpoint, schema["properties"]["checkpoint"] |
                        {"$defs": schema["$defs"]})
    text = "\n".join(checkpoint_lines(rep.checkpoint))
    assert "recursive step reach_1: 12 rows derived in 1 batches" in text


def _retype_links_2(nodes, doc):
    nodes["links_2"]["schema"][0]["type"] = "bigint"


def _rename_step(nodes, doc):
    nodes["reach_1"]["id"] = "reach_2"
    nodes["reachable"]["inputs"] = ["reach_2"]


def _other_topic(nodes, doc):
    nodes["links_2"]["topic"] = "links_v2"


def _retype_all(nodes, doc):
    for s in ("links", "links_2"):
        nodes[s]["schema"][1]["type"] = "bigint"


@pytest.mark.parametrize("change, codes, words", [
    (_retype_links_2, {"checkpoint-recursive-state-changed"},
     "kept input 1 as (src string, dst string)"),
    (_rename_step, {"checkpoint-recursive-state-missing", "checkpoint-recursive-state-orphaned"},
     "'reach_1' (12 rows derived)"),
    (_other_topic, {"checkpoint-recursive-inputs-changed"}, "Spark refuses to restart the loop"),
    (_retype_all, {"checkpoint-recursive-state-changed"}, "holds rows (src string, dst string)"),
])
def test_a_changed_loop_is_migrate_with_the_reason(tmp_path, change, codes, words):
    ck = read_checkpoint(CK)
    found = _loops(ck, variant(tmp_path, change))
    assert {f.code for f in found} == codes, [f.message for f in found]
    assert all(f.effect == "migrate" for f in found)
    assert any(words in f.message for f in found), [f.message for f in found]
    assert predict(found).outcome in ("fails", "wrong_state")
