"""``theseus prove`` on real Spark and Kafka (issue 28): the CI sample, a fixed set of
fixture pairs that covers each verdict and both runtimes, one Spark session for the file.

| pair | verdict | runtime | Spark |
|---|---|---|---|
| transparent_filter_reformatted | identical | theseus | starts correct (part 2: the new plan's) |
| ship_load_capacity_rule_changed | in_place | theseus | starts correct (part 2: the new plan's) |
| filter_changed_before_aggregate | in_place, history | spark | starts correct over the fresh keys |
| aggregate_function_added | migrate | theseus | fails: STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE |
| aggregate_function_removed | unsupported | theseus | fails: the same error class |
| join_stream_stream_source_column_added_unread | in_place | spark, theseus | starts correct |

The last pair is issue 28 item 3: one checkpoint of each kind (Spark's Kafka connector,
the gated source) for a stream-stream join, whose state rows differ between the two; the
prediction of ``check --checkpoint`` must be Spark's on both (it dry-runs the form that
wrote the checkpoint: tests/test_checkpoint_kinds.py).

The whole corpus is ``make truth`` (bench/truth.py, bench/results/truth.md).
"""

from __future__ import annotations

import pytest

from migrate import prove
from tests.conftest import FIXTURES

pytestmark = pytest.mark.integration

UP = FIXTURES / "upgrades"

CASES = [
    # (pair, runtime, verdict, outcome, error class, judged rule)
    ("transparent_filter_reformatted", "theseus", "identical", "starts_correct", None,
     "part2"),
    ("ship_load_capacity_rule_changed", "theseus", "in_place", "starts_correct", None,
     "part2"),
    # Spark's own Kafka connector: its checkpoint holds that source's offsets, and the
    # checker's prediction is read from it
    ("filter_changed_before_aggregate", "spark", "in_place", "starts_correct", None,
     "fresh_keys"),
    ("aggregate_function_added", "theseus", "migrate", "fails",
     "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE", None),
    ("aggregate_function_removed", "theseus", "unsupported", "fails",
     "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE", None),
    ("join_stream_stream_source_column_added_unread", "spark", "in_place", "starts_correct",
     None, "part2"),
    ("join_stream_stream_source_column_added_unread", "theseus", "in_place",
     "starts_correct", None, "part2"),
]


@pytest.mark.parametrize("name,runtime,verdict,outcome,error_cls,rule", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_prove_agrees_with_spark(request, spark, kafka, tmp_path, name, runtime, verdict,
                                 outcome, error_cls, rule):
    if runtime == "spark":
        request.getfixturevalue("kafka_connector")  # skips without the connector's jars
    rt = prove.RUNTIMES[runtime](kafka.bootstrap, spark=spark)
    proof = prove.prove(str(UP / name / "old.json"), str(UP / name / "new.json"), rt,
                        records=60, workdir=str(tmp_path))
    doc = proof.to_json()
    print(f"\n{name}: {prove.render_text(proof)}")
    assert (doc["runtime"], doc["verdict"], doc["outcome"], doc["error_class"]) == \
        (runtime, verdict, outcome, error_cls), doc
    # agrees: the verdict and the checker's prediction on OLD's real checkpoint
    assert doc["agrees"] and doc["prediction_agrees"] and proof.exit_code == 0, doc
    assert doc["counts"]["old_output"] > 0, doc  # OLD really wrote over part 1
    assert doc["predicted"]["written_by"] == {"spark": "kafka-connector",
                                              "theseus": "gated"}[runtime], doc
    if rule is not None:
        assert doc["judged"]["rule"] == rule
        # something was compared: a vacuous proof would pass anything
        assert doc["judged"]["compared"] > 0, doc
