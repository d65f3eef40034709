"""`theseus check --checkpoint` of a recursive plan with real Spark: the dry run is of the
output query the checkpoint belongs to (its recursive step a source of the loop's internal
topic, named as the checkpoint names it), and the loop state decides the rest.

The checkpoint is ``fixtures/checkpoints/recursive_reach``
(see tests/test_recursive_checkpoint.py)."""

from __future__ import annotations

import json

import pytest

from migrate.ckcheck import check_checkpoint
from tests.conftest import FIXTURES

pytestmark = pytest.mark.integration

CK = FIXTURES / "checkpoints" / "recursive_reach"


def test_a_recursive_plan_is_checked_against_its_checkpoint(spark, tmp_path):
    same = check_checkpoint(str(CK), str(CK / "plan.json"), spark=spark)
    assert same.verdict == "in_place", [f.message for f in same.findings]
    assert same.checkpoint["restart"]["outcome"] == "starts"
    assert not [f for f in same.findings if f.code.startswith("checkpoint-source")]
    assert same.checkpoint["recursion"][0]["derived"]["rows"] == 12
    doc = json.loads((CK / "plan.json").read_text())
    for n in doc["nodes"]:
        if n["id"] == "links_2":
            n["topic"] = "links_v2"  # the body joins another topic's links
    p = tmp_path / "new.json"
    p.write_text(json.dumps(doc))
    other = check_checkpoint(str(CK), str(p), spark=spark)
    assert other.verdict == "migrate"
    assert "checkpoint-recursive-inputs-changed" in {f.code for f in other.findings}
    assert other.checkpoint["restart"]["outcome"] == "fails"
