"""``theseus prove`` on a pair whose source and output are Avro topics, on real Spark, Kafka
and the registry: the generated input is produced in the registry's wire format (the
source's schema registered as the writer schema), both plans run on it under
``--runtime theseus``, and Spark's restart agrees with the verdict."""

from __future__ import annotations

import json

import pytest

from migrate import prove
from tests.conftest import FIXTURES
from tests.integration.test_avro_registry import schema_registry  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration


class Recording(prove.SparkRuntime):
    """The theseus runtime, keeping what it produced."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.produced: dict[str, list] = {}

    def produce_all(self, batches) -> None:
        for topic, records, _ in batches:
            self.produced.setdefault(topic, []).extend(v for _, v in records)
        super().produce_all(batches)


def test_prove_runs_an_avro_pair_on_wire_format_input(spark, kafka, schema_registry,  # noqa: F811,E501
                                                      tmp_path, monkeypatch):
    from compat.registry import RegistryClient

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", schema_registry)
    pair = FIXTURES / "avro" / "output_field_added_with_default_backward"
    rt = Recording(kafka.bootstrap, spark=spark)
    proof = prove.prove(str(pair / "old.json"), str(pair / "new.json"), rt, records=60,
                        workdir=str(tmp_path))
    doc = proof.to_json()
    print(f"\navro pair: {prove.render_text(proof)}")
    assert (doc["verdict"], doc["outcome"], doc["error_class"]) == \
        ("in_place", "starts_correct", None), doc
    assert doc["agrees"] and doc["prediction_agrees"] and proof.exit_code == 0, doc
    assert doc["counts"]["old_output"] > 0 and doc["judged"]["compared"] > 0, doc
    # the input was the wire format, each record naming the schema registered for it
    client = RegistryClient(schema_registry)
    values = [v for vs in rt.produced.values() for v in vs]
    assert len(values) == 60 and all(v[:1] == b"\x00" for v in values)
    ids = {int.from_bytes(v[1:5], "big") for v in values}
    assert len(ids) == 1
    fields = json.loads(client.schema(ids.pop()))["fields"]
    assert [f["name"] for f in fields] == ["order_id", "amount", "qty"]
