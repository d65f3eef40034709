"""Rules changed by what ``make truth`` found on Spark (issue 28 item 2 and 3): each test
names the pair and what Spark did."""

from __future__ import annotations

import json

from compat.check import check_plans, load_plan
from compat.rules.config import stream_sources
from tests.conftest import FIXTURES

UP = FIXTURES / "upgrades"


def test_union_inputs_reordered_is_migrate_as_spark_fails_the_restart():
    """upgrades/union_inputs_reordered was ``identical``; under runtime spark the restart
    failed with STREAM_FAILED ("Some data may have been lost because they are not
    available in Kafka any more": source 0 got the other topic's offsets)."""
    old, new = (load_plan(str(UP / "union_inputs_reordered" / f)) for f in
                ("old.json", "new.json"))
    assert (stream_sources(old), stream_sources(new)) == \
        (["orders_eu", "orders_us"], ["orders_us", "orders_eu"])
    rep = check_plans(old, new)
    assert rep.verdict == "migrate"
    assert [f.code for f in rep.findings] == ["sources-reordered"]
    assert "by position" in rep.findings[0].message


def test_the_same_sources_in_the_same_order_say_nothing(tmp_path):
    old = load_plan(str(UP / "union_inputs_reordered" / "old.json"))
    assert check_plans(old, old).verdict == "identical"
    # a source read twice (a self-union) is one source to Spark
    doc = json.loads((UP / "union_inputs_reordered" / "old.json").read_text())
    union = next(n for n in doc["nodes"] if n["step"] == "union")
    union["inputs"] = [union["inputs"][0], union["inputs"][0]]
    (tmp_path / "self.json").write_text(json.dumps(doc))
    twice = load_plan(str(tmp_path / "self.json"))
    assert len(stream_sources(twice)) == 1


def test_an_aggregate_newly_read_above_changes_the_state():
    """pyspark/upgrades/column_added was ``in_place`` (an output column added); Spark
    refused the restart of the job file with STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE: the
    old job computed count(*) but read only the sum, and Spark's optimizer dropped the
    count from the aggregate's state."""
    from compat.steps.aggregate import kept_aggregates

    d = FIXTURES / "pyspark" / "upgrades" / "column_added"
    old, new = load_plan(str(d / "old.json")), load_plan(str(d / "new.json"))
    agg = "per_customer"
    assert kept_aggregates(old.nodes[agg], old) == (0,)
    assert kept_aggregates(new.nodes[agg], new) == (0, 1)
    rep = check_plans(old, new)
    assert rep.verdict == "migrate"
    f = next(f for f in rep.findings if f.code == "aggregate-state-columns-changed")
    assert "orders now read" in f.message and "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE" \
        in f.message
    # the other way round: an aggregate no longer read leaves the state too
    back = check_plans(new, old)
    assert "aggregate-state-columns-changed" in {f.code for f in back.findings}
    # and reading the same aggregates keeps it
    assert "aggregate-state-columns-changed" not in {f.code for f in
                                                     check_plans(old, old).findings}


def test_a_source_without_offsets_fails_as_the_source_that_wrote_the_checkpoint():
    """union_inputs_reordered's restart: the gated source fails inside Spark's Python data
    source (PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR, runtime theseus); Spark's Kafka
    connector with no error class ('Some data may have been lost', runtime spark)."""
    from compat.checkpoint_check import predict
    from compat.findings import finding

    fs = [finding("checkpoint-source-topic-changed", "source 0 read 'a'", new_pointer="/n")]
    assert predict(fs, "gated").error_class == "PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR"
    assert predict(fs).error_class == "PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR"
    said = predict(fs, "kafka-connector").error_class
    assert said.startswith("(") and "Some data may have been lost" in said
