"""``theseus prove`` on plans whose topics are Avro (issue 28's leftover, issue 30): the
generated input is produced in the registry's wire format, its writer schema registered,
and the outputs are judged as rows; what prove cannot run on Avro topics is refused (exit
6).  A fake runtime and a registry stand-in on loopback: no Spark, no Kafka."""

from __future__ import annotations

import json

import pytest

from compat.registry import RegistryClient
from migrate import prove as P
from tests.conftest import FIXTURES
from tests.test_avro_wire import FakeRegistry, registry  # noqa: F401 - a fixture
from tests.test_prove import FakeRuntime, FakeSparkRuntime

AV = FIXTURES / "avro"


def pair(name: str) -> tuple[str, str]:
    return str(AV / name / "old.json"), str(AV / name / "new.json")


class AvroFakeRuntime(FakeRuntime):
    """The fake runtime behind a gated source that reads the wire format: each produced
    value is kept as it was written, and each plan reads it as the gated source does,
    resolved against the plan's own reader schema (by the name of its record too)."""

    def __init__(self, url: str):
        super().__init__()
        self.raw: dict[str, list[tuple]] = {}
        self.client = RegistryClient(url)

    def produce(self, topic, records, partitions):
        for k, v in records:
            assert isinstance(v, bytes), "an Avro topic gets wire-format bytes"
            self.raw.setdefault(topic, []).append((k, v))

    def run(self, plan, checkpoint, output, name):
        from compat import avro as A
        from compat.steps.source import avro_schema
        from gates.avro import AvroDecoder

        src = next(n for n in plan.nodes.values() if n.step == "source")
        dec = AvroDecoder(src.topic, A.canonical(avro_schema(src)), self.client)
        self.topics[src.topic] = [(k, json.dumps(dec.decode(v, 0, i)))
                                  for i, (k, v) in enumerate(self.raw.get(src.topic, []))]
        return super().run(plan, checkpoint, output, name)


def test_an_avro_sources_input_is_the_wire_format_of_its_registered_schema(
        registry, monkeypatch):  # noqa: F811
    from compat import avro as A
    from compat.check import load_plan
    from compat.steps.source import avro_schema

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", registry)
    rt = AvroFakeRuntime(registry)
    proof = P.prove(*pair("output_field_added_with_default_backward"), rt, records=30)
    assert proof.counts["input_part1"] > 0 and proof.counts["old_output"] > 0
    (topic,) = rt.raw
    # registered under the run's own topic's subject, as a producer's schema would be
    (subject,) = FakeRegistry.subjects
    assert subject == f"{topic}-value" and topic.endswith("-orders")
    (sid,) = FakeRegistry.subjects[subject]
    old, new = (load_plan(p) for p in pair("output_field_added_with_default_backward"))
    source = new.nodes["orders"]
    assert json.loads(FakeRegistry.schemas[sid]) == json.loads(A.canonical(avro_schema(source)))
    assert all(v[:5] == b"\x00" + sid.to_bytes(4, "big") for _, v in rt.raw[topic])
    # the rows decoded are the generated ones: the same input a JSON topic gets
    rows = [json.loads(v) for _, v in rt.topics[topic]]
    data = P.generate(P.source_topics(old, new), *P.literals([old, new]), records=30,
                      distinct=P.distinct_columns([old, new]))
    generated = [r for chunk in data.chunks for _, _, r in chunk] + \
        [r for _, _, r in data.part2]
    assert rows == generated


def test_avro_outputs_are_judged_as_rows(registry):  # noqa: F811
    from gates.avro import AvroEncoder

    client = RegistryClient(registry)
    enc = AvroEncoder("out-value", json.dumps({"type": "record", "name": "O", "fields": [
        {"name": "id", "type": "string"}, {"name": "n", "type": ["null", "long"]}]}), client)
    outs = [P.Out(0, 0, b'{"id":"a"}', enc.encode({"id": "a", "n": 2})),
            P.Out(0, 1, b'{"id":"b"}', None), P.Out(1, 0, None, b'{"id":"c","n":1}')]
    got = P.readable(outs, client)
    assert [P.canonical(o.value) for o in got] == [{"id": "a", "n": 2}, None,
                                                   {"id": "c", "n": 1}]
    assert [o.key for o in got] == [o.key for o in outs]
    assert P.readable(outs, None) == outs


def _json_source_old(tmp_path) -> tuple[str, str]:
    """The pair with its old plan reading the source topic as JSON."""
    old, new = pair("output_field_added_with_default_backward")
    doc = json.loads(open(old).read())
    doc["nodes"][0]["format"] = "json"
    (tmp_path / "old.json").write_text(json.dumps(doc))
    return str(tmp_path / "old.json"), new


REFUSALS = [
    # (pair, runtime, a registry named, the message, what the rendering names)
    (lambda tmp: pair("output_field_added_with_default_backward"), FakeSparkRuntime, True,
     "from_avro over one fixed schema", "--runtime theseus"),
    (lambda tmp: pair("source_avro_key"), FakeRuntime, True, "Avro record keys",
     "/avro/key"),
    (_json_source_old, FakeRuntime, True, "as avro and json", "one format per source"),
    (lambda tmp: pair("output_field_added_with_default_backward"), FakeRuntime, False,
     "through a schema registry", "SCHEMA_REGISTRY_URL"),
]


@pytest.mark.parametrize("plans,runtime,named,message,names", REFUSALS,
                         ids=["runtime-spark", "avro-keys", "json-and-avro", "no-registry"])
def test_what_prove_cannot_run_on_avro_topics_is_refused_before_anything_runs(
        registry, monkeypatch, tmp_path, plans, runtime, named, message, names):  # noqa: F811
    import gates.kafkaconf

    if named:
        monkeypatch.setenv("SCHEMA_REGISTRY_URL", registry)
    else:
        monkeypatch.delenv("SCHEMA_REGISTRY_URL", raising=False)
        monkeypatch.setattr(gates.kafkaconf, "registry_settings", lambda: {})
    rt = runtime()
    with pytest.raises(P.Refused, match=message) as e:
        P.prove(*plans(tmp_path), rt, records=30)
    assert e.value.exit_code == 6 and names in e.value.render()
    assert rt.calls == []


def test_the_cli_refuses_an_avro_pair_under_runtime_spark_with_exit_6(registry, monkeypatch):  # noqa: F811,E501
    from tests.test_prove import cli

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", registry)
    r = cli(monkeypatch, FakeSparkRuntime(), *pair("output_field_added_with_default_backward"),
            "--bootstrap", "fake:9", "--runtime", "spark")
    assert r.exit_code == 6 and "from_avro" in r.output and "Traceback" not in r.output
