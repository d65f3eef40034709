"""``theseus prove`` on real Spark and Kafka (issue 28): three fixture pairs, one Spark
session for the file.

| pair | verdict | Spark |
|---|---|---|
| ship_load_capacity_rule_changed | in_place | starts correct (over part 2: the new plan's) |
| aggregate_function_added | migrate | fails: STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE |
| filter_changed_before_aggregate | in_place, history | starts correct over the fresh keys |
"""

from __future__ import annotations

import pytest

from migrate import prove
from tests.conftest import FIXTURES

pytestmark = pytest.mark.integration

UP = FIXTURES / "upgrades"

CASES = [
    # (pair, verdict, outcome, error class, judged rule)
    ("ship_load_capacity_rule_changed", "in_place", "starts_correct", None, "part2"),
    ("aggregate_function_added", "migrate", "fails",
     "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE", None),
    ("filter_changed_before_aggregate", "in_place", "starts_correct", None, "fresh_keys"),
]


@pytest.mark.parametrize("name,verdict,outcome,error_cls,rule", CASES,
                         ids=[c[0] for c in CASES])
def test_prove_agrees_with_spark(spark, kafka, tmp_path, name, verdict, outcome, error_cls,
                                 rule):
    rt = prove.SparkRuntime(kafka.bootstrap, spark=spark)
    proof = prove.prove(str(UP / name / "old.json"), str(UP / name / "new.json"), rt,
                        records=60, workdir=str(tmp_path))
    doc = proof.to_json()
    print(f"\n{name}: {prove.render_text(proof)}")
    assert (doc["verdict"], doc["outcome"], doc["error_class"]) == \
        (verdict, outcome, error_cls), doc
    assert doc["agrees"] and proof.exit_code == 0, doc
    assert doc["counts"]["old_output"] > 0, doc  # OLD really wrote over part 1
    if rule is not None:
        assert doc["judged"]["rule"] == rule
        # something was compared: a vacuous proof would pass anything
        assert doc["judged"]["compared"] > 0, doc
